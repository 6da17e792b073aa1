"""Running one diagnostic on many hosts at the same moment, over NATS.

For each session: subscribe to every host's status and records first (nothing can be missed), then per host
in parallel measure its clock offset (pings, NTP-style, best of three by round trip) and send the signed,
time-limited task (prepare: the agent verifies, loads and attaches, then reports ready). Once every host is
ready or has failed, pick T0 = now + margin and send `start` to each ready host with T0 expressed on that
host's own clock, so all of them watch the same window. Then collect, ping the running hosts every second
(a host that stops answering is failed while the others go on), and end each host that has not reported its
end `end_grace` seconds after the deadline. The agents enforce the deadline themselves too: a controller
that dies mid-session leaves nothing attached anywhere, and the statuses they publish meanwhile are kept by
the server (NETSLEUTH_STATUS), so the controller that reads the session back shows each host's end.

A status or record batch belongs to the host whose subject it came on (`netsleuth.session.<id>.<host>.*`,
which only that host's agent may publish on): a body naming another host or session, a host that is not in
the session, or a malformed message is refused - counted (on the sender's view and in
netsleuth_controller_refused_messages_total), logged and audited once per sender, kind and reason (a flood
of them costs one log line and one audit record, not one each).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from netsleuth.controller.audit import AuditLog, AuditUnavailable
from netsleuth.controller.config import SessionsConfig
from netsleuth.controller.metrics import ControllerMetrics
from netsleuth.controller.streams import read_stream, stream_batches
from netsleuth.fleet.merge import MergedTimeline
from netsleuth.fleet.protocol import (
    RECORDS_STREAM,
    SESSIONS_STREAM,
    STATUS_STREAM,
    Budgets,
    Control,
    HostStatus,
    PingReply,
    ProtocolError,
    RecordBatch,
    Scope,
    SignedTask,
    Task,
    TaskReply,
    control_subject,
    decode,
    new_task_id,
    parse_session_subject,
    ping_subject,
    session_subjects,
    task_subject,
)

__all__ = ["FleetSession", "HostView", "SessionManager", "SessionSpec", "session_result"]

_log = logging.getLogger("netsleuth.controller")
_FINAL = frozenset({"ended", "failed", "rejected"})
_ACTIVE = frozenset({"preparing", "running"})
# A host's states in the order they happen: a status read back from the stream after a newer one came live
# (a resync) must not take the host back.
_RANK = {"preparing": 0, "ready": 1, "running": 2, "ended": 3, "failed": 3, "rejected": 3}
_RECONCILE_S = 3.0  # at the end, how long to wait for record batches a host sent but we lack (outbox resends)
_INTERRUPTED = "interrupted"  # the controller stopped before the session ended
_PINGS = 3  # clock samples per host, the one with the shortest round trip wins ...
_PINGS_LARGE = 1  # ... but one for large sessions: 3 x 1,000 round trips would delay T0 by a second
_LARGE_SESSION = 50
_LIVENESS_S = 1.0  # ping timeout
_QUIET_S = 2.0  # a host silent this long is pinged (a dead one answers "no responders" at once)
# ... but a live agent whose nats-server just died has no responder either until it reconnects to another
# server of the cluster (well under a second): it is failed only when nobody answers for this long.
_GONE_S = 3.0
_HISTORY_BYTES = 900 << 10  # under max_payload (1 MiB): above it keep the verdicts, the timeline's start
_KEPT_IN_MEMORY = 200  # ended sessions kept for fast reads; older ones are read from the history stream
_SUBSCRIBER_QUEUE = 20_000


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class SessionSpec:
    """A validated, authorised request."""

    user: str
    diagnostic: str
    config: dict[str, Any]
    scope: Scope
    duration: float
    hosts: tuple[str, ...]


@dataclass
class HostView:
    state: str = "preparing"
    reason: str = ""
    offset_ns: int | None = None
    rtt_ns: int | None = None
    start_skew_ns: int | None = None
    totals: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    sampled: int = 0
    records: int = 0
    sent: int | None = None  # records the host says it sent (its last status): `records` should reach it
    batches_sent: int = 0  # record batches the host says it sent (its last status)
    refused: int = 0  # messages on this host's subjects that were refused (a body naming another host, ...)
    seqs: set[int] = field(default_factory=set, repr=False)  # the record batches received (each once)
    missed_pings: int = 0
    unreachable_since: float | None = None  # monotonic: the first "no responders" of a run of them
    task_id: str = ""
    last_seen: float = 0.0  # monotonic: the last status, records or ping answer from this host
    # Set on each status of this host: its prepare waits on it (one waiter per host, not one per event).
    progressed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def batch_gaps(self) -> int:
        """Record batches the host sent (or numbered past) that never arrived: their records are unknown."""
        expected = max(self.batches_sent, max(self.seqs) + 1 if self.seqs else 0)
        return expected - len(self.seqs)

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "offset_ns": self.offset_ns,
            "rtt_ns": self.rtt_ns,
            "start_skew_ns": self.start_skew_ns,
            "totals": self.totals,
            "lost": self.lost,
            "sampled": self.sampled,
            "records": self.records,
            "sent": self.sent,
            "batch_gaps": self.batch_gaps,
            "refused": self.refused,
        }


class FleetSession:
    def __init__(
        self,
        session_id: str,
        spec: SessionSpec,
        hostnames: dict[str, str],
        max_timeline: int,
        netns_owner: dict[str, str] | None = None,
        runs: dict[str, str] | None = None,
    ) -> None:
        self.id = session_id
        self.spec = spec
        self.runs = runs or {}  # host -> the agent run its task is signed for (the registry's run_id)
        self.state = "preparing"
        self.created_ns = time.time_ns()
        self.t0_ns: int | None = None
        self.ended_ns: int | None = None
        self.hosts = {host: HostView() for host in spec.hosts}
        self.merged = MergedTimeline(hostnames, max_entries=max_timeline, netns_owner=netns_owner)
        self.verdicts: list[dict[str, Any]] = []
        self.cancel_requested = False
        self.interrupted = False  # the controller is stopping: the agents end the session on their own
        self.refusals_recorded: set[tuple[str, str, str]] = set()  # (sender, kind, reason) logged and audited
        self.final_json: bytes | None = None  # the whole ended session, serialised once for every reader
        self.status_events = 0
        self._live_cache: tuple[tuple[int, int, str], bytes] | None = None
        self.changed = asyncio.Event()
        self.done = asyncio.Event()
        self._listeners: list[asyncio.Queue[tuple[str, dict[str, Any]] | None]] = []

    # -- events for SSE ---------------------------------------------------------------------------------
    def listen(self) -> asyncio.Queue[tuple[str, dict[str, Any]] | None]:
        queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue(_SUBSCRIBER_QUEUE)
        self._listeners.append(queue)
        return queue

    def unlisten(self, queue: asyncio.Queue[tuple[str, dict[str, Any]] | None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(queue)

    def emit(self, event: str, data: dict[str, Any]) -> None:
        for queue in list(self._listeners):
            try:
                queue.put_nowait((event, data))
            except asyncio.QueueFull:
                # A client that reads slower than the session produces is cut off (it can fetch the
                # whole timeline afterwards) rather than letting the controller's memory grow.
                self._listeners.remove(queue)
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)
        if event != "record":
            self.status_events += 1
            self.changed.set()  # records change no host's state: the supervisor need not wake for each

    def close_listeners(self) -> None:
        for queue in self._listeners:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
        self._listeners.clear()

    # -- views ------------------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.state in _ACTIVE

    @property
    def partial(self) -> bool:
        return any(view.state != "ended" for view in self.hosts.values()) and not self.active

    def start_spread_ns(self) -> int | None:
        skews = [v.start_skew_ns for v in self.hosts.values() if v.start_skew_ns is not None]
        return max(skews) - min(skews) if skews else None

    def host_states(self) -> dict[str, dict[str, Any]]:
        return {host: view.to_json() for host, view in self.hosts.items()}

    def live_json(self) -> bytes:
        """The running session as JSON, serialised again only when a record or a status came in since."""
        version = (self.merged.records, self.status_events, self.state)
        if self._live_cache is None or self._live_cache[0] != version:
            self._live_cache = (version, json.dumps(self.snapshot(timeline=True)).encode())
        return self._live_cache[1]

    def snapshot(self, timeline: bool) -> dict[str, Any]:
        spread = self.start_spread_ns()
        body: dict[str, Any] = {
            "id": self.id,
            "user": self.spec.user,
            "diagnostic": self.spec.diagnostic,
            "config": self.spec.config,
            "duration": self.spec.duration,
            "scope": self.spec.scope.to_json(),
            "state": self.state,
            "created": _iso(self.created_ns),
            "t0": _iso(self.t0_ns),
            "ended": _iso(self.ended_ns),
            "start_spread_ms": None if spread is None else spread / 1e6,
            "hosts": self.host_states(),
            "partial": self.partial,
            "verdicts": self.verdicts,
            "timeline_length": sum(view.records for view in self.hosts.values()),
            "timeline_dropped": self.merged.dropped_entries,
        }
        if timeline:
            body["timeline"] = self.merged.timeline()
        return body


def session_result(state: str, partial: bool) -> str:
    """A finished session in one word: `partial` when it ended with some host not ended (failed, rejected),
    else its state (`ended`, `failed` when no host ended, `cancelled`)."""
    return "partial" if state == "ended" and partial else state


def _interrupted(body: dict[str, Any]) -> dict[str, Any]:
    """A session the history says is still running, read by a controller that does not run it: the
    controller that did stopped mid-session (the agents ended it at its deadline on their own)."""
    if body.get("state") not in _ACTIVE:
        return body
    return {
        **body,
        "state": _INTERRUPTED,
        "partial": True,
        "reason": "the controller stopped during the session; each agent ended it at its own deadline",
    }


def _with_statuses(body: dict[str, Any], messages: Iterable[Msg]) -> dict[str, Any]:
    """An interrupted session's hosts, each with the last status its agent published (kept by the server
    while no controller listened). A host the controller had already decided keeps that decision, as live."""
    hosts = {host: dict(view) for host, view in (body.get("hosts") or {}).items() if isinstance(view, dict)}
    session_id = body.get("id")
    for message in messages:
        parsed = parse_session_subject(message.subject)
        if parsed is None or parsed[0] != session_id or parsed[1] not in hosts:
            continue
        sender = parsed[1]
        try:
            status = HostStatus.from_json(decode(message.data, "status"))
        except ProtocolError:
            continue
        view = hosts[sender]
        if status.host != sender or status.session != session_id or view.get("state") in _FINAL:
            continue  # the subject names the sender; a body that disagrees is not believed here either
        view.update(state=status.state, reason=status.reason, totals=dict(status.totals), lost=status.lost,
                    sampled=status.sampled)  # fmt: skip
        if status.start_skew_ns is not None:
            view["start_skew_ns"] = status.start_skew_ns
    return {**body, "hosts": hosts}


def listing_entry(body: dict[str, Any]) -> dict[str, Any]:
    """A session for lists: no timeline, and the verdicts counted rather than included."""
    entry = {key: value for key, value in body.items() if key not in ("timeline", "verdicts")}
    entry["verdicts_count"] = len(body.get("verdicts") or [])
    return entry


class SessionManager:
    def __init__(
        self,
        nc: NatsClient,
        js: JetStreamContext,
        config: SessionsConfig,
        signing_key: Ed25519PrivateKey,
        key_id: str,
        audit: AuditLog,
        hostnames: Callable[[], dict[str, str]],
        netns_owners: Callable[[Iterable[str]], dict[str, str]] | None = None,
        run_ids: Callable[[Iterable[str]], dict[str, str]] | None = None,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self._nc = nc
        self._js = js
        self._config = config
        self._key = signing_key
        self._key_id = key_id
        self._audit = audit
        self._hostnames = hostnames
        self._netns_owners = netns_owners
        self._run_ids = run_ids
        self.metrics = metrics or ControllerMetrics()
        self._sessions: OrderedDict[str, FleetSession] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- queries ----------------------------------------------------------------------------------------
    def active_count(self, user: str) -> int:
        return sum(1 for s in self._sessions.values() if s.spec.user == user and s.active)

    def get_live(self, session_id: str) -> FleetSession | None:
        return self._sessions.get(session_id)

    async def get(self, session_id: str) -> dict[str, Any] | None:
        found = await self.get_json(session_id)
        if found is None:
            return None
        body: dict[str, Any] = json.loads(found[1])
        return body

    async def get_json(self, session_id: str, timeline: bool = True) -> tuple[str, bytes] | None:
        """(owner, the whole session as JSON): from memory, or from the history stream once forgotten. An
        ended session is serialised once, however often clients poll it; without the timeline (a client
        polling for the state) it costs nothing that grows with the records."""
        live = self._sessions.get(session_id)
        if live is not None:
            if not timeline:
                return live.spec.user, json.dumps(live.snapshot(timeline=False)).encode()
            if live.final_json is not None:
                return live.spec.user, live.final_json
            return live.spec.user, live.live_json()
        for kind in ("full", "summary"):  # an interrupted session never got its full snapshot
            with contextlib.suppress(Exception):
                message = await self._js.get_last_msg(
                    SESSIONS_STREAM, f"netsleuth.history.{session_id}.{kind}"
                )
                if message.data:
                    body = await self._recovered(json.loads(message.data))
                    return str(body.get("user")), json.dumps(body).encode()
        return None

    async def _recovered(self, body: dict[str, Any]) -> dict[str, Any]:
        """A session from the history: if a controller stopped during it, each host's final status."""
        body = _interrupted(body)
        if body.get("state") != _INTERRUPTED or not isinstance(body.get("id"), str):
            return body
        try:
            statuses = await read_stream(
                self._js, STATUS_STREAM, f"netsleuth.session.{body['id']}.*.status", last_per_subject=True
            )
        except Exception as error:  # the statuses are a bonus: the session reads back without them
            _log.warning("session %s: statuses not read back: %s", body["id"], error)
            return body
        return _with_statuses(body, statuses)

    async def listing(self, user: str | None) -> list[dict[str, Any]]:
        """Newest first; `user` None: everyone's."""
        found: dict[str, dict[str, Any]] = {}
        with contextlib.suppress(Exception):
            for message in await read_stream(
                self._js, SESSIONS_STREAM, "netsleuth.history.*.summary", last_per_subject=True
            ):
                body = json.loads(message.data)
                if isinstance(body, dict) and isinstance(body.get("id"), str):
                    found[body["id"]] = await self._recovered(body)
        for session in self._sessions.values():
            found[session.id] = listing_entry(session.snapshot(timeline=False))
        sessions = [s for s in found.values() if user is None or s.get("user") == user]
        sessions.sort(key=lambda s: str(s.get("created") or ""), reverse=True)
        return sessions

    # -- lifecycle --------------------------------------------------------------------------------------
    def new_id(self) -> str:
        return secrets.token_hex(8)

    async def start(self, session_id: str, spec: SessionSpec) -> FleetSession:
        """Creates the session and starts it in the background (the caller has authorised and audited it)."""
        hostnames = self._hostnames()
        owners = self._netns_owners(spec.hosts) if self._netns_owners is not None else {}
        runs = self._run_ids(spec.hosts) if self._run_ids is not None else {}
        session = FleetSession(session_id, spec, hostnames, self._config.max_timeline, owners, runs)
        self._sessions[session_id] = session
        self._forget_old()
        # Subscribed before any task goes out: a fast agent's "ready" cannot arrive before we listen.
        subscription = await self._nc.subscribe(session_subjects(session_id), cb=self._on_message(session))
        await self._save(session)
        task = asyncio.create_task(self._run(session, subscription), name=f"session-{session_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return session

    def _forget_old(self) -> None:
        ended = [sid for sid, s in self._sessions.items() if not s.active]
        for session_id in ended[: max(0, len(self._sessions) - _KEPT_IN_MEMORY)]:
            del self._sessions[session_id]

    async def cancel(self, session: FleetSession) -> None:
        session.cancel_requested = True
        await self._send_control(
            session, [h for h, v in session.hosts.items() if v.state not in _FINAL], "cancel"
        )
        session.changed.set()

    def resync(self) -> None:
        """NATS is back (the controller's server died, or the connection dropped): what the hosts said
        meanwhile was stored by the streams; every running session reads it back."""
        for session in list(self._sessions.values()):
            if session.active:
                task = asyncio.create_task(self._resync(session), name=f"resync-{session.id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _resync(self, session: FleetSession, patience: float = 15.0) -> None:
        give_up = time.monotonic() + patience
        while session.active:
            try:
                await self._replay(session, statuses=True, records=True)
                _log.info("session %s: read back what came while NATS was away", session.id)
                return
            except Exception as error:  # JetStream not ready yet (a stream electing its leader)
                if time.monotonic() > give_up:
                    _log.warning("session %s: not read back after reconnecting: %s", session.id, error)
                    return
            await asyncio.sleep(0.5)

    async def _replay(self, session: FleetSession, statuses: bool, records: bool) -> None:
        """What the streams kept of this session, through the handler of live messages: the same checks of
        subject against body, each record batch merged once, no host's state taken back."""
        handle = self._on_message(session, replayed=True)
        if statuses:
            for message in await read_stream(
                self._js, STATUS_STREAM, f"netsleuth.session.{session.id}.*.status", last_per_subject=True
            ):
                await handle(message)
        if records:
            async for messages in stream_batches(
                self._js, RECORDS_STREAM, f"netsleuth.session.{session.id}.*.records"
            ):
                for message in messages:
                    await handle(message)

    async def _reconcile(self, session: FleetSession) -> None:
        """Before the verdicts: record batches the hosts say they sent that did not come live (the
        controller's server died, or a batch was resent after the host's end) are read from the stream,
        waiting a little for resends still on their way; what stays missing is counted in batch_gaps."""
        give_up = time.monotonic() + _RECONCILE_S
        while any(view.batch_gaps for view in session.hosts.values()):
            with contextlib.suppress(Exception):
                await self._replay(session, statuses=False, records=True)
            if not any(view.batch_gaps for view in session.hosts.values()) or time.monotonic() > give_up:
                return
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- messages from agents -------------------------------------------------------------------------
    def _on_message(self, session: FleetSession, replayed: bool = False) -> Callable[[Msg], Any]:
        """The handler of a session's messages, live (its subscription) or `replayed` from the streams that
        keep them (counted refusals are the live ones: a replay must not count a message twice)."""

        async def handle(message: Msg) -> None:
            parsed = parse_session_subject(message.subject)
            parts = message.subject.split(".")
            sender = parts[3] if len(parts) > 3 else "?"
            if parsed is None or parsed[2] not in ("status", "records"):
                what = f"a message on {message.subject}, which is neither a status nor records"
                await self._refuse(session, sender, "other", "unknown_kind", what, replayed)
                return
            _session_id, sender, kind = parsed
            on = f"a {'status' if kind == 'status' else 'record batch'} on host {sender}'s subject"
            if sender not in session.hosts:
                await self._refuse(
                    session, sender, kind, "not_in_session", f"{on}, which is not in this session", replayed
                )
                return
            try:
                body = decode(message.data, f"{kind} message")
                received = HostStatus.from_json(body) if kind == "status" else RecordBatch.from_json(body)
            except ProtocolError as error:
                what = f"a malformed message ({on}): {error}"
                await self._refuse(session, sender, kind, "malformed", what, replayed)
                return
            # The subject says who sent it (only that host's agent may publish there); the body may not say
            # otherwise.
            if received.host != sender:
                what = f"{on} that names host {received.host!r}"
                await self._refuse(session, sender, kind, "other_host", what, replayed)
            elif received.session != session.id:
                what = f"{on} that names session {received.session!r}"
                await self._refuse(session, sender, kind, "other_session", what, replayed)
            elif isinstance(received, HostStatus):
                self._on_status(session, sender, received)
            else:
                self._on_records(session, sender, received)

        return handle

    async def _refuse(
        self, session: FleetSession, sender: str, kind: str, reason: str, what: str, replayed: bool = False
    ) -> None:
        """Count every refused message; log and audit the first of each (sender, kind, reason) per session."""
        if replayed:
            return
        self.metrics.refused(kind, reason)
        view = session.hosts.get(sender)
        if view is not None:
            view.refused += 1
        key = (sender, kind, reason)
        if key in session.refusals_recorded:
            return
        session.refusals_recorded.add(key)
        _log.warning("session %s: refused %s (further ones from it are only counted)", session.id, what)
        with contextlib.suppress(AuditUnavailable):
            await self._audit.record(
                user=session.spec.user,
                action="message.refused",
                decision="deny",
                reason=f"refused {what}: a message belongs to the host whose subject it came on",
                session=session.id,
                diagnostic=session.spec.diagnostic,
                hosts=[sender],
                outcome="refused",
                extra={"kind": kind, "why": reason},
            )

    def _on_status(self, session: FleetSession, sender: str, status: HostStatus) -> None:
        view = session.hosts[sender]
        if view.state in _FINAL:
            return  # already decided (a late "ended" after we failed it changes nothing)
        if _RANK.get(status.state, 0) < _RANK.get(view.state, 0):
            return  # an older status, read back from the stream after a newer one came
        view.sent, view.batches_sent = status.events, max(view.batches_sent, status.batches)
        view.state = status.state
        view.reason = status.reason
        view.totals = dict(status.totals)
        view.lost, view.sampled = status.lost, status.sampled
        if status.start_skew_ns is not None:
            view.start_skew_ns = status.start_skew_ns
        view.missed_pings = 0
        view.unreachable_since = None
        view.last_seen = time.monotonic()
        view.progressed.set()
        session.emit("status", {"host": sender, **view.to_json()})

    def _on_records(self, session: FleetSession, sender: str, batch: RecordBatch) -> None:
        view = session.hosts[sender]
        if batch.seq in view.seqs:
            return  # already merged: sent again by the agent, or read back from the stream
        view.seqs.add(batch.seq)
        view.missed_pings = 0
        view.unreachable_since = None
        view.last_seen = time.monotonic()
        for record in batch.records:
            view.records += 1
            for entry in session.merged.add(sender, record):
                session.emit("record", entry)

    # -- orchestration ----------------------------------------------------------------------------------
    async def _run(self, session: FleetSession, subscription: Any) -> None:
        try:
            await self._prepare_all(session)
            ready = [host for host, view in session.hosts.items() if view.state == "ready"]
            _log.info(
                "session %s: %d of %d hosts ready %.3f s after creation",
                session.id, len(ready), len(session.hosts), (time.time_ns() - session.created_ns) / 1e9,
            )  # fmt: skip
            if ready and not session.cancel_requested:
                t0 = time.time_ns() + int(self._config.start_margin * 1e9)
                session.t0_ns = t0
                session.state = "running"
                await asyncio.gather(*(self._start(session, host, t0) for host in ready))
                session.emit("session", session.snapshot(timeline=False))
                await self._supervise(session, t0 + int(session.spec.duration * 1e9))
        except asyncio.CancelledError:
            # The controller is stopping (a restart, an upgrade): the agents end the session at its deadline
            # on their own and their statuses are kept by the server, so the hosts are not failed here; the
            # controller that reads it back shows each host's end (_recovered).
            session.interrupted = True
            raise
        except Exception as error:  # a bug must end the session visibly, not hang it
            _log.exception("session %s", session.id)
            for view in session.hosts.values():
                if view.state not in _FINAL:
                    view.state, view.reason = "failed", f"controller error: {error}"
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
            await self._finish(session)

    async def _request(self, subject: str, data: bytes, timeout: float) -> Msg:
        """A request to an agent; "no responders" is believed only when it lasts _GONE_S (an agent whose
        server of the cluster just died is back on another within a second)."""
        give_up = time.monotonic() + _GONE_S
        while True:
            try:
                return await self._nc.request(subject, data, timeout=timeout)
            except NoRespondersError:
                if time.monotonic() >= give_up:
                    raise
            await asyncio.sleep(0.25)

    async def _measure_offset(self, host: str, view: HostView, samples: int | None = None) -> None:
        best: tuple[int, int] | None = None  # (rtt, offset)
        for _ in range(_PINGS if samples is None else samples):
            sent = time.time_ns()
            reply = await self._request(ping_subject(host), b"{}", timeout=self._config.prepare_timeout)
            received = time.time_ns()
            wall = PingReply.from_json(decode(reply.data, "ping reply")).wall_ns
            rtt = received - sent
            offset = wall - (sent + received) // 2
            if best is None or rtt < best[0]:
                best = (rtt, offset)
        assert best is not None
        view.rtt_ns, view.offset_ns = best

    async def _prepare_all(self, session: FleetSession) -> None:
        """Every host's task first, then the clock pings, all concurrently: the tasks are what the agents
        need to start loading, and the offsets are needed only at T0. (Tasks created in this order run
        their first steps in this order, so 1,000 tasks leave before the first ping.)"""
        hosts = session.spec.hosts
        dispatches = [asyncio.create_task(self._dispatch(session, host)) for host in hosts]
        clocks = [asyncio.create_task(self._clock(session, host)) for host in hosts]
        await asyncio.gather(*dispatches, *clocks)
        failed = [host for host in hosts if session.hosts[host].state == "failed"]
        await self._send_control(session, failed, "cancel")  # a failed host may have attached meanwhile

    async def _clock(self, session: FleetSession, host: str) -> None:
        view = session.hosts[host]
        try:
            large = len(session.hosts) > _LARGE_SESSION
            await self._measure_offset(host, view, _PINGS_LARGE if large else _PINGS)
        except NoRespondersError:
            self._fail(session, host, "the agent is not connected (nobody answers on its subjects)")
            return
        except (NatsTimeoutError, TimeoutError):
            self._fail(session, host, "the agent did not answer the clock ping")
            return
        except ProtocolError as error:
            self._fail(session, host, f"bad ping reply: {error}")
            return
        session.merged.set_offset(host, view.offset_ns or 0)

    async def _dispatch(self, session: FleetSession, host: str) -> None:
        view = session.hosts[host]
        spec = session.spec
        now = time.time()
        task = Task(
            id=new_task_id(),
            session=session.id,
            host=host,
            diagnostic=spec.diagnostic,
            config=spec.config,
            scope=spec.scope,
            issued_at=now,
            # Valid only for the prepare phase: a task captured off the wire is useless minutes later, and
            # the agent forgets its id (replay memory) at this moment.
            expires_at=now + self._config.prepare_timeout + 30.0,
            deadline_s=spec.duration,
            budgets=Budgets(),
            user=spec.user,
            run_id=session.runs.get(host, ""),  # a replay to a later run of the agent is refused
            stored=True,  # NETSLEUTH_STATUS and NETSLEUTH_RECORDS keep what it sends: wait for their acks
        )
        view.task_id = task.id
        signed = SignedTask.sign(task, self._key, self._key_id)
        try:
            reply_message = await self._request(
                task_subject(host), signed.encode(), timeout=self._config.prepare_timeout
            )
            reply = TaskReply.from_json(decode(reply_message.data, "task reply"))
        except NoRespondersError:
            self._fail(session, host, "the agent is not connected (nobody answers on its subjects)")
            return
        except (NatsTimeoutError, TimeoutError):
            self._fail(
                session, host, f"the agent did not answer the task within {self._config.prepare_timeout:g} s"
            )
            await self._send_control(session, [host], "cancel")
            return
        except ProtocolError as error:
            self._fail(session, host, f"bad task reply: {error}")
            return
        if not reply.accepted:
            view.state, view.reason = "rejected", reply.reason or "refused"
            session.emit("status", {"host": host, **view.to_json()})
            with contextlib.suppress(AuditUnavailable):
                await self._audit.record(
                    user=spec.user,
                    action="task.rejected",
                    decision="deny",
                    reason=view.reason,
                    session=session.id,
                    diagnostic=spec.diagnostic,
                    hosts=[host],
                    scope=spec.scope.to_json(),
                    outcome="rejected by the agent",
                    extra={"task_id": task.id, "source": "controller"},
                )
            return
        deadline = time.monotonic() + self._config.prepare_timeout
        while view.state == "preparing" and time.monotonic() < deadline and not session.cancel_requested:
            view.progressed.clear()
            with contextlib.suppress(TimeoutError):
                # Woken by this host's next status (or a cancel, within half a second).
                await asyncio.wait_for(
                    view.progressed.wait(), timeout=min(0.5, max(0.01, deadline - time.monotonic()))
                )
        if view.state == "preparing":
            self._fail(session, host, f"not ready within {self._config.prepare_timeout:g} s")
            await self._send_control(session, [host], "cancel")

    async def _start(self, session: FleetSession, host: str, t0_ns: int) -> None:
        # T0 on the agent's own clock: its wall clock runs offset_ns ahead of ours.
        offset = session.hosts[host].offset_ns or 0
        control = Control(session.id, "start", t0_ns + offset)
        try:
            await self._nc.publish(control_subject(host), control.encode())
        except Exception as error:  # NATS gone: this host cannot start
            self._fail(session, host, f"could not send start: {error}")

    async def _send_control(self, session: FleetSession, hosts: list[str], action: str) -> None:
        for host in hosts:
            with contextlib.suppress(Exception):
                await self._nc.publish(control_subject(host), Control(session.id, "cancel").encode())
        with contextlib.suppress(Exception):
            await self._nc.flush(timeout=2)

    def _fail(self, session: FleetSession, host: str, reason: str) -> None:
        view = session.hosts[host]
        if view.state in _FINAL:
            return
        view.state, view.reason = "failed", reason
        view.progressed.set()
        session.emit("status", {"host": host, **view.to_json()})

    async def _supervise(self, session: FleetSession, deadline_ns: int) -> None:
        """Until every host is final. Beside it, `_watch_liveness` pings the hosts that have gone quiet (a
        dead agent has no responder, which NATS says at once; a hung one misses `host_silence` seconds of
        pings); here, whoever has not reported its end `end_grace` seconds after the deadline (or after a
        cancel) is failed. The loop wakes on every change, so the session ends as the last host does."""
        grace_ns = int(self._config.end_grace * 1e9)
        limit_ns = deadline_ns + grace_ns
        cancelled = False
        liveness = asyncio.create_task(self._watch_liveness(session))
        next_replay_ns = deadline_ns + int(_QUIET_S * 1e9)
        try:
            while True:
                pending = [host for host, view in session.hosts.items() if view.state not in _FINAL]
                if not pending:
                    return
                if time.time_ns() >= next_replay_ns:
                    # Past the deadline and some host has not said it ended: its end may have been stored
                    # while this controller's connection was away.
                    next_replay_ns = time.time_ns() + int(_QUIET_S * 1e9)
                    with contextlib.suppress(Exception):
                        await self._replay(session, statuses=True, records=False)
                    continue
                if session.cancel_requested and not cancelled:
                    cancelled = True
                    limit_ns = min(limit_ns, time.time_ns() + grace_ns)
                if time.time_ns() >= limit_ns:
                    what = "the cancel" if cancelled else "the deadline"
                    for host in pending:
                        self._fail(session, host, f"no end status {self._config.end_grace:g} s after {what}")
                    await self._send_control(session, pending, "cancel")
                    return
                session.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(session.changed.wait(), timeout=0.25)
        finally:
            liveness.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await liveness

    async def _watch_liveness(self, session: FleetSession) -> None:
        last_round: dict[str, float] = {}
        while True:
            await asyncio.sleep(_QUIET_S / 2)
            now = time.monotonic()
            quiet = [
                host
                for host, view in session.hosts.items()
                if view.state not in _FINAL
                and now - view.last_seen >= _QUIET_S
                and (view.unreachable_since is not None or now - last_round.get(host, 0.0) >= _QUIET_S)
            ]
            for host in quiet:
                last_round[host] = now
            # Concurrently, and without holding up the end of the session (_supervise does not await this).
            await asyncio.gather(*(self._liveness(session, host) for host in quiet))

    async def _liveness(self, session: FleetSession, host: str) -> None:
        view = session.hosts[host]
        try:
            await self._nc.request(ping_subject(host), b"{}", timeout=_LIVENESS_S)
            view.missed_pings = 0
            view.unreachable_since = None
            view.last_seen = time.monotonic()
        except NoRespondersError:
            # Nobody is subscribed to the host's subjects: the agent process is gone - or its server died a
            # moment ago and it is reconnecting to another one, which is why one answer is not enough.
            now = time.monotonic()
            if view.unreachable_since is None:
                view.unreachable_since = now
            elif now - view.unreachable_since >= _GONE_S:
                self._fail(session, host, "agent stopped answering (disconnected from NATS)")
        except (NatsTimeoutError, TimeoutError):
            view.missed_pings += 1
            if view.missed_pings * _QUIET_S >= self._config.host_silence:
                self._fail(session, host, f"agent stopped answering ({view.missed_pings} pings unanswered)")
        except Exception:  # NATS itself is down; the deadline will decide
            view.missed_pings += 1

    async def _finish(self, session: FleetSession) -> None:
        """Verdicts, the audit record of the outcome, then the ended state, all before anyone can read the
        session as ended: a client polling for `ended` always finds the verdicts with it."""
        ended_ns = time.time_ns()
        _log.info(
            "session %s: every host final %.3f s after creation",
            session.id,
            (ended_ns - session.created_ns) / 1e9,
        )
        if session.interrupted:
            state = _INTERRUPTED
        elif session.cancel_requested:
            state = "cancelled"
        else:
            state = "ended" if any(view.state == "ended" for view in session.hosts.values()) else "failed"
        partial = any(view.state != "ended" for view in session.hosts.values())
        if not session.interrupted:
            await self._reconcile(session)
        session.verdicts = session.merged.verdicts(session.host_states())
        outcome = ", ".join(f"{host}: {view.state}" for host, view in session.hosts.items())
        with contextlib.suppress(AuditUnavailable):
            await self._audit.record(
                patience=0 if session.interrupted else 30,  # the end happened: worth a leader election
                user=session.spec.user,
                action="session.end",
                decision="allow",
                session=session.id,
                diagnostic=session.spec.diagnostic,
                hosts=list(session.spec.hosts),
                scope=session.spec.scope.to_json(),
                outcome=f"{state}{' (partial)' if partial else ''}; {outcome}",
                extra={
                    # What came of it, as one word (ended, partial, failed, cancelled): an end is no decision,
                    # and its "allow" says nothing about the hosts that failed.
                    "result": session_result(state, partial),
                    "host_states": {
                        h: {"state": v.state, "reason": v.reason} for h, v in session.hosts.items()
                    },
                },
            )
        # No await from here to final_json: readers see either the running session or the finished one.
        session.state, session.ended_ns = state, ended_ns
        body = session.snapshot(timeline=True)
        session.final_json = json.dumps(body).encode()
        for verdict in session.verdicts:
            session.emit("verdict", verdict)
        ending = ("id", "state", "partial", "hosts", "start_spread_ms")
        session.emit("end", {key: body[key] for key in ending})
        session.close_listeners()
        session.done.set()
        _log.info(
            "session %s %s: %d records merged, %d verdicts, published %.3f s after creation",
            session.id, state, session.merged.records, len(session.verdicts),
            (time.time_ns() - session.created_ns) / 1e9,
        )  # fmt: skip
        await self._save(session, body, session.final_json)

    async def _save(
        self, session: FleetSession, body: dict[str, Any] | None = None, data: bytes | None = None
    ) -> None:
        """History: a small summary (for listing) and, at the end, the whole session (for reading back),
        each under NATS's message size: a big session keeps its first records and verdicts there, and says
        how many it left out (the whole of it stays in memory for the last sessions)."""
        summary = listing_entry(body or session.snapshot(timeline=False))
        try:
            await self._js.publish(f"netsleuth.history.{session.id}.summary", json.dumps(summary).encode())
            if body is not None and data is not None:
                for key in ("timeline", "verdicts"):
                    items, keep = body[key], len(body[key])
                    while len(data) > _HISTORY_BYTES and keep > 0:
                        keep //= 2
                        body = {**body, key: items[:keep], f"{key}_truncated": len(items) - keep}
                        data = json.dumps(body).encode()
                await self._js.publish(f"netsleuth.history.{session.id}.full", data)
        except Exception as error:  # history is best effort; the audit is not
            _log.warning("session %s: history not saved: %s", session.id, error)
