"""The agent's ledger of its own attached BPF programs and what they cost (bpf_stats run count and time).

Sessions come and go; their programs' final figures are kept when they detach, so the exported run-time
counters only ever grow (one series per owner and program name, never one per session).
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from netsleuth.bpf.stats import ProgramStats, program_stats

__all__ = ["ProgramCost", "ProgramLedger"]


@dataclass(frozen=True)
class ProgramCost:
    owner: str  # "exporter" or "sessions"
    program: str
    attached: int
    run_count: int
    run_time_ns: int


@dataclass(frozen=True)
class _Entry:
    owner: str
    program: str
    fd: int


class ProgramLedger:
    def __init__(self, stats_of: Callable[[int], ProgramStats] = program_stats) -> None:
        self.stats_of = stats_of  # bpf_stats of one program fd; sessions' CPU budgets read it too
        self._live: dict[int, _Entry] = {}
        self._detached: dict[tuple[str, str], tuple[int, int]] = defaultdict(lambda: (0, 0))
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def attached(self, owner: str, program: str, fd: int) -> int:
        """Record a program now attached; returns the handle for `detaching`."""
        with self._lock:
            handle = next(self._ids)
            self._live[handle] = _Entry(owner, program, fd)
            return handle

    def detaching(self, handle: int) -> None:
        """Call while the program's fd is still open: its final figures are read now."""
        with self._lock:
            entry = self._live.pop(handle, None)
            if entry is None:
                return
            final = self.stats_of(entry.fd)
            runs, time_ns = self._detached[(entry.owner, entry.program)]
            self._detached[(entry.owner, entry.program)] = (
                runs + final.run_count,
                time_ns + final.run_time_ns,
            )

    def costs(self) -> list[ProgramCost]:
        with self._lock:
            totals: dict[tuple[str, str], list[int]] = {
                key: [0, runs, time_ns] for key, (runs, time_ns) in self._detached.items()
            }
            for entry in self._live.values():
                stats = self.stats_of(entry.fd)
                row = totals.setdefault((entry.owner, entry.program), [0, 0, 0])
                row[0] += 1
                row[1] += stats.run_count
                row[2] += stats.run_time_ns
        return [
            ProgramCost(owner, program, attached, runs, time_ns)
            for (owner, program), (attached, runs, time_ns) in sorted(totals.items())
        ]
