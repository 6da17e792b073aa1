"""The one run loop of every tracing command: signals that stop the loop cleanly, a deadline, a ready file
once the probes are attached, a progress line on a terminal's stderr, records to text or JSON Lines as they
arrive, then the session's summary and what was lost or sampled.

A command only says how its records read as text (`TextView`); `run_session` does the rest for any
`DiagnosticSession` of the registry.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from netsleuth.diagnostics.filters import filter_notes
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError
from netsleuth.startup_gc import resume_collection

if TYPE_CHECKING:
    # Protocols only named in annotations: a run of a typed diagnostic never defines the old model's classes.
    from netsleuth.diagnostics.model import DiagnosticSession, Record

__all__ = [
    "POLL_MS",
    "Progress",
    "RunShape",
    "StopSignals",
    "TextView",
    "run_session",
    "run_until_stopped",
    "write_ready_file",
]

POLL_MS = 100
_PROGRESS_S = 0.5


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

    def __init__(self, stream: TextIO, noun: str, status: Callable[[], str] | None = None) -> None:
        self._stream = stream
        self._noun = noun
        self._status = status
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
        text = (
            self._status()
            if self._status is not None
            else f"{total} {self._noun} ({rate:,.0f}/s), {shown} shown, {sampled} sampled, {lost} lost"
        )
        self._stream.write(f"\r\x1b[K{text}")
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


class RunShape(Protocol):
    """What the run loop reads of how a run goes: a diagnostic's typed config (spec.common.RunConfig)."""

    @property
    def summary(self) -> bool: ...

    @property
    def duration(self) -> float | None: ...


class TextView(Protocol):
    """How one diagnostic's records read on a terminal (JSON Lines are the records' own `to_json`)."""

    noun: str  # what the progress line counts: "drops", "resets"...

    def lines(self, records: Sequence[Any]) -> str:
        """The text of a batch of records, one or more lines each, newline-terminated."""
        ...

    def finish(self, summary: Any, totals: EventTotals, show_groups: bool) -> None:
        """The closing text: the group table when `show_groups` (a summary run, Ctrl-C or --duration), or the
        totals line."""
        ...

    def loss_line(self, totals: EventTotals) -> str:
        """The stderr line when events were sampled away or lost."""
        ...


def run_session(
    session: DiagnosticSession,
    options: RunShape,
    view: TextView,
    *,
    json_lines: bool,
    ready_file: str | None,
    sinks: Sequence[Callable[[Sequence[Record]], None]] = (),
    status: Callable[[], str] | None = None,
    out: TextIO | None = None,
) -> int:
    """Run `session` until Ctrl-C/SIGTERM or `options.duration`; print records as they arrive and the summary
    at the end. `sinks` get every batch too (e.g. a pcapng writer); `status` replaces the progress line's
    event counts. Returns the exit status (0)."""
    out = out or sys.stdout
    progress = Progress(sys.stderr, view.noun, status)
    with contextlib.ExitStack() as stack:
        # Installed before anything attaches: a Ctrl-C at any point ends the run the same orderly way.
        signals = stack.enter_context(StopSignals())
        stack.callback(session.close)
        session.start()
        for note in filter_notes(session):  # said now: the run may otherwise look like it sees nothing
            sys.stderr.write(f"netsleuth: {note}\n")
        write_ready_file(ready_file, session.attach_kind)
        resume_collection()  # held off by the CLI while starting (netsleuth.startup_gc)
        # The JSON encoder loads once attached: attach time is not spent on what comes after.
        from netsleuth.render.jsonl import JsonLinesWriter

        writer = JsonLinesWriter(out) if json_lines else None

        def emit(records: Sequence[Record]) -> None:
            if not records:
                return
            progress.clear()
            if writer is not None:
                writer.write_records(records)
            else:
                out.write(view.lines(records))
            out.flush()
            for sink in sinks:
                sink(records)

        def step(timeout_ms: int) -> None:
            emit(session.poll(timeout_ms))
            if progress.enabled:  # the kernel's counters are read for a terminal's progress line only
                totals = session.totals()
                progress.update(totals.matched, totals.emitted, totals.sampled, totals.lost)

        run_until_stopped(step, options.duration, signals)
        emit(session.drain())
        progress.clear()
        interrupted = signals.stopped
        summary = session.summary(interrupted)
        totals = session.totals()
        if writer is not None:
            writer.write_records([summary])
            writer.flush()
        else:
            view.finish(summary, totals, options.summary or interrupted or bool(options.duration))
        for note in session.notes():
            sys.stderr.write(f"netsleuth: {note}\n")
        if not options.summary and (totals.lost or totals.sampled):
            sys.stderr.write(f"netsleuth: {view.loss_line(totals)}\n")
    return 0
