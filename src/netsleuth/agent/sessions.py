"""Bounded sessions: one diagnostic with its own filters and attachment, streamed as JSON lines.

The agent, not the client, enforces every limit: the deadline (a session ends at it whatever its client
does: writes time out at the deadline, and a closed connection is noticed within one poll), the event and
byte caps, the CPU budget of its BPF programs (bpf_stats), and the number of sessions at once. The stream
is the CLI's own records, then the CLI's summary, then one `session_end` line saying why it ended:

    {"type":"session_start","id":"3f9c0b1a2d4e","diagnostic":"drops",...}
    {"type":"drop",...}                       (exactly as `netsleuth drops --json`)
    {"type":"summary","total":...,"groups":[...]}
    {"type":"session_end","reason":"max_events","detail":"...",...}

Reasons: duration, max_events, max_bytes, cpu_budget, agent_stopping, client_gone (not delivered: the
client is gone; it shows in the metrics and the log), error.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from netsleuth.agent.config import SessionLimits
from netsleuth.agent.cpu_budget import CpuBudget
from netsleuth.agent.programs import ProgramLedger
from netsleuth.agent.record_caps import take_within_caps
from netsleuth.agent.session_diagnostics import (
    SESSION_DIAGNOSTICS,
    DiagnosticContext,
    DiagnosticFactory,
)
from netsleuth.agent.session_request import LocalSession, parse_session_request
from netsleuth.diagnostics.model import DiagnosticSession, Record
from netsleuth.errors import NetsleuthError, UsageError
from netsleuth.render.jsonl import encode_line, record_lines
from netsleuth.spec.records import encode
from netsleuth.spec.session_records import SessionEnd, SessionStart

__all__ = [
    "ClientGone",
    "LiveSession",
    "SessionManager",
    "SessionRefused",
    "SessionSink",
    "SessionStats",
]

_POLL_MS = 100
_LOG = logging.getLogger("netsleuth.agent")


class ClientGone(Exception):
    """The client closed the connection or stopped reading."""


class SessionRefused(Exception):
    """A session that will not run; `status` is the HTTP status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SessionSink(Protocol):
    def write(self, data: bytes, deadline: float) -> None:
        """Send everything by `deadline` (monotonic) or raise ClientGone."""

    def client_gone(self) -> bool: ...


@dataclass
class SessionStats:
    """Counters for the self-metrics; only ever grow (except `active`)."""

    active: int = 0
    ended: Counter[tuple[str, str]] = field(default_factory=Counter)  # (diagnostic, reason)
    refused: Counter[str] = field(default_factory=Counter)  # busy, invalid, unavailable, failed
    events: int = 0
    bytes: int = 0
    lost: int = 0
    sampled: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _encode(record: Mapping[str, Any]) -> bytes:
    # The CLI's encoder, so a session's lines are byte-for-byte what `--json` prints.
    return encode_line(record)


def _whole_blob(records: Sequence[Record], events_left: int) -> bytes | None:
    """The batch's lines as one blob when it builds them so (json_blob) and has fewer than `events_left`
    records (the event cap ends a session when it is reached, as take_within_caps says)."""
    build = getattr(records, "json_blob", None)
    if build is None or not 0 < len(records) < events_left:
        return None
    blob: bytes = build()
    return blob


class LiveSession:
    """An accepted, attached session; `stream` runs it to its end on the calling thread."""

    def __init__(
        self,
        manager: SessionManager,
        session_id: str,
        request: LocalSession,
        diagnostic: DiagnosticSession,
        peer: str,
        clock: Callable[[], float],
    ) -> None:
        self.id = session_id
        self.request = request
        self.peer = peer
        self._manager = manager
        self._diagnostic = diagnostic
        self._clock = clock
        self.started = clock()
        self.deadline = self.started + request.duration
        self.events = 0
        self.bytes = 0
        fds = diagnostic.program_fds()
        self._handles = [manager.ledger.attached("sessions", name, fd) for name, fd in fds.items()]
        self._budget = CpuBudget(
            request.cpu_budget_percent, list(fds.values()), stats_of=manager.ledger.stats_of, clock=clock
        )
        self._budget.check()  # the first sample: the budget is measured from attach on

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "peer": self.peer,
            **self.request.to_json(),
            "elapsed_seconds": round(self._clock() - self.started, 3),
            "events": self.events,
            "bytes": self.bytes,
        }

    def _send(self, sink: SessionSink, lines: list[bytes]) -> None:
        if lines:
            data = b"".join(lines)
            sink.write(data, self.deadline)
            self.bytes += len(data)

    def _take(self, records: Sequence[Record]) -> tuple[list[bytes], tuple[str, str] | None]:
        """Encode records while the caps allow; returns the lines and why it stopped, if it did. A batch
        that makes its lines whole (a drop storm's, netsleuth.diagnostics.drops.batch) goes as its one
        blob, as the CLI writes it, when all of it is inside both caps; otherwise line by line up to them."""
        blob = _whole_blob(records, self.request.max_events - self.events)
        if blob is not None and self.bytes + len(blob) <= self.request.max_bytes:
            self.events += len(records)
            return [blob], None
        lines, ended = take_within_caps(
            record_lines(records),
            self.events,
            self.bytes,
            self.request.max_events,
            self.request.max_bytes,
        )
        self.events += len(lines)
        return lines, ended

    def _run(self, sink: SessionSink) -> tuple[str, str]:
        stopping = self._manager.stopping
        while True:
            now = self._clock()
            if stopping.is_set():
                return "agent_stopping", "the agent is shutting down"
            if now >= self.deadline:
                lines, ended = self._take(self._diagnostic.drain())
                self._send(sink, lines)
                if ended:
                    return ended
                return "duration", f"ran for its {self.request.duration:g} s"
            if sink.client_gone():
                raise ClientGone("the client closed the connection")
            # Rounded up: the last poll waits out the deadline instead of spinning through its final ms.
            timeout_ms = max(1, min(_POLL_MS, math.ceil((self.deadline - now) * 1000)))
            lines, ended = self._take(self._diagnostic.poll(timeout_ms))
            self._send(sink, lines)
            if ended:
                return ended
            over = self._budget.check()
            if over:
                return "cpu_budget", over

    def _final_lines(self, reason: str, detail: str) -> list[bytes]:
        self._budget.sample()
        summary = dict(self._diagnostic.summary(interrupted=reason != "duration").to_json())
        line = _encode(summary)
        room = self.request.max_bytes - self.bytes
        if len(line) > room and summary.get("groups"):
            # The summary is always sent; under the byte cap its group list (largest first) is cut to fit.
            groups = summary["groups"]
            while groups and len(line) > room:
                groups = groups[: len(groups) // 2]
                line = _encode(
                    {**summary, "groups": groups, "groups_omitted": len(summary["groups"]) - len(groups)}
                )
        return [line, self._end_record(reason, detail, len(line))]

    def _end_record(self, reason: str, detail: str, pending_bytes: int) -> bytes:
        end = SessionEnd(
            id=self.id,
            reason=reason,
            detail=detail,
            seconds=round(self._clock() - self.started, 3),
            events=self.events,
            bytes=self.bytes + pending_bytes,
            bpf_run_time_ns=self._budget.run_time_ns(),
            bpf_cpu_percent=round(self._budget.average_percent(), 3),
            notes=self._diagnostic.notes(),
        )
        return encode(end) + b"\n"

    def stream(self, sink: SessionSink) -> str:
        """Run to the end; returns the reason it ended. Whatever fails, the client gets a session_end."""
        reason, detail = "error", ""
        try:
            start = SessionStart(id=self.id, **self.request.to_json(), attach=self._diagnostic.attach_kind)
            self._send(sink, [encode(start) + b"\n"])
            try:
                reason, detail = self._run(sink)
            except NetsleuthError as error:
                reason, detail = "error", str(error)
            try:
                final = self._final_lines(reason, detail)
            except NetsleuthError as error:
                reason, detail = "error", f"{detail}; the summary failed: {error}".lstrip("; ")
                final = [self._end_record(reason, detail, 0)]
            self._send(sink, final)
        except ClientGone as gone:
            reason, detail = "client_gone", str(gone)
        except Exception as error:  # a bug: end this session cleanly, keep the agent serving the others
            _LOG.exception("session %s failed", self.id)
            reason, detail = "error", f"internal error: {error}"
            with contextlib.suppress(ClientGone):
                self._send(sink, [self._end_record(reason, detail, 0)])
        finally:
            self._manager.finished(self, reason, detail)
        return reason

    def abandon(self, detail: str) -> None:
        """The client left before the stream began: end it without streaming."""
        self._manager.finished(self, "client_gone", detail)

    def close(self) -> None:
        totals = self._diagnostic.totals()
        lost, sampled = totals.lost, totals.sampled
        for handle in self._handles:
            self._manager.ledger.detaching(handle)
        self._diagnostic.close()
        with self._manager.stats.lock:
            self._manager.stats.lost += lost
            self._manager.stats.sampled += sampled


class SessionManager:
    def __init__(
        self,
        limits: SessionLimits,
        context: DiagnosticContext,
        ledger: ProgramLedger,
        cpu_accounting: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
        diagnostics: Mapping[str, DiagnosticFactory] = SESSION_DIAGNOSTICS,
        read_config: Callable[[str, dict[str, Any]], Any] | None = None,
    ) -> None:
        """`diagnostics` and `read_config`: the registry's, unless a test scripts its own."""
        self.limits = limits
        self._diagnostics = diagnostics
        self._read_config = read_config
        self.ledger = ledger
        self.stats = SessionStats()
        self.stopping = threading.Event()
        self._context = context
        self._cpu_accounting = cpu_accounting
        self._clock = clock
        self._sessions: dict[str, LiveSession] = {}
        self._reserved = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)

    def _refuse(self, cause: str, status: int, message: str) -> SessionRefused:
        with self.stats.lock:
            self.stats.refused[cause] += 1
        return SessionRefused(status, message)

    def open(self, body: bytes, peer: str) -> LiveSession:
        """Validate, reserve a slot and attach; raises SessionRefused with the reason."""
        if not self.limits.enabled:
            raise self._refuse("unavailable", 404, "sessions are disabled in this agent's config")
        if self.stopping.is_set():
            raise self._refuse("unavailable", 503, "the agent is shutting down")
        if not self._cpu_accounting():
            # The CPU budget is a limit the agent promises to enforce; without bpf_stats it cannot.
            raise self._refuse(
                "unavailable",
                503,
                "BPF run-time accounting is off, so a session's CPU budget cannot be enforced: give the "
                "agent CAP_SYS_ADMIN or set kernel.bpf_stats_enabled=1",
            )
        try:
            request = parse_session_request(body, self.limits, tuple(self._diagnostics), self._read_config)
        except UsageError as error:
            raise self._refuse("invalid", 400, str(error)) from None
        except NetsleuthError as error:  # reading the config needs what this host lacks (BTF, say)
            raise self._refuse("failed", 500, str(error)) from None
        with self._lock:
            if len(self._sessions) + self._reserved >= self.limits.max_concurrent:
                raise self._refuse(
                    "busy", 429, f"{self.limits.max_concurrent} sessions are running, this agent's maximum"
                )
            self._reserved += 1
        diagnostic: DiagnosticSession | None = None
        try:
            diagnostic = self._diagnostics[request.diagnostic](request.typed_config, self._context)
            diagnostic.start()
            session = LiveSession(self, secrets.token_hex(6), request, diagnostic, peer, self._clock)
        except UsageError as error:
            if diagnostic is not None:
                diagnostic.close()
            raise self._refuse("invalid", 400, str(error)) from None
        except NetsleuthError as error:
            if diagnostic is not None:
                diagnostic.close()
            raise self._refuse("failed", 500, str(error)) from None
        except Exception as error:  # a bug: detach what was attached, refuse, keep serving
            _LOG.exception("cannot start a %s session", request.diagnostic)
            if diagnostic is not None:
                diagnostic.close()
            raise self._refuse("failed", 500, f"internal error: {error}") from None
        finally:
            with self._lock:
                self._reserved -= 1
        with self._lock:
            self._sessions[session.id] = session
        with self.stats.lock:
            self.stats.active += 1
        _LOG.info(
            "session %s started for %s: %s", session.id, peer, _encode(request.to_json()).decode().strip()
        )
        return session

    def finished(self, session: LiveSession, reason: str, detail: str) -> None:
        session.close()
        with self.stats.lock:
            self.stats.active -= 1
            self.stats.ended[(session.request.diagnostic, reason)] += 1
            self.stats.events += session.events
            self.stats.bytes += session.bytes
        with self._lock:
            self._sessions.pop(session.id, None)
            self._idle.notify_all()
        _LOG.info(
            "session %s ended: %s (%s); %d events, %d bytes",
            session.id,
            reason,
            detail,
            session.events,
            session.bytes,
        )

    def active(self) -> list[dict[str, Any]]:
        with self._lock:
            sessions = list(self._sessions.values())
        return [session.describe() for session in sessions]

    def stop_all(self, timeout: float) -> bool:
        """Ask every session to end (reason agent_stopping) and wait for them; False if some did not."""
        self.stopping.set()
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._sessions:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True
