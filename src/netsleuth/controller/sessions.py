"""Running one diagnostic on many hosts at the same moment, over NATS - from any of several controllers.

For each session: subscribe to every host's status and records first (nothing can be missed), then per host
in parallel send the signed, time-limited task (prepare: the agent verifies, loads and attaches, then
reports ready) and measure its clock offset (pings, NTP-style, best by round trip). Once every host is
ready or has failed, pick T0 = now + margin and send `start` to each ready host with T0 expressed on that
host's own clock, so all of them watch the same window. Then collect, ping the hosts that went quiet (one
that stops answering is failed while the others go on), and end each host that has not reported its end
`end_grace` seconds after the deadline. The agents enforce the deadline themselves too: a controller that
dies mid-session leaves nothing attached anywhere.

Several controllers share the sessions through JetStream only (session_store.py): the session's spec, T0
and the hosts' clock offsets, the hosts the controller decided itself, a cancel asked of any controller,
and the ended session; what the hosts said is in NETSLEUTH_STATUS and NETSLEUTH_RECORDS. One controller
runs each session, the one holding its lease (leases.py: a JetStream KV key with a max age, taken by
compare-and-set); when it dies the lease runs out on the server's clock and another controller takes the
session over - it reads all of the above back, sends `start` again where it may not have arrived, waits
for the hosts' ends and merges every record batch from the stream. Any other controller asked about a
running session follows it for its reader: the same state, read back and then kept up from the same
subjects, without deciding anything (`owned` False).

A status or record batch belongs to the host whose subject it came on (`netsleuth.session.<id>.<host>.*`,
which only that host's agent may publish on): a body naming another host or session, a host that is not in
the session, or a malformed message is refused - counted (on the sender's view and in
netsleuth_controller_refused_messages_total), logged and audited once per sender, kind and reason (a flood
of them costs one log line and one audit record, not one each).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, cast

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from netsleuth.controller import full_collections
from netsleuth.controller.audit import AuditLog, AuditUnavailable
from netsleuth.controller.config import SessionsConfig
from netsleuth.controller.fleet_session import (
    ACTIVE,
    FINAL,
    FleetSession,
    HostView,
    SessionSpec,
    session_result,
)
from netsleuth.controller.leases import LeaseLost, Leases
from netsleuth.controller.metrics import ControllerMetrics
from netsleuth.controller.session_index import SessionIndex
from netsleuth.controller.session_store import SessionStore, StoredSpec, StoredT0, history_subject, summary_of
from netsleuth.controller.streams import read_stream, stream_batches
from netsleuth.fleet.protocol import (
    RECORDS_STREAM,
    STATUS_STREAM,
    Budgets,
    Control,
    HostStatus,
    PingReply,
    ProtocolError,
    RecordBatch,
    SignedTask,
    Task,
    TaskReply,
    control_subject,
    decode,
    new_task_id,
    parse_session_subject,
    ping_subject,
    session_subjects,
    status_subject,
    task_subject,
)

__all__ = ["FleetSession", "HostView", "SessionManager", "SessionSpec", "listing_entry", "session_result"]

_log = logging.getLogger("netsleuth.controller")
# A host's states in the order they happen: a status read back from the stream after a newer one came live
# (a resync) must not take the host back.
_RANK = {"preparing": 0, "ready": 1, "running": 2, "ended": 3, "failed": 3, "rejected": 3}
# At the end, how long to wait for record batches a host sent but we lack: its outbox resends one only after
# the dead server's ack timeout (fleet/outbox.py ACK_TIMEOUT_S, 3 s) and a reconnect, so 3 s here gave up on
# batches still on their way on a busy machine (2 gaps in a cluster test). Only a session with a gap waits.
_RECONCILE_S = 10.0
_INTERRUPTED = "interrupted"  # a session of an older controller that stopped before it ended
_PINGS = 3  # clock samples per host, the one with the shortest round trip wins ...
_PINGS_LARGE = 1  # ... but one for large sessions: 3 x 1,000 round trips would delay T0 by a second
_LARGE_SESSION = 50
_LIVENESS_S = 1.0  # ping timeout
_QUIET_S = 2.0  # a host silent this long is pinged (a dead one answers "no responders" at once)
# ... but a live agent whose nats-server just died has no responder either until it reconnects to another
# server of the cluster (well under a second): it is failed only when nobody answers for this long.
_GONE_S = 3.0
_PREPARE_WINDOW = 256  # hosts being sent their task and pinged at once; the others wait their turn
_SIGN_BATCH = 64  # tasks signed (or starts sent) between two turns of the event loop
_PINGS_PER_ROUND = 256  # liveness pings per second at most: a 10,000-host window must not be a ping storm
_KEPT_IN_MEMORY = 200  # ended sessions kept for fast reads; older ones are read from the history stream
_ORPHAN_SCAN_S = 1.0  # how often a controller looks for running sessions whose controller's lease ran out
_STORE_PATIENCE_S = 3600.0  # how long an ended session's audit record and result are tried (no quorum)


def listing_entry(body: dict[str, Any]) -> dict[str, Any]:
    """A session for lists: no timeline, the verdicts counted rather than included, big host sets capped."""
    return summary_of(body)


def _interrupted(body: dict[str, Any]) -> dict[str, Any]:
    """A session an older controller left running in the history (it kept no spec to take it over from):
    it stopped mid-session, and the agents ended it at its deadline on their own."""
    if body.get("state") not in ACTIVE:
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
        if status.host != sender or status.session != session_id or view.get("state") in FINAL:
            continue  # the subject names the sender; a body that disagrees is not believed here either
        view.update(state=status.state, reason=status.reason, totals=dict(status.totals), lost=status.lost,
                    sampled=status.sampled)  # fmt: skip
        if status.start_skew_ns is not None:
            view["start_skew_ns"] = status.start_skew_ns
    return {**body, "hosts": hosts}


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
        *,
        store: SessionStore,
        leases: Leases,
        index: SessionIndex,
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
        self._store = store
        self._leases = leases
        self._index = index
        self._sessions: OrderedDict[str, FleetSession] = OrderedDict()
        self._subscriptions: dict[str, list[Subscription]] = {}
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._following: dict[str, asyncio.Future[FleetSession | None]] = {}
        self._results: OrderedDict[str, tuple[str, bytes, bytes]] = (
            OrderedDict()
        )  # id -> user, json, no timeline
        self._tasks: set[asyncio.Task[Any]] = set()

    def _background(self, coroutine: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start_background(self) -> None:
        """Take over the running sessions whose controller's lease runs out (one that died or stopped)."""
        self._background(self._watch_orphans(), "orphan-sessions")

    # -- queries ----------------------------------------------------------------------------------------
    def active_count(self, user: str) -> int:
        """The user's running sessions on every controller (the index), and here (not yet in the index)."""
        running = {s["id"] for s in self._index.active() if s.get("user") == user}
        running |= {s.id for s in self._sessions.values() if s.spec.user == user and s.active}
        return len(running)

    def get_live(self, session_id: str) -> FleetSession | None:
        return self._sessions.get(session_id)

    async def _held(self, session_id: str) -> FleetSession | None:
        """The session in memory (run or followed here), or another controller's running one (followed from
        now on); None: ended elsewhere, or unknown."""
        live = self._sessions.get(session_id)
        if live is None:
            summary = self._index.get(session_id) or await self._store.summary(session_id)
            if summary is not None and summary.get("state") in ACTIVE:
                live = await self._follow(session_id)
        return live

    async def running(self, session_id: str) -> FleetSession | None:
        """A running session, whichever controller runs it (so it can be cancelled here); None when it
        ended or is unknown."""
        live = await self._held(session_id)
        return live if live is not None and live.active else None

    def has_ended(self, session_id: str) -> bool:
        """Whether the session ended: held here (run or followed), or its summary in the index says so."""
        live = self._sessions.get(session_id)
        if live is not None:
            return not live.active
        summary = self._index.get(session_id)
        return summary is not None and summary.get("state") not in ACTIVE

    async def get(self, session_id: str) -> dict[str, Any] | None:
        found = await self.get_json(session_id)
        if found is None:
            return None
        body: dict[str, Any] = json.loads(found[1])
        return body

    async def get_json(self, session_id: str, timeline: bool = True) -> tuple[str, bytes] | None:
        """(owner, the whole session as JSON): from memory (run or followed here), a running session of
        another controller (followed from now on), or the ended session from the store. An ended session is
        serialised once, however often clients poll it; without the timeline (a client polling for the
        state) it costs nothing that grows with the records."""
        live = await self._held(session_id)
        if live is not None:
            if not timeline:
                return live.spec.user, orjson.dumps(live.snapshot(timeline=False))
            if live.final_json is not None:
                return live.spec.user, live.final_json
            return live.spec.user, live.live_json()
        return await self._ended(session_id, timeline)

    async def get_summary(self, session_id: str) -> tuple[str, bytes] | None:
        """(owner, the session as a listing shows it): hosts capped and counted by state, no timeline."""
        live = self._sessions.get(session_id)
        if live is not None:
            return live.spec.user, orjson.dumps(live.summary())
        summary = await self._store.summary(session_id)
        if summary is None or summary.get("state") in ACTIVE:
            found = await self.get_json(session_id, timeline=False)  # followed from now on, or an older one's
            return None if found is None else (found[0], orjson.dumps(listing_entry(json.loads(found[1]))))
        return str(summary.get("user")), json.dumps(summary).encode()

    async def _ended(self, session_id: str, timeline: bool) -> tuple[str, bytes] | None:
        """An ended session from the store (kept here for the next reader), or an older controller's."""
        cached = self._results.get(session_id)
        if cached is None:
            data = await self._store.result(session_id)
            if data is not None:
                body = json.loads(data)
                without = orjson.dumps({k: v for k, v in body.items() if k != "timeline"})
                cached = (str(body.get("user")), data, without)
                self._results[session_id] = cached
                while len(self._results) > 20:
                    self._results.popitem(last=False)
        if cached is not None:
            return cached[0], cached[1] if timeline else cached[2]
        for body in (await self._store.legacy(session_id), await self._store.summary(session_id)):
            if body is not None:
                body = await self._recovered(body)
                return str(body.get("user")), json.dumps(body).encode()
        return None

    async def _recovered(self, body: dict[str, Any]) -> dict[str, Any]:
        """A session from an older controller's history: if it stopped during it, each host's last status."""
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
        """Newest first; `user` None: everyone's. Every controller's sessions (the index), the ones held
        here as they are now."""
        found = {summary["id"]: summary for summary in self._index.all()}
        for session in self._sessions.values():
            found[session.id] = session.summary()
        sessions = [s for s in found.values() if user is None or s.get("user") == user]
        sessions.sort(key=lambda s: str(s.get("created") or ""), reverse=True)
        return sessions

    # -- lifecycle --------------------------------------------------------------------------------------
    def new_id(self) -> str:
        return secrets.token_hex(8)

    def _new_session(
        self, session_id: str, spec: SessionSpec, owned: bool, created_ns: int | None
    ) -> FleetSession:
        hostnames = self._hostnames()
        owners = self._netns_owners(spec.hosts) if self._netns_owners is not None else {}
        runs = self._run_ids(spec.hosts) if self._run_ids is not None else {}
        session = FleetSession(
            session_id, spec, hostnames, self._config.max_timeline, owners, runs, created_ns, owned
        )
        self._sessions[session_id] = session
        self._forget_old()
        return session

    async def start(self, session_id: str, spec: SessionSpec) -> FleetSession:
        """Creates the session and starts it in the background (the caller has authorised and audited it):
        its spec and summary are stored and its lease taken before any host hears of it."""
        session = self._new_session(session_id, spec, owned=True, created_ns=None)
        # Subscribed before any task goes out: a fast agent's "ready" cannot arrive before we listen.
        await self._subscribe(session)
        await self._store.save_spec(StoredSpec(session_id, spec, session.created_ns))
        if not await self._leases.take(session_id):
            raise RuntimeError(f"session {session_id}: its lease is already taken")
        await self._save_summary(session)
        self._runs[session_id] = self._background(self._run(session), f"session-{session_id}")
        return session

    def _forget_old(self) -> None:
        ended = [sid for sid, s in self._sessions.items() if not s.active]
        for session_id in ended[: max(0, len(self._sessions) - _KEPT_IN_MEMORY)]:
            del self._sessions[session_id]

    async def cancel(self, session: FleetSession) -> None:
        """Asked of this controller, whichever runs the session: the hosts are told at once, and the cancel
        is stored, where the controller running it (this one or another) reads it."""
        session.request_cancel()
        await self._send_control(session, [h for h in session.open_hosts], "cancel")
        with contextlib.suppress(Exception):
            await self._store.request_cancel(session.id, session.spec.user)
        session.changed.set()

    async def stop(self) -> None:
        """Stopping (a restart, an upgrade): the sessions run here are left to another controller - their
        leases are given back, nothing is finished or failed; the agents go on to their deadlines."""
        for run in list(self._runs.values()):
            run.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for session_id in list(self._subscriptions):
            await self._unsubscribe(session_id)

    # -- subscriptions ----------------------------------------------------------------------------------
    async def _subscribe(self, session: FleetSession) -> None:
        """The hosts' statuses and records, and what the controllers store about the session."""
        self._subscriptions[session.id] = [
            await self._nc.subscribe(session_subjects(session.id), cb=self._on_message(session)),
            await self._nc.subscribe(history_subject(session.id, ">"), cb=self._on_history(session)),
        ]

    async def _unsubscribe(self, session_id: str) -> None:
        for subscription in self._subscriptions.pop(session_id, []):
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    def resync(self) -> None:
        """NATS is back (the controller's server died, or the connection dropped): what the hosts said
        meanwhile was stored by the streams; every running session held here reads it back."""
        self._index.renew()
        for session in list(self._sessions.values()):
            if session.active:
                self._background(self._resync(session), f"resync-{session.id}")

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

    async def _stored_ends(self, session: FleetSession, at_most: int = 100) -> None:
        handle = self._on_message(session, replayed=True)
        quiet = sorted(session.open_hosts, key=lambda host: session.hosts[host].last_seen)[:at_most]
        for host in quiet:
            with contextlib.suppress(Exception):
                message = await self._js.get_last_msg(STATUS_STREAM, status_subject(session.id, host))
                await handle(cast(Msg, message))

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

    # -- a session another controller started: followed, or taken over ------------------------------------
    async def _rehydrate(self, session: FleetSession) -> None:
        """Everything the store and the streams hold of a session: T0 and the offsets, the hosts the
        controller decided, a cancel, then every host's statuses and record batches."""
        t0 = await self._store.t0(session.id)
        if t0 is not None:
            self._apply_t0(session, t0)
        for host, (state, reason) in (await self._store.decisions(session.id)).items():
            if host in session.hosts:
                session.set_host(host, state, reason)
        session.cancel_requested = await self._store.cancel_requested(session.id)
        await self._replay(session, statuses=True, records=True)

    def _apply_t0(self, session: FleetSession, t0: StoredT0) -> None:
        session.t0_ns = t0.t0_ns
        session.state = "running" if session.state == "preparing" else session.state
        for host, (offset, rtt) in t0.offsets.items():
            view = session.hosts.get(host)
            if view is not None and offset is not None:
                view.offset_ns, view.rtt_ns = offset, rtt
                session.merged.set_offset(host, offset)

    async def _follow(self, session_id: str) -> FleetSession | None:
        """A running session of another controller, for this controller's readers (once per session)."""
        pending = self._following.get(session_id)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._following[session_id] = pending
            try:
                pending.set_result(await self._load(session_id, owned=False))
            except Exception as error:
                _log.warning("session %s: not followed: %s", session_id, error)
                pending.set_result(None)
            finally:
                self._following.pop(session_id, None)
        return await asyncio.shield(pending)

    async def _load(self, session_id: str, owned: bool) -> FleetSession | None:
        spec = await self._store.spec(session_id)
        if spec is None:
            return None
        session = self._new_session(session_id, spec.request, owned=owned, created_ns=spec.created_ns)
        await self._subscribe(session)
        await self._rehydrate(session)
        return session

    async def _watch_orphans(self) -> None:
        while True:
            await asyncio.sleep(_ORPHAN_SCAN_S)
            for summary in self._index.active():
                session_id = str(summary.get("id"))
                held = self._sessions.get(session_id)
                if held is not None and held.owned:
                    continue
                with contextlib.suppress(Exception):
                    if await self._leases.take(session_id):
                        await self._adopt(session_id, held)

    async def _adopt(self, session_id: str, followed: FleetSession | None) -> None:
        """This controller holds the lease of a session whose controller stopped or died: run it from where
        it is (checked against the stream's leader: the index may be behind)."""
        try:
            summary = await self._store.summary(session_id)
            if summary is None or summary.get("state") not in ACTIVE:
                if summary is not None:
                    self._index.note(summary)
                await self._leases.release(session_id)
                return
            if await self._store.spec(session_id) is None:
                # An older controller's session (no spec to run it from): written down as interrupted.
                body = summary_of(await self._recovered(summary))
                await self._store.save_summary(body)
                self._index.note(body)
                await self._leases.release(session_id)
                return
            session = followed if followed is not None else await self._load(session_id, owned=True)
            if session is None:
                await self._leases.release(session_id)
                return
            session.owned = True
            session.taken_over = True
            self.metrics.taken_over.inc()
            _log.warning(
                "session %s: taken over (its controller's lease ran out: it stopped or died); %s",
                session_id, "T0 was set" if session.t0_ns else "it was preparing",
            )  # fmt: skip
            self._runs[session_id] = self._background(self._run(session), f"session-{session_id}")
        except Exception as error:
            _log.warning("session %s: not taken over: %s", session_id, error)
            await self._leases.release(session_id)

    def _on_history(self, session: FleetSession) -> Callable[[Msg], Any]:
        """What controllers store about the session as it is written: the running one reads the cancels
        asked of others; a follower also T0, the controller's decisions and the end."""

        async def handle(message: Msg) -> None:
            part = message.subject[len(history_subject(session.id, "")) :]
            if part == "cancel":
                if not session.cancel_requested and session.active:
                    session.request_cancel()
                return
            if session.owned:
                return  # its own writes
            try:
                body = json.loads(message.data)
            except ValueError:
                return
            if part == "t0":
                t0 = {str(h): (p[0], p[1]) for h, p in (body.get("offsets") or {}).items()}
                self._apply_t0(session, StoredT0(int(body["t0_ns"]), t0))
                session.emit("session", session.snapshot(timeline=False))
            elif part.startswith("decided.") and part[8:] in session.hosts:
                view = session.set_host(part[8:], str(body.get("state")), str(body.get("reason")))
                session.emit("status", {"host": part[8:], **view.to_json()})
            elif part == "summary" and body.get("state") not in ACTIVE:
                self._background(self._followed_end(session), f"end-{session.id}")

        return handle

    async def _followed_end(self, session: FleetSession) -> None:
        """The controller running a followed session ended it: its readers here get its end as it was."""
        await self._unsubscribe(session.id)
        data: bytes | None = None
        for _attempt in range(20):
            with contextlib.suppress(Exception):
                data = await self._store.result(session.id)
            if data is not None:
                break
            await asyncio.sleep(0.25)
        if data is None:
            _log.warning("session %s: ended by another controller, its result not read", session.id)
            session.state = "ended"
            session.close_listeners()
            session.done.set()
            return
        body = json.loads(data)
        session.state, session.verdicts, session.final_json = (
            str(body.get("state")),
            body.get("verdicts") or [],
            data,
        )
        for verdict in session.verdicts:
            session.emit("verdict", verdict)
        session.emit(
            "end", {key: body.get(key) for key in ("id", "state", "partial", "hosts", "start_spread_ms")}
        )
        session.close_listeners()
        session.done.set()

    async def _keep_lease(self, session: FleetSession, run: asyncio.Task[None]) -> None:
        while True:
            await asyncio.sleep(self._config.lease_seconds / 4)
            try:
                await self._leases.renew(session.id)
            except LeaseLost as lost:
                _log.warning("%s: this controller stops running it", lost)
                run.cancel()
                return
            except Exception as error:  # NATS away: the lease may run out; the next renewal says
                _log.warning("session %s: lease not renewed: %s", session.id, error)

    async def _save_summary(self, session: FleetSession, body: dict[str, Any] | None = None) -> None:
        summary = summary_of(body) if body is not None else session.summary()
        self._index.note(summary)
        try:
            await self._store.save_summary(summary)
        except Exception as error:  # the lease and the spec are what a takeover needs; this is for lists
            _log.warning("session %s: summary not saved: %s", session.id, error)

    # -- messages from agents -------------------------------------------------------------------------
    def _on_message(self, session: FleetSession, replayed: bool = False) -> Callable[[Msg], Any]:
        """The handler of a session's messages, live (its subscription) or `replayed` from the streams that
        keep them (counted refusals are the live ones: a replay must not count a message twice)."""

        async def handle(message: Msg) -> None:
            parsed = parse_session_subject(message.subject)
            parts = message.subject.split(".")
            sender = parts[3] if len(parts) > 3 else "?"
            if parsed is not None and parsed[2] == "progress":
                parsed = (parsed[0], parsed[1], "status")  # a status on its way, stored by no stream
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
        """Count every refused message; log and audit the first of each (sender, kind, reason) per session.
        By the controller running the session only (a follower's would be a second count and record)."""
        if replayed or not session.owned:
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
        if view.state in FINAL:
            return  # already decided (a late "ended" after we failed it changes nothing)
        if _RANK.get(status.state, 0) < _RANK.get(view.state, 0):
            return  # an older status, read back from the stream after a newer one came
        view.sent, view.batches_sent = status.events, max(view.batches_sent, status.batches)
        view.heard = True
        session.set_host(sender, status.state, status.reason)
        view.totals = dict(status.totals)
        view.lost, view.sampled = status.lost, status.sampled
        if status.start_skew_ns is not None:
            view.start_skew_ns = status.start_skew_ns
        view.missed_pings = 0
        view.unreachable_since = None
        view.last_seen = time.monotonic()
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

    # -- orchestration (the controller that runs the session) -------------------------------------------
    async def _run(self, session: FleetSession) -> None:
        """From where the session is: a new one from its prepare, one taken over from its prepare (tasks
        only to the hosts never heard of) or after T0 (started again where the start may not have come).
        No full garbage collection over a large session's objects until it is finished (full_collections)."""
        with full_collections.held() if len(session.hosts) > _LARGE_SESSION else contextlib.nullcontext():
            await self._run_held(session)

    async def _run_held(self, session: FleetSession) -> None:
        run = asyncio.current_task()
        assert run is not None
        keeper = asyncio.create_task(self._keep_lease(session, run))
        abandoned = False
        try:
            if session.t0_ns is None:
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
                    offsets = {host: (v.offset_ns, v.rtt_ns) for host, v in session.hosts.items()}
                    # Stored before any host starts: a controller taking over starts the others at this T0.
                    await self._store.save_t0(session.id, StoredT0(t0, offsets))
                    await self._start_all(session, ready, t0)
                    if session.listened:
                        session.emit("session", session.snapshot(timeline=False))
                    await self._save_summary(session)
            else:
                waiting = [h for h, v in session.hosts.items() if v.state in ("preparing", "ready")]
                await self._start_all(session, waiting, session.t0_ns)
            if session.t0_ns is not None:
                await self._supervise(session, session.t0_ns + int(session.spec.duration * 1e9))
        except asyncio.CancelledError:
            # The controller is stopping, or another took the session over: not finished here - the agents
            # end it at its deadline on their own, and the controller that holds the lease finishes it.
            abandoned = True
            raise
        except Exception as error:  # a bug must end the session visibly, not hang it
            _log.exception("session %s", session.id)
            for host in list(session.open_hosts):
                self._fail(session, host, f"controller error: {error}")
        finally:
            self._runs.pop(session.id, None)
            await self._unsubscribe(session.id)
            if abandoned:
                keeper.cancel()
                session.owned = False
                session.close_listeners()
                self._sessions.pop(session.id, None)
                await self._leases.release(session.id)  # (a no-op when another took it over)
            else:
                try:
                    await self._finish(session)  # the lease is kept meanwhile: verdicts may take a while
                finally:
                    keeper.cancel()

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
        """Every host's task, then its clock ping, through a bounded window: `_PREPARE_WINDOW` hosts in
        flight at once, their tasks signed `_SIGN_BATCH` at a time and sent as they are signed (the requests
        of one connection are written together; none waits for another's reply). All of them at once - a
        task and a ping per host, 20,000 coroutines for 10,000 hosts - put the first task 11-23 s after the
        API call and every later message behind them; in a window the first agents start at once and the
        event loop keeps reading their replies. A session taken over sends tasks only to the hosts it
        never heard of, and waits for the others. Then one wait for every host's ready."""
        views = session.hosts
        hosts = [
            host
            for host in session.spec.hosts
            if views[host].state == "preparing"
            or (views[host].offset_ns is None and views[host].state not in FINAL)
        ]
        ready_by: collections.deque[tuple[str, float]] = collections.deque()
        window = asyncio.Semaphore(_PREPARE_WINDOW)
        in_flight: set[asyncio.Task[None]] = set()
        errors: list[BaseException] = []  # a bug in one host's prepare ends the session visibly (_run)

        def done(job: asyncio.Task[None]) -> None:
            in_flight.discard(job)
            window.release()
            if not job.cancelled() and job.exception() is not None:
                errors.append(cast(BaseException, job.exception()))

        try:
            for first in range(0, len(hosts), _SIGN_BATCH):
                if session.cancel_requested:
                    break
                batch = hosts[first : first + _SIGN_BATCH]
                signed = {
                    host: self._signed_task(session, host)
                    for host in batch
                    if views[host].state == "preparing" and not views[host].heard
                }
                for host in batch:
                    await window.acquire()
                    job = asyncio.create_task(self._prepare(session, host, signed.get(host), ready_by))
                    in_flight.add(job)
                    job.add_done_callback(done)
                await asyncio.sleep(0)  # a turn of the loop between batches: replies and statuses are read
            await asyncio.gather(*in_flight)
        except asyncio.CancelledError:
            for job in in_flight:
                job.cancel()
            raise
        if errors:
            raise errors[0]
        await self._await_ready(session, ready_by)
        failed = [host for host in session.spec.hosts if views[host].state == "failed"]
        await self._send_control(session, failed, "cancel")  # a failed host may have attached meanwhile

    async def _prepare(
        self,
        session: FleetSession,
        host: str,
        signed: SignedTask | None,
        ready_by: collections.deque[tuple[str, float]],
    ) -> None:
        """One host: its task (`signed`; None: it has it already), then its clock. Its ready is waited for
        with every other host's, from `ready_by` (the host, and when it must be ready by)."""
        view = session.hosts[host]
        if view.state == "preparing":
            if signed is not None and not await self._send_task(session, host, signed):
                return
            ready_by.append((host, time.monotonic() + self._config.prepare_timeout))
        if view.offset_ns is None and view.state not in FINAL:
            await self._clock(session, host)

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

    def _signed_task(self, session: FleetSession, host: str) -> SignedTask:
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
        session.hosts[host].task_id = task.id
        return SignedTask.sign(task, self._key, self._key_id)

    async def _send_task(self, session: FleetSession, host: str, signed: SignedTask) -> bool:
        """The task to its host, and its answer: True if accepted (the host then prepares)."""
        spec = session.spec
        try:
            reply_message = await self._request(
                task_subject(host), signed.encode(), timeout=self._config.prepare_timeout
            )
            reply = TaskReply.from_json(decode(reply_message.data, "task reply"))
        except NoRespondersError:
            self._fail(session, host, "the agent is not connected (nobody answers on its subjects)")
            return False
        except (NatsTimeoutError, TimeoutError):
            self._fail(
                session, host, f"the agent did not answer the task within {self._config.prepare_timeout:g} s"
            )
            await self._send_control(session, [host], "cancel")
            return False
        except ProtocolError as error:
            self._fail(session, host, f"bad task reply: {error}")
            return False
        if reply.accepted:
            return True
        view = session.set_host(host, "rejected", reply.reason or "refused")
        session.emit("status", {"host": host, **view.to_json()})
        self._decided(session, host)
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
                extra={"task_id": signed.task.id, "source": "controller"},
            )
        return False

    async def _await_ready(
        self, session: FleetSession, ready_by: collections.deque[tuple[str, float]]
    ) -> None:
        """Until every host of `ready_by` has left "preparing" (ready, or failed) or is past the time it
        had to be ready by (failed then, and told to cancel), or the session is cancelled. One waiter for
        the session, woken by each status: the oldest host not ready yet is all it looks at (`ready_by` is
        in the order the tasks were answered, so the deadlines are in order too) - linear in the hosts."""
        late: list[str] = []
        while ready_by and not session.cancel_requested:
            host, deadline = ready_by[0]
            if session.hosts[host].state != "preparing":
                ready_by.popleft()
                continue
            now = time.monotonic()
            if now >= deadline:
                ready_by.popleft()
                self._fail(session, host, f"not ready within {self._config.prepare_timeout:g} s")
                late.append(host)
                continue
            session.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.changed.wait(), timeout=deadline - now)
        if late:
            await self._send_control(session, late, "cancel")

    async def _start_all(self, session: FleetSession, hosts: list[str], t0_ns: int) -> None:
        """`start` to each host, in one pass (a publish waits for nothing): not a coroutine per host."""
        for index, host in enumerate(hosts, 1):
            await self._start(session, host, t0_ns)
            if index % _SIGN_BATCH == 0:
                await asyncio.sleep(0)  # statuses and replies are read meanwhile

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
        if session.hosts[host].state in FINAL:
            return
        view = session.set_host(host, "failed", reason)
        session.emit("status", {"host": host, **view.to_json()})
        self._decided(session, host)

    def _decided(self, session: FleetSession, host: str) -> None:
        """A host this controller decided: stored, so a controller taking the session over keeps it."""
        view = session.hosts[host]
        self._background(
            self._store.save_decision(session.id, host, view.state, view.reason), f"decided-{session.id}"
        )

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
                if not session.open_hosts:
                    return
                if time.time_ns() >= next_replay_ns:
                    # Past the deadline and some host has not said it ended: its end may have been stored
                    # while its delivery to this controller was lost (asked of the leader, host by host, for
                    # the longest quiet few: a 10,000-host session's stragglers are not 10,000 reads a round).
                    next_replay_ns = time.time_ns() + int(_QUIET_S * 1e9)
                    await self._stored_ends(session)
                    continue
                if session.cancel_requested and not cancelled:
                    cancelled = True
                    limit_ns = min(limit_ns, time.time_ns() + grace_ns)
                    await self._send_control(session, list(session.open_hosts), "cancel")
                if time.time_ns() >= limit_ns:
                    what = "the cancel" if cancelled else "the deadline"
                    pending = list(session.open_hosts)
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
                for host in session.open_hosts
                if now - session.hosts[host].last_seen >= _QUIET_S
                and (
                    session.hosts[host].unreachable_since is not None
                    or now - last_round.get(host, 0.0) >= _QUIET_S
                )
            ]
            # The longest quiet first, and a bounded number a round: a wide window is not a ping storm.
            quiet.sort(key=lambda host: session.hosts[host].last_seen)
            quiet = quiet[:_PINGS_PER_ROUND]
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
        session as ended: a client polling for `ended` always finds the verdicts with it. Then the result
        is stored (any controller reads it from there), the summary says ended, and the lease goes."""
        ended_ns = time.time_ns()
        _log.info(
            "session %s: every host final %.3f s after creation",
            session.id,
            (ended_ns - session.created_ns) / 1e9,
        )
        if session.cancel_requested:
            state = "cancelled"
        else:
            state = "ended" if any(view.state == "ended" for view in session.hosts.values()) else "failed"
        partial = any(view.state != "ended" for view in session.hosts.values())
        await self._reconcile(session)
        # On a thread: a 10,000-host session's verdicts take a while, and the lease must be renewed meanwhile.
        session.verdicts = await asyncio.to_thread(session.merged.verdicts, session.host_states())
        not_ended = {
            h: {"state": v.state, "reason": v.reason} for h, v in session.hosts.items() if v.state != "ended"
        }
        counts: dict[str, int] = {}
        for view in session.hosts.values():
            counts[view.state] = counts.get(view.state, 0) + 1
        outcome = ", ".join(f"{host}: {view.state}" for host, view in list(session.hosts.items())[:50])
        if len(session.hosts) > 50:
            outcome += (
                ", ... (" + ", ".join(f"{count} {state}" for state, count in sorted(counts.items())) + ")"
            )
        record: dict[str, Any] = {
            "user": session.spec.user,
            "action": "session.end",
            "decision": "allow",
            "session": session.id,
            "diagnostic": session.spec.diagnostic,
            "hosts": list(session.spec.hosts),
            "scope": session.spec.scope.to_json(),
            "outcome": f"{state}{' (partial)' if partial else ''}; {outcome}",
            "extra": {
                # What came of it, as one word (ended, partial, failed, cancelled): an end is no decision,
                # and its "allow" says nothing about the hosts that failed. Every host that did not end is
                # named with why (bounded: a message is at most a MiB), the rest counted.
                "result": session_result(state, partial),
                "host_states": dict(list(not_ended.items())[:1000]),
                "host_counts": counts,
                **({"taken_over": True} if session.taken_over else {}),
            },
        }
        recorded = True
        try:
            await self._audit.record(patience=5, **record)  # a stream electing its leader: worth waiting for
        except AuditUnavailable as error:
            # The end happened whether or not it is on record yet (JetStream without a quorum): the session
            # ends for its readers now, and the record is written as soon as the stream takes it (below).
            _log.warning("session %s: its end is not in the audit yet: %s", session.id, error)
            recorded = False
        # No await from here to final_json: readers see either the running session or the finished one.
        session.state, session.ended_ns = state, ended_ns
        body = session.snapshot(timeline=True)
        session.final_json = orjson.dumps(body)
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
        summary = summary_of(body)
        self._index.note(summary)
        if recorded and await self._store_end(session.id, session.final_json, summary):
            await self._leases.release(session.id)
            return
        self._background(
            self._persist_end(session.id, record, recorded, session.final_json, summary), f"end-{session.id}"
        )

    async def _store_end(self, session_id: str, final: bytes, summary: dict[str, Any]) -> bool:
        """The result first: a summary saying ended is what other controllers read the result after."""
        try:
            await self._store.save_result(session_id, final)
            await self._store.save_summary(summary)
        except Exception as error:
            _log.warning("session %s: its result is not stored yet: %s", session_id, error)
            return False
        return True

    async def _persist_end(
        self, session_id: str, record: dict[str, Any], recorded: bool, final: bytes, summary: dict[str, Any]
    ) -> None:
        """An ended session's audit record and result, written once JetStream takes them again (its servers
        lost their quorum): tried every half second for at most _STORE_PATIENCE_S, each time after renewing
        the session's lease - if another controller took the session over meanwhile (the lease ran out while
        nothing could be written), that one records its end, and this one stops: one end per session."""
        give_up = time.monotonic() + _STORE_PATIENCE_S
        stored = False
        while time.monotonic() < give_up:
            await asyncio.sleep(0.5)
            try:
                await self._leases.renew(session_id)
            except LeaseLost:
                _log.warning(
                    "session %s: taken over before its end was stored; the other controller records it",
                    session_id,
                )
                return
            except Exception:
                continue  # no quorum yet
            if not recorded:
                with contextlib.suppress(AuditUnavailable):
                    await self._audit.record(**record)
                    recorded = True
                    _log.info("session %s: the audit record of its end stored", session_id)
            if recorded and not stored:
                stored = await self._store_end(session_id, final, summary)
            if recorded and stored:
                await self._leases.release(session_id)
                return
        _log.error("session %s: its end was not stored within %g s", session_id, _STORE_PATIENCE_S)
