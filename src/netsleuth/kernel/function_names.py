"""Kernel function names for drop locations, without holding the whole symbol table in a long-running agent.

A loaded `Kallsyms` holds every text symbol (~120k on a distribution kernel: ~40 MB of Python objects and
half a second to parse), while the exporter only ever names the few dozen places that drop packets. So
names are cached forever, and a scrape that meets new addresses has them resolved in one batch by a short
child process (`python -m netsleuth.kernel.function_names ADDRESS...`, the same `Kallsyms` class): the
agent's RSS never carries the table, not even as a high-water mark.

Sessions do need the whole table (every event's location, stacks, the firewall hook): `SharedKallsyms`
gives the sessions running at one time a single copy and lets it go after the last.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable

from netsleuth.kernel.kallsyms import Kallsyms

__all__ = [
    "FunctionNames",
    "SharedKallsyms",
    "limit_malloc_arenas",
    "release_freed_memory",
    "resolve_in_child",
]

_LOG = logging.getLogger("netsleuth.agent")
_CHILD_TIMEOUT_S = 60.0


_M_ARENA_MAX = -8  # mallopt(3)


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread that allocates its own heap arena (up to 8 per core) and keeps them mapped:
    a threaded HTTP server's RSS then creeps up with every burst of requests. Two arenas are plenty for
    this service (mallopt(3) M_ARENA_MAX; a no-op off glibc)."""
    name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    if mallopt is not None:
        mallopt(_M_ARENA_MAX, arenas)


def release_freed_memory() -> None:
    """malloc_trim(3): return free heap pages to the kernel (glibc only; a no-op elsewhere)."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _names_from(table: Kallsyms, addresses: Iterable[int]) -> dict[int, str]:
    names = {}
    for address in addresses:
        symbol = table.resolve(address)
        names[address] = symbol.name if symbol is not None else f"{address:#x}"
    return names


def resolve_in_child(addresses: set[int]) -> dict[int, str]:
    """Resolve a batch in a child process; on failure every address keeps its hex form (logged)."""
    argv = [sys.executable, "-m", "netsleuth.kernel.function_names", *(str(address) for address in addresses)]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=_CHILD_TIMEOUT_S, check=True)
        return {int(address): name for address, name in json.loads(result.stdout).items()}
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        detail = error.stderr.strip() if isinstance(error, subprocess.CalledProcessError) else str(error)
        _LOG.warning("cannot name kernel functions (%s): drop locations are shown as addresses", detail)
        return {address: f"{address:#x}" for address in addresses}


class FunctionNames:
    def __init__(self, resolve_batch: Callable[[set[int]], dict[int, str]] = resolve_in_child) -> None:
        self._resolve_batch = resolve_batch
        self._names: dict[int, str] = {}
        self._lock = threading.Lock()
        self.batches = 0

    def names(self, addresses: Iterable[int]) -> dict[int, str]:
        """address -> function name ("0x..." when no symbol covers it)."""
        wanted = set(addresses)
        with self._lock:
            missing = wanted - self._names.keys()
            if missing:
                self.batches += 1
                resolved = self._resolve_batch(missing)
                for address in missing:
                    self._names[address] = resolved.get(address, f"{address:#x}")
            return {address: self._names[address] for address in wanted}


class SharedKallsyms:
    """One symbol table for all the sessions running at a time: loaded (lazily, by the first lookup) while
    any session holds it, let go when the last one ends."""

    def __init__(
        self,
        make_table: Callable[[], Kallsyms] = Kallsyms,
        after_release: Callable[[], None] = release_freed_memory,
    ) -> None:
        self._make_table = make_table
        self._after_release = after_release
        self._table: Kallsyms | None = None
        self._holders = 0
        self._lock = threading.Lock()

    def acquire(self) -> Kallsyms:
        with self._lock:
            if self._table is None:
                self._table = self._make_table()
            self._holders += 1
            return self._table

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders > 0:
                return
            self._table = None
        self._after_release()

    @property
    def holders(self) -> int:
        with self._lock:
            return self._holders


def _main(argv: list[str]) -> int:
    """The child: ADDRESS... (decimal) -> {"ADDRESS": "function"} on stdout."""
    from netsleuth.errors import NetsleuthError

    try:
        names = _names_from(Kallsyms(), (int(text) for text in argv))
    except NetsleuthError as error:
        sys.stderr.write(f"{error}\n")
        return 1
    sys.stdout.write(json.dumps({str(address): name for address, name in names.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
