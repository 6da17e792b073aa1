"""netsleuth's own netlink sockets, handed from one run to the next (bpf/own_sockets.bpf.h marks them).

A closed netlink socket is freed after an RCU grace period, and with lazy RCU (CONFIG_RCU_LAZY, the default
on many distributions since 6.x) that can be up to ten seconds later: the unread replies of the firewall
reads of one run are purged while the next run (the next `diagnose`, the agent's next session) watches, in
a process that never marked them. So each run leaves the cookies of the sockets it marked under /run (a tmpfs:
gone with the boot, like the cookies, which the kernel never hands out twice in one boot), and each run
starts by marking what runs of the last minute left. A cookie names one socket, so nothing of the host's
can be taken for netsleuth's this way.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["OWN_SOCKETS_DIR", "recent_own_sockets", "remember_own_sockets"]

OWN_SOCKETS_DIR = Path("/run/netsleuth/own-sockets")
_KEPT_S = 60.0  # far past the lazy-RCU flush (10 s): a file older than this names only freed sockets


def remember_own_sockets(cookies: Iterable[int], directory: Path = OWN_SOCKETS_DIR) -> None:
    """Leave this run's marked sockets for the runs after it (one file per run, written whole)."""
    lines = "".join(f"{cookie}\n" for cookie in cookies)
    if not lines:
        return
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = directory / f".{os.getpid()}-{time.monotonic_ns()}"
        partial.write_text(lines)
        partial.rename(directory / partial.name[1:])
    except OSError:
        return  # a read-only /run: the next run may then count some of ours, as without this file


def recent_own_sockets(
    directory: Path = OWN_SOCKETS_DIR, now: float | None = None, limit: int | None = None
) -> list[int]:
    """The sockets runs of the last minute marked, the newest runs' first, at most `limit`; older files are
    removed. By the run's time, not by cookie: the kernel hands cookies out in per-CPU batches
    (include/linux/cookie.h), so a socket opened now on one CPU can have a smaller cookie than one opened a
    minute ago on another, and keeping the largest cookies could leave out the last run's."""
    now = time.time() if now is None else now
    runs: list[tuple[float, list[int]]] = []
    try:
        files = list(directory.iterdir())
    except OSError:
        return []
    for path in files:
        with contextlib.suppress(OSError, ValueError):
            written = path.stat().st_mtime
            if now - written > _KEPT_S:
                path.unlink()
                continue
            runs.append((written, [int(line) for line in path.read_text().split()]))
    cookies: dict[int, None] = {}  # ordered, without repeats
    for _, marked in sorted(runs, key=lambda run: -run[0]):
        cookies.update(dict.fromkeys(marked))
    found = list(cookies)
    return found if limit is None else found[:limit]
