"""Test hosts: network namespaces joined by veth pairs, addressed from 198.18.0.0/15 and 2001:db8::/32.

Every name carries this process's pid so parallel or crashed runs never collide, and `Lab.close()` removes
everything the lab made (namespaces take their veths and rules with them), also when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

__all__ = ["Host", "Lab", "lab", "run", "wait_for"]


def run(*argv: str, check: bool = True, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, raising with its stderr when it fails (so a broken fixture says why)."""
    result = subprocess.run(argv, capture_output=True, text=True, input=input_text, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `condition` until true; tests never sleep a fixed time."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@dataclass
class Host:
    """One network namespace."""

    name: str

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.name}"

    @property
    def inode(self) -> int:
        return os.stat(self.netns_path).st_ino

    def argv(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def run(
        self, *argv: str, check: bool = True, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run(*self.argv(*argv), check=check, input_text=input_text)

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(*argv), **kwargs)  # type: ignore[call-overload, no-any-return]


@dataclass
class Lab:
    """A set of namespaces; `link` joins two of them with a veth pair."""

    prefix: str = field(default_factory=lambda: f"nst{os.getpid()}")
    hosts: list[Host] = field(default_factory=list)

    def host(self, short: str) -> Host:
        host = Host(f"{self.prefix}{short}")
        run("ip", "netns", "add", host.name)
        self.hosts.append(host)
        host.run("ip", "link", "set", "lo", "up")
        return host

    def link(
        self,
        left: Host,
        right: Host,
        left_addrs: Sequence[str],
        right_addrs: Sequence[str],
        names: tuple[str, str] = ("veth0", "veth0"),
        mtu: int | None = None,
        queues: int | None = None,
    ) -> None:
        """A veth pair between two hosts, each end named and addressed (CIDR strings, v4 or v6); `queues`:
        that many receive and transmit queues on each end (each receive queue its own NAPI instance)."""
        tmp_left, tmp_right = f"{self.prefix}a{len(self.hosts)}", f"{self.prefix}b{len(self.hosts)}"
        sizes = ["numtxqueues", str(queues), "numrxqueues", str(queues)] if queues else []
        run(
            "ip", "link", "add", tmp_left[:15], *sizes, "type", "veth", "peer", "name", tmp_right[:15], *sizes
        )
        for tmp, host, name, addrs in (
            (tmp_left, left, names[0], left_addrs),
            (tmp_right, right, names[1], right_addrs),
        ):
            run("ip", "link", "set", tmp[:15], "netns", host.name)
            host.run("ip", "link", "set", tmp[:15], "name", name)
            if mtu:
                host.run("ip", "link", "set", name, "mtu", str(mtu))
            for addr in addrs:
                extra = ["nodad"] if ":" in addr else []
                host.run("ip", "addr", "add", addr, "dev", name, *extra)
            host.run("ip", "link", "set", name, "up")

    def close(self) -> None:
        for host in reversed(self.hosts):
            with contextlib.suppress(Exception):
                # Kill what still runs inside, so the namespace really goes away.
                pids = run("ip", "netns", "pids", host.name, check=False).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), 9)
            run("ip", "netns", "del", host.name, check=False)
        self.hosts.clear()


@contextlib.contextmanager
def lab() -> Iterator[Lab]:
    the_lab = Lab()
    try:
        yield the_lab
    finally:
        the_lab.close()
