"""A session's CPU budget, checked through bpf_stats: the kernel's own account of the time its BPF programs
ran (run_time_ns in struct bpf_prog_info), against wall-clock time over a sliding window.

The program runs in whatever context the hook fires in (softirq, a sender's syscall), so this is CPU taken
from the traced workload; it is what a drop storm makes grow and what a session must not be allowed to
spend without bound.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from netsleuth.bpf.stats import ProgramStats, program_stats

__all__ = ["SESSION_NEEDS", "CpuBudget"]

# What every session on an agent needs whatever its diagnostic (netsleuth.bpf.features names): the agent holds
# each session to its CPU budget, so without run-time accounting it refuses them all (agent/sessions.py for
# local sessions, fleet/agent_link.py for fleet tasks).
SESSION_NEEDS = ("bpf_stats",)

_WINDOW_S = 1.0
_MIN_SPAN_S = 0.5  # a shorter span is too noisy to abort anything on


class CpuBudget:
    def __init__(
        self,
        percent: float,
        program_fds: Sequence[int],
        stats_of: Callable[[int], ProgramStats] = program_stats,
        clock: Callable[[], float] = time.monotonic,
        window: float = _WINDOW_S,
    ) -> None:
        self.percent = percent
        self._fds = tuple(program_fds)
        self._stats_of = stats_of
        self._clock = clock
        self._window = window
        self._samples: deque[tuple[float, int]] = deque()
        self.peak_percent = 0.0
        self._first: tuple[float, int] | None = None
        self._last: tuple[float, int] | None = None

    def _run_time_ns(self) -> int:
        return sum(self._stats_of(fd).run_time_ns for fd in self._fds)

    def sample(self) -> tuple[float, int]:
        """Read the programs' run time now (each check does; the session's end does for its report)."""
        now, used_ns = self._clock(), self._run_time_ns()
        self._first = self._first or (now, used_ns)
        self._last = (now, used_ns)
        return now, used_ns

    def check(self) -> str | None:
        """None while within budget; otherwise the sentence that ends the session."""
        now, used_ns = self.sample()
        self._samples.append((now, used_ns))
        # Keep one sample at or before the window's start as the base of the rate.
        while len(self._samples) > 1 and self._samples[1][0] <= now - self._window:
            self._samples.popleft()
        base_time, base_ns = self._samples[0]
        span = now - base_time
        if span < _MIN_SPAN_S:
            return None
        used_percent = (used_ns - base_ns) / (span * 1e9) * 100
        self.peak_percent = max(self.peak_percent, used_percent)
        if used_percent <= self.percent:
            return None
        return (
            f"the session's BPF programs used {used_percent:.2f}% of one CPU over the last {span:.1f} s, "
            f"over the budget of {self.percent:g}%"
        )

    def average_percent(self) -> float:
        """Over the whole session so far."""
        if self._first is None or self._last is None or self._last[0] <= self._first[0]:
            return 0.0
        return (self._last[1] - self._first[1]) / ((self._last[0] - self._first[0]) * 1e9) * 100

    def run_time_ns(self) -> int:
        """Run time since the session attached."""
        if self._first is None or self._last is None:
            return 0
        return self._last[1] - self._first[1]
