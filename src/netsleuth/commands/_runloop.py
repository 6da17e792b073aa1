"""The shape every tracing command shares: signals that stop the loop cleanly, a deadline, a ready file once
the probes are attached, and a progress line on a terminal's stderr.

(`netsleuth drops` has its own copies of `_StopSignals` and `_Progress`; it can switch to these.)
"""

from __future__ import annotations

import argparse
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TextIO

from netsleuth.errors import UsageError

__all__ = [
    "POLL_MS",
    "Progress",
    "StopSignals",
    "add_run_arguments",
    "check_run_arguments",
    "run_until_stopped",
    "write_ready_file",
]

POLL_MS = 100
_PROGRESS_S = 0.5


def add_run_arguments(parser: argparse.ArgumentParser, summary_help: str) -> None:
    """--summary, --json, --duration, --sample, --ready-file: the same for every tracing command."""
    parser.add_argument("--summary", action="store_true", help=summary_help)
    parser.add_argument("--json", action="store_true", help="JSON Lines output, ending with a summary object")
    parser.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long")
    parser.add_argument(
        "--sample", type=int, default=1, metavar="N", help="print one event in N (totals stay exact)"
    )
    parser.add_argument("--ready-file", metavar="PATH", help="create this file once the probes are attached")


def check_run_arguments(args: argparse.Namespace) -> None:
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be a positive number of seconds")
    if args.sample < 1:
        raise UsageError("--sample must be 1 (every event) or more")


def write_ready_file(path: str | None, text: str) -> None:
    if path:
        try:
            Path(path).write_text(f"{text}\n")
        except OSError as error:
            raise UsageError(f"cannot write --ready-file {path}: {error.strerror}") from None


class StopSignals:
    """SIGINT and SIGTERM end a run by setting a flag the loop checks, never by raising in the middle of a
    batch: an exception between reading records and printing them would lose them."""

    def __init__(self) -> None:
        self.stopped = False
        self._previous: dict[int, object] = {}

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        self.stopped = True

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


class Progress:
    """A status line on a terminal's stderr: events/s, lost and sampled, so a long run never looks hung."""

    def __init__(self, stream: TextIO, noun: str) -> None:
        self._stream = stream
        self._noun = noun
        self.enabled = stream.isatty()
        self._last = time.monotonic()
        self._last_total = 0
        self._shown = False

    def clear(self) -> None:
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._shown = False

    def update(self, total: int, shown: int, sampled: int, lost: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < _PROGRESS_S:
            return
        rate = (total - self._last_total) / (now - self._last)
        self._last, self._last_total = now, total
        self._stream.write(
            f"\r\x1b[K{total} {self._noun} ({rate:,.0f}/s), {shown} shown, {sampled} sampled, {lost} lost"
        )
        self._stream.flush()
        self._shown = True


def run_until_stopped(
    step: Callable[[int], None], duration: float | None, signals: StopSignals, poll_ms: int = POLL_MS
) -> None:
    """Call `step(timeout_ms)` until a signal or the deadline; each step waits at most `poll_ms`."""
    deadline = time.monotonic() + duration if duration else None
    while not signals.stopped and (deadline is None or time.monotonic() < deadline):
        remaining_ms = poll_ms if deadline is None else int((deadline - time.monotonic()) * 1000)
        step(max(0, min(poll_ms, remaining_ms)))
