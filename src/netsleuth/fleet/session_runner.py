"""One fleet session on this host, run on its own thread: prepare, wait for T0, stream, end - and end by
itself whatever happens to NATS or the controller.

    preparing -> (open + load + attach) -> ready(offset) -> [start T0] -> running(skew) -> ended(reason)
                                  \\-> failed(why)           \\-> ended(start_timeout | cancelled | ...)

Programs attach in *prepare* so that at T0 every host is already watching: records are read from the ring
buffer all along, and those stamped before T0 are discarded, so the window each host reports starts at the
same wall-clock instant (corrected by its clock offset), not at whenever its start message arrived. The
totals reported are the window's: the exact kernel counters at the end minus those at T0, and so are the
summary's in-kernel groups (FleetDiagnostic.start_window).

Every limit is local: the deadline (T0 + deadline_s on this host's monotonic clock, or the task's expiry if
no start comes), the event and byte caps (agent/record_caps.py, the same as local sessions), the CPU budget
of the session's programs (agent/cpu_budget.py, bpf_stats). Publishing never blocks the session: when NATS
is gone the messages are dropped by the link, the session still ends at its deadline and detaches.

Every record on its way out - events, conntrack entries, the summary - passes the task's scope filter
(scope_filter.py) first: what it withholds is counted, not sent, and the `ended` status says how much.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec

from netsleuth.agent.cpu_budget import CpuBudget
from netsleuth.agent.programs import ProgramLedger
from netsleuth.agent.record_caps import take_within_caps
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import NetsleuthError
from netsleuth.fleet.admission import AcceptedTask
from netsleuth.fleet.conntrack_records import ConntrackWatch, joins_conntrack
from netsleuth.fleet.diagnostic_source import EncodedRecords, FleetDiagnostic, Records
from netsleuth.fleet.protocol import (
    HostState,
    HostStatus,
    RecordBatch,
    progress_subject,
    records_subject,
    status_subject,
)
from netsleuth.fleet.scope_filter import ScopeFilter
from netsleuth.spec.records import encode, to_builtins

__all__ = ["FleetSession", "record_wall_ns"]

_LOG = logging.getLogger("netsleuth.agent.fleet")
_POLL_MS = 50
_BATCH_RECORDS = 256  # records per message: bounded, so one message stays well under NATS's 1 MB max_payload
_BATCH_BYTES = 256 << 10

# (subject, data, message id, kind): the id names the message for JetStream's duplicate detection
# (`<session>.<host>.status.<n>`, `.records.<seq>`), so a message sent again after a lost acknowledgement is
# stored once. kind "status" (ready and the ends: stored, never dropped for want of room), "records" (stored,
# may be dropped: a batch gap) or "progress" (preparing, running: published, stored by no stream - the next
# status supersedes it, and 10,000 hosts' writes a session are what a cluster's streams are short of).
Publish = Callable[[str, bytes, str, str], None]
_PROGRESS = frozenset({"preparing", "running"})
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def record_wall_ns(record: Any, mono_to_wall_ns: int) -> int | None:
    """When the event happened on this host's wall clock: from its monotonic stamp (bpf_ktime_get_ns) when
    the record has one, else from its time (a typed record's WallTime, a dict's ISO text, both to the
    microsecond); None if neither."""
    if isinstance(record, msgspec.Struct):
        mono = getattr(record, "monotonic_ns", None)
        if isinstance(mono, int) and mono > 0:
            return mono + mono_to_wall_ns
        seconds = getattr(record, "time", None)
        return round(seconds * 1e6) * 1000 if isinstance(seconds, float) else None
    mono = record.get("monotonic_ns")
    if isinstance(mono, int) and mono > 0:
        return mono + mono_to_wall_ns
    text = record.get("time")
    if isinstance(text, str):
        with contextlib.suppress(ValueError):
            stamp = datetime.datetime.fromisoformat(text)
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=datetime.UTC)
            # Integer arithmetic: a float timestamp loses the microseconds at today's epoch values.
            return (stamp - _EPOCH) // datetime.timedelta(microseconds=1) * 1000
    return None


def _minus(after: EventTotals, before: EventTotals) -> EventTotals:
    return EventTotals(
        after.seen - before.seen,
        after.matched - before.matched,
        after.emitted - before.emitted,
        after.sampled - before.sampled,
        after.lost - before.lost,
        after.ungrouped - before.ungrouped,
    )


class FleetSession:
    def __init__(
        self,
        accepted: AcceptedTask,
        host: str,
        open_diagnostic: Callable[[], FleetDiagnostic],
        publish: Publish,
        ledger: ProgramLedger,
        offset_ns: Callable[[], int],
        on_end: Callable[[FleetSession], None],
        wall_ns: Callable[[], int] = time.time_ns,
        mono_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.accepted = accepted
        self.task = accepted.task
        self.id = accepted.task.session
        self.host = host
        self._open = open_diagnostic
        self._publish = publish
        self._ledger = ledger
        self._offset_ns = offset_ns
        self._on_end = on_end
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._start = threading.Event()
        self._cancel = threading.Event()
        self._stop = threading.Event()
        self._t0_ns = 0
        self._stop_reason = ("agent_stopping", "the agent is shutting down")
        self.state: HostState = "preparing"
        self.reason = ""
        self.events = 0
        self.bytes = 0
        self._batches = 0
        self._statuses = 0
        self._skew_ns: int | None = None
        self._window = EventTotals()
        self._diagnostic: FleetDiagnostic | None = None  # set once attached, for the T0 marker
        self._marked = threading.Event()  # T0 has passed and its baseline is read
        self._done = threading.Event()  # the session is over: the marker must not touch it any more
        self._mark_lock = threading.Lock()
        self._t0_mono = 0
        self._baseline = EventTotals()
        self._scope: ScopeFilter | None = None  # built on the session's thread (it reads namespace names)
        self._conntrack: ConntrackWatch | None = None  # flow diagnostics: NAT hops timed by conntrack events
        self._conntrack_note = ""
        self.thread = threading.Thread(target=self._run, name=f"fleet-{self.id}", daemon=True)

    @property
    def withheld(self) -> int:
        """Records and entries of records withheld as outside the task's scope, so far."""
        return self._scope.withheld if self._scope is not None else 0

    # -- control, from the link's thread ----------------------------------------------------------------
    def start_at(self, t0_ns: int) -> None:
        if not self._start.is_set():
            self._t0_ns = t0_ns
            self._start.set()
            threading.Thread(target=self._mark_t0, name=f"fleet-{self.id}-t0", daemon=True).start()

    def _mark_t0(self) -> None:
        """At T0: read the baseline of the window's totals and say "running". On its own thread so that
        every host starts its window at T0 to within a scheduler tick, even while its session thread is in
        the middle of a slow read (a `diagnose` poll can take hundreds of milliseconds)."""
        while (remaining_ns := self._t0_ns - self._wall_ns()) > 0:
            if self._done.is_set():
                return
            time.sleep(min(remaining_ns / 1e9, 0.05))
        if self._diagnostic is not None:  # else still preparing: the session thread marks when it is ready
            self._mark_now(self._diagnostic)

    def _mark_now(self, diagnostic: FleetDiagnostic) -> None:
        with self._mark_lock:
            if self._done.is_set() or self._marked.is_set():
                return
            self._t0_mono = self._mono_ns()
            self._skew_ns = self._wall_ns() - self._t0_ns
            self._baseline = diagnostic.totals()
            # The summary's groups count from T0 too, so they add up to the window's totals (a drop between
            # attach and T0 is in neither). Read right after the totals: a drop between the two reads, in a
            # storm across T0, is in one baseline and not the other.
            diagnostic.start_window()
            if self._conntrack is not None:
                self._conntrack.mark()
            self._marked.set()
        self._status("running")

    def cancel(self) -> None:
        self._cancel.set()

    def stop(self, reason: str, detail: str) -> None:
        self._stop_reason = (reason, detail)
        self._stop.set()

    def begin(self) -> None:
        self.thread.start()

    # -- messages ---------------------------------------------------------------------------------------
    def _status(
        self,
        state: HostState,
        reason: str = "",
        totals: EventTotals | None = None,
        notes: list[str] | None = None,
    ) -> None:
        self.state, self.reason = state, reason
        withheld = self.withheld
        status = HostStatus(
            host=self.host,
            session=self.id,
            state=state,
            reason=reason,
            offset_ns=self._offset_ns(),
            start_skew_ns=self._skew_ns,
            totals={**totals.to_json(), "withheld": withheld} if totals is not None else {},
            lost=totals.lost if totals is not None else 0,
            sampled=totals.sampled if totals is not None else 0,
            events=self.events,
            sent_bytes=self.bytes,
            notes=tuple(notes or ()),
            withheld=withheld,
            batches=self._batches,
        )
        self._statuses += 1
        message_id = f"{self.id}.{self.host}.status.{self._statuses}"
        if state in _PROGRESS:
            self._publish(progress_subject(self.id, self.host), status.encode(), message_id, "progress")
        else:
            self._publish(status_subject(self.id, self.host), status.encode(), message_id, "status")

    def _publish_batch(self, data: bytes) -> None:
        message_id = f"{self.id}.{self.host}.records.{self._batches}"
        self._publish(records_subject(self.id, self.host), data, message_id, "records")
        self._batches += 1

    def _send(self, records: Records) -> tuple[str, str] | None:
        """Publish within the caps, in bounded batches; returns why the session must end, if it must."""
        if self._scope is not None:
            records = (
                records.keep(self._scope)
                if isinstance(records, EncodedRecords)
                else self._scope.keep(records)
            )
        if not records:
            return None
        budgets = self.accepted.budgets
        encoded: Iterable[bytes] = (
            records.lines()  # a drop batch's own lines: one encoding per kind of drop
            if isinstance(records, EncodedRecords)
            else (_line(record) for record in records)
        )
        lines, ended = take_within_caps(
            encoded, self.events, self.bytes, budgets.max_events, budgets.max_bytes
        )
        for chunk in _chunks(lines):
            self._publish_batch(RecordBatch.encode_lines(self.host, self.id, self._batches, chunk))
        self.events += len(lines)
        self.bytes += sum(len(line) for line in lines)
        return ended

    # -- the session's life -----------------------------------------------------------------------------
    def _run(self) -> None:
        diagnostic: FleetDiagnostic | None = None
        handles: list[int] = []
        try:
            self._status("preparing")
            self._scope = ScopeFilter(self.accepted.scope)
            self._watch_conntrack()
            diagnostic = self._open()
            diagnostic.start()
            # The first read pays for lazy set-up (symbol tables, enrichers): in prepare, not after T0, where
            # it would delay the baseline of the window's totals.
            diagnostic.poll(0)
            fds = diagnostic.program_fds()
            handles = [self._ledger.attached("fleet", name, fd) for name, fd in fds.items()]
            budget = CpuBudget(
                self.accepted.budgets.cpu_percent,
                list(fds.values()),
                stats_of=self._ledger.stats_of,
                clock=lambda: self._mono_ns() / 1e9,
            )
            budget.check()
            self._diagnostic = diagnostic
            self._status("ready")
            reason, detail = self._wait_and_stream(diagnostic, budget)
            self._finish(diagnostic, reason, detail)
        except NetsleuthError as error:
            self._status("failed", str(error))
        except Exception as error:  # a bug: this session fails, the agent keeps serving the others
            _LOG.exception("fleet session %s failed", self.id)
            self._status("failed", f"internal error: {error}")
        finally:
            with self._mark_lock:
                self._done.set()
            for handle in handles:
                self._ledger.detaching(handle)
            if diagnostic is not None:
                diagnostic.close()
            if self._conntrack is not None:
                self._conntrack.close()
            self._on_end(self)

    def _interruption(self, when: str = "") -> tuple[str, str] | None:
        """Why the session must end now, if the controller cancelled it or the agent is stopping."""
        if self._cancel.is_set():
            return "cancelled", " ".join(("the controller cancelled the session", when)).strip()
        if self._stop.is_set():
            return self._stop_reason
        return None

    def _mono_to_wall(self) -> int:
        return self._wall_ns() - self._mono_ns()

    def _wait_and_stream(self, diagnostic: FleetDiagnostic, budget: CpuBudget) -> tuple[str, str]:
        # Until start: keep the ring buffer empty (those events are before any T0) and watch the clock. The
        # task's expiry is the local deadline for a start that never comes (controller or NATS gone).
        expires_mono = self._mono_ns() + int((self.task.expires_at * 1e9) - self._wall_ns())
        while not self._start.is_set():
            if interrupted := self._interruption("before it started"):
                return interrupted
            if self._mono_ns() >= expires_mono:
                return "start_timeout", "no start came before the task expired"
            diagnostic.poll(_POLL_MS)
            over = budget.check()
            if over:
                return "cpu_budget", over
        t0_ns = self._t0_ns
        # Events in the ring keep being read (and those stamped before T0 discarded) until T0 has been marked:
        # by the marker thread, at T0 itself, whatever a slow poll here is doing at that instant.
        while not self._marked.is_set():
            if interrupted := self._interruption():
                return interrupted
            if self._wall_ns() >= t0_ns:
                self._mark_now(diagnostic)  # T0 came while preparing, or before the marker woke
                break
            wait_ms = max(1, min(_POLL_MS, math.ceil((t0_ns - self._wall_ns()) / 1e6)))
            diagnostic.poll(wait_ms)
        baseline = self._baseline
        deadline_mono = self._t0_mono + int(self.accepted.deadline_s * 1e9)
        mono_to_wall = self._mono_to_wall()

        def in_window(records: Records) -> Records:
            if isinstance(records, EncodedRecords):
                return records.since(t0_ns)
            kept = []
            for record in records:
                stamp = record_wall_ns(record, mono_to_wall)
                if stamp is None or stamp >= t0_ns:
                    kept.append(record)
            return kept

        try:
            while True:
                if interrupted := self._interruption():
                    return interrupted
                remaining_ns = deadline_mono - self._mono_ns()
                if remaining_ns <= 0:
                    ended = self._send(in_window(diagnostic.drain()))
                    return ended or ("duration", f"ran for its {self.accepted.deadline_s:g} s")
                timeout_ms = max(1, min(_POLL_MS, math.ceil(remaining_ns / 1e6)))
                ended = self._send(in_window(diagnostic.poll(timeout_ms)))
                if ended:
                    return ended
                over = budget.check()
                if over:
                    return "cpu_budget", over
        finally:
            self._window = _minus(diagnostic.totals(), baseline)

    def _finish(self, diagnostic: FleetDiagnostic, reason: str, detail: str) -> None:
        notes = diagnostic.notes()
        if self._skew_ns is not None:
            if joins_conntrack(self.task.diagnostic):
                notes += self._send_conntrack()
            summary = _with_totals(diagnostic.summary(interrupted=reason != "duration"), self._window)
            self._send_summary(summary)
        if self._scope is not None and (withheld := self._scope.note()):
            notes.append(withheld)
        self._status("ended", f"{reason}: {detail}" if detail else reason, self._window, notes)

    def _watch_conntrack(self) -> None:
        """Conntrack's events from now on, in the namespaces the scope allows (a flow diagnostic only): they
        must be subscribed before the session's traffic creates its entries."""
        if not joins_conntrack(self.task.diagnostic):
            return
        scope = self.accepted.scope
        namespaces = None if scope.host_wide else list(self.accepted.namespace_files)
        try:
            self._conntrack = ConntrackWatch(self.accepted.config_json, namespaces)
            self._conntrack.start()
        except (NetsleuthError, OSError) as error:  # no ctnetlink, a namespace gone: the session still runs
            self._conntrack_note = f"conntrack not watched: {error}"

    def _send_conntrack(self) -> list[str]:
        """The conntrack entries of this session's flows, timed by conntrack's events, and each namespace's
        INVALID count over the window (for the controller's NAT join); outside the event cap like the
        summary, and bounded on their own. Returns notes."""
        if self._conntrack is None:
            return [self._conntrack_note] if self._conntrack_note else []
        try:
            records, notes = self._conntrack.finish(self._t0_ns, self._wall_ns())
        except (NetsleuthError, OSError) as error:  # the session's own records still stand
            return [f"conntrack entries not read: {error}"]
        if self._scope is not None:
            records = self._scope.keep(records)
        for start in range(0, len(records), _BATCH_RECORDS):
            batch = RecordBatch(self.host, self.id, self._batches, records[start : start + _BATCH_RECORDS])
            self._publish_batch(batch.encode())
        return notes

    def _send_summary(self, typed: Any) -> None:
        # Always sent, like a local session's summary: outside the event cap, its groups cut to fit a message.
        if self._scope is not None:
            (typed,) = self._scope.keep([typed])  # a summary is never withheld, only its groups
        summary: dict[str, Any] = to_builtins(typed) if isinstance(typed, msgspec.Struct) else typed
        groups = summary.get("groups")
        body = json.dumps(summary, separators=(",", ":")).encode()
        if isinstance(groups, list) and len(body) > _BATCH_BYTES:
            kept = groups[: max(1, len(groups) * _BATCH_BYTES // len(body) // 2)]
            summary = {**summary, "groups": kept, "groups_omitted": len(groups) - len(kept)}
        self._publish_batch(RecordBatch(self.host, self.id, self._batches, [summary]).encode())


def _line(record: Any) -> bytes:
    """One record's JSON line in a batch: a typed record encoded by its type, a dict as it is."""
    if isinstance(record, msgspec.Struct):
        return encode(record)
    return json.dumps(record, separators=(",", ":")).encode()


def _with_totals(summary: Any, window: EventTotals) -> Any:
    """The summary with the window's totals: its own count from attach, the window's (from T0) are what this
    host saw. Only the totals it declares are replaced (conn's summary has per-kind totals, no top-level
    ones)."""
    totals = window.to_json()
    if isinstance(summary, msgspec.Struct):
        fields = summary.__struct_fields__
        return msgspec.structs.replace(summary, **{key: v for key, v in totals.items() if key in fields})
    summary.update({key: value for key, value in totals.items() if key in summary})
    return summary


def _chunks(lines: list[bytes]) -> Iterator[list[bytes]]:
    """Encoded records in batches of at most _BATCH_RECORDS and about _BATCH_BYTES."""
    chunk: list[bytes] = []
    size = 0
    for line in lines:
        if chunk and (len(chunk) >= _BATCH_RECORDS or size + len(line) > _BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(line)
        size += len(line)
    if chunk:
        yield chunk
