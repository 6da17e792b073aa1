"""The agent's link to the fleet: dials out to NATS, keeps its registry entry fresh, takes signed tasks.

It runs an asyncio loop (nats-py) on one thread inside the agent process rather than as a separate
process: a fleet session needs what the agent already holds - the loaded drop reasons and symbols, the
program ledger its self-metrics and CPU budgets read, the [sessions] limits - and a second privileged
process would be a second thing to grant capabilities to and to leave programs behind. The loop only does
I/O; every session's BPF work (attach, poll, detach) runs on that session's own thread
(session_runner.py), so a slow attach never delays a heartbeat, and the sessions' deadlines do not depend on
the loop, NATS or the controller being alive.

NATS outages: nats-py reconnects by itself (forever, every second, to any server of a cluster); on reconnect
the entry is written again at once, so a restarted server (or one that lost its store) learns of the host
within a second, not at the next heartbeat. A session's statuses and record batches wait for JetStream to
store them and are sent again after an outage (outbox.py, bounded) when the task says the controller's
streams store them; otherwise (an older controller) they are published and, while disconnected, dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from netsleuth.agent.config import SessionLimits
from netsleuth.agent.programs import ProgramLedger
from netsleuth.agent.session_diagnostics import DiagnosticContext
from netsleuth.fleet.admission import TaskAdmission, TaskRefused
from netsleuth.fleet.clock import OffsetEstimator, parse_nats_time
from netsleuth.fleet.diagnostic_source import catalogue, open_diagnostic
from netsleuth.fleet.host_namespaces import HostNamespaces
from netsleuth.fleet.host_registry import host_entry, probe_features
from netsleuth.fleet.link_config import FleetConfig, login_identity, login_refused, lone_reset
from netsleuth.fleet.outbox import Outbox, OutboxCounts
from netsleuth.fleet.protocol import (
    HOSTS_BUCKET,
    Control,
    HostStatus,
    PingReply,
    ProtocolError,
    TaskReply,
    agent_audit_subject,
    control_subject,
    decode,
    new_run_id,
    ping_subject,
    status_subject,
    task_subject,
)
from netsleuth.fleet.refusal_audit import RefusalAudit, audit_time
from netsleuth.fleet.session_runner import FleetSession
from netsleuth.kernel.netns import NetnsNames
from netsleuth.kernel.pods import PodIndex

__all__ = ["FleetLink"]

_LOG = logging.getLogger("netsleuth.agent.fleet")
_RECONNECT_WAIT_S = 1.0


class FleetLink:
    def __init__(
        self,
        config: FleetConfig,
        limits: SessionLimits,
        context: DiagnosticContext,
        ledger: ProgramLedger,
        cpu_accounting: Callable[[], bool],
    ) -> None:
        self.config = config
        self._limits = limits
        self._context = context
        self._ledger = ledger
        self._cpu_accounting = cpu_accounting
        self._names = NetnsNames()
        self._pods = PodIndex()  # asks nothing on a host without a container runtime socket
        self._clock = OffsetEstimator()
        # This run of the agent: in the registry entry, and in every task signed for it (replays across a
        # restart name an earlier run; admission.py).
        self.run_id = new_run_id()
        self.audit = RefusalAudit(config.host_id)
        self._audit_summary_due = False
        self.admission = TaskAdmission(
            host_id=config.host_id,
            run_id=self.run_id,
            controller_key=config.controller_key,
            catalogue=catalogue,
            limits=limits,
            host_netns=config.netns,
            namespaces=HostNamespaces(self._names, self._pods),
            max_task_lifetime=config.max_task_lifetime,
        )
        self._features: dict[str, Any] = {}
        self._sessions: dict[str, FleetSession] = {}
        self._outbox: Outbox | None = None  # made on the link's loop
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nc: Client | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._register_now: asyncio.Event | None = None
        self.last_error: str | None = None
        self._previous_error: Exception | None = None  # nats-py's last error (_on_error)
        self.registrations = 0
        self.connected = threading.Event()
        self._stop_requested = threading.Event()  # stop() may come before the loop made its own event
        self.accepted = 0
        self.refused = 0
        self.withheld = 0  # out-of-scope records and entries held back by ended sessions

    # -- lifecycle (agent thread) ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the link's thread; returns at once (NATS being down is not an agent start failure)."""
        if self.config.netns and self._names.inode_of_name(self.config.netns) is None:
            _LOG.warning(
                "fleet.netns %r does not exist (yet): tasks are refused until it does", self.config.netns
            )
        self._features = probe_features()
        # pyroute2 (conntrack reads at a session's end, namespace names) imported here, on the agent's main
        # thread before any fleet thread exists: its lazy imports are not safe when two threads race through
        # them ("partially initialized module pyroute2.netns"), and ~0.4 s is not spent after a deadline.
        import pyroute2.netns  # noqa: F401
        from pyroute2 import NFCTSocket  # noqa: F401

        self._thread = threading.Thread(target=self._thread_main, name="netsleuth-fleet", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End every session (agent_stopping: they send their end status), mark the entry stopping, close."""
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.stop("agent_stopping", "the agent is shutting down")
        for session in sessions:
            session.thread.join(timeout)
        self._stop_requested.set()
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def sessions(self) -> list[FleetSession]:
        with self._lock:
            return list(self._sessions.values())

    # -- for the metrics (fleet/metrics.py) ------------------------------------------------------------
    @property
    def is_connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    @property
    def active_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    @property
    def outbox(self) -> OutboxCounts:
        return self._outbox.counts if self._outbox is not None else OutboxCounts()

    @property
    def clock_offset_ns(self) -> int | None:
        best = self._clock.best()
        return best.offset_ns if best is not None else None

    # -- the loop's thread -----------------------------------------------------------------------------
    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _connect(self) -> Client:
        config = self.config
        options: dict[str, Any] = {
            "servers": list(config.urls),
            "name": f"netsleuth-agent-{config.host_id}",
            # Replies to this agent's own requests come on its own inbox prefix, which is all its NATS
            # permissions let it subscribe to besides its task subjects: no agent can read another's replies.
            "inbox_prefix": f"_INBOX_{config.host_id}",
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": _RECONNECT_WAIT_S,
            "connect_timeout": 2,
            "ping_interval": 10,
            "max_outstanding_pings": 2,
            "pending_size": 4 << 20,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "error_cb": self._on_error,
        }
        if config.password_file is not None:
            options["user"] = config.user
            options["password"] = config.password()
        elif config.creds_file is not None:
            options["user_credentials"] = str(config.creds_file)
        elif config.nkey_seed_file is not None:
            options["nkeys_seed"] = str(config.nkey_seed_file)
        elif config.user:
            options["user"] = config.user
        return await nats.connect(**options)

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        self._register_now = asyncio.Event()
        if self._stop_requested.is_set():
            return
        nc: Client | None = None
        while not self._stopping.is_set():
            try:
                nc = await self._connect()
                break
            except (TimeoutError, OSError, NatsError) as error:
                self._set_error(f"cannot reach NATS at {', '.join(self.config.urls)}: {error or type(error)}")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), _RECONNECT_WAIT_S)
        if nc is None:
            return
        self._nc = nc
        self._outbox = Outbox(lambda: self._nc)
        sending = asyncio.create_task(self._outbox.run(), name="fleet-outbox")
        self.connected.set()
        host = self.config.host_id
        await nc.subscribe(task_subject(host), cb=self._on_task)
        await nc.subscribe(control_subject(host), cb=self._on_control)
        await nc.subscribe(ping_subject(host), cb=self._on_ping)
        _LOG.info(
            "fleet: connected to %s as host %s", nc.connected_url.netloc if nc.connected_url else "?", host
        )
        try:
            await self._heartbeats()
        finally:
            await self._flush_outbox()
            sending.cancel()
            with contextlib.suppress(Exception):
                await self._register("stopping")
            with contextlib.suppress(Exception):
                await nc.drain()
            self.connected.clear()

    async def _heartbeats(self) -> None:
        assert self._stopping is not None and self._register_now is not None
        while not self._stopping.is_set():
            await self._register("up")
            if self.registrations == 1 and self._clock.best() is not None:
                await self._register("up")  # at once with the clock offset the first write measured
            self._register_now.clear()
            waits = [
                asyncio.ensure_future(self._stopping.wait()),
                asyncio.ensure_future(self._register_now.wait()),
            ]
            _done, pending = await asyncio.wait(
                waits, timeout=self.config.heartbeat_seconds, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in pending:
                waiter.cancel()

    async def _register(self, status: str) -> None:
        """Write this host's entry (a JetStream publish to its own KV key) and measure the clock on it."""
        nc = self._nc
        if nc is None or not nc.is_connected:
            return
        entry = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: host_entry(
                self.config.host_id,
                self._features,
                dict(self.config.labels),
                self.config.netns,
                self._names,
                self.last_error,
                catalogue(),
                self.config.controller_key_id,
                self._clock.offset_ns,
                status,
                self.run_id,
                self._pods,
            ),
        )
        key_subject = f"$KV.{HOSTS_BUCKET}.{self.config.host_id}"
        try:
            sent = time.time_ns()
            ack = await nc.request(key_subject, entry.encode(), timeout=2)
            received = time.time_ns()
            reply = decode(ack.data, "registry acknowledgement")
            if not isinstance(reply, dict) or "error" in reply:
                raise ProtocolError(f"the registry refused the entry: {reply}")
            await self._measure_clock(nc, sent, received)
        except (TimeoutError, NatsError, ProtocolError) as error:
            text = str(error) or type(error).__name__
            if "no responders" in text.lower():
                text = (
                    f"nothing answered: the KV bucket {HOSTS_BUCKET} does not exist (start the controller: "
                    "it creates it), or the servers keeping it are electing a leader"
                )
            self._set_error(f"cannot register in {HOSTS_BUCKET}: {text}")
            return
        if self.last_error and self.last_error.startswith("cannot re"):
            self.last_error = None  # registering worked again; errors of sessions stay
        self.registrations += 1

    async def _measure_clock(self, nc: Client, sent: int, received: int) -> None:
        # The server's own timestamp of the entry just stored (direct get: one message, no consumer).
        subject = f"$JS.API.DIRECT.GET.KV_{HOSTS_BUCKET}.$KV.{HOSTS_BUCKET}.{self.config.host_id}"
        with contextlib.suppress(NatsError, asyncio.TimeoutError, ValueError):
            stored = await nc.request(subject, b"", timeout=2)
            stamp = (stored.headers or {}).get("Nats-Time-Stamp")
            if stamp:
                self._clock.add(sent, received, parse_nats_time(stamp))

    def _set_error(self, text: str) -> None:
        if text != self.last_error:
            _LOG.warning("fleet: %s", text)
        self.last_error = text

    async def _on_disconnected(self) -> None:
        self._set_error("disconnected from NATS; reconnecting")

    async def _on_reconnected(self) -> None:
        nc = self._nc
        server = nc.connected_url.netloc if nc is not None and nc.connected_url else "NATS"
        _LOG.info("fleet: reconnected to %s; registering again", server)
        if self._register_now is not None:
            self._register_now.set()
        if self._outbox is not None:
            self._outbox.poke()

    async def _flush_outbox(self, timeout: float = 5.0) -> None:
        """Stopping: the last statuses (`agent_stopping`) get a few seconds to be stored."""
        deadline = time.monotonic() + timeout
        while self._outbox is not None and self._outbox.waiting and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _on_error(self, error: Exception) -> None:
        previous, self._previous_error = self._previous_error, error
        if login_refused(error):
            config = self.config
            identity = login_identity(
                "fleet", config.user, config.creds_file, config.nkey_seed_file, config.password_file
            )
            # nats-py keeps trying (the server's authorization may be fixed without restarting the agent).
            self._set_error(
                f"NATS at {', '.join(self.config.urls)} refused the login of {identity}: "
                f"is it listed in the server's authorization? (retrying every {_RECONNECT_WAIT_S:g} s)"
            )
            return
        if lone_reset(error, previous):
            return
        self._set_error(f"NATS: {error or type(error).__name__}")

    # -- messages --------------------------------------------------------------------------------------
    def publisher(self, stored: bool) -> Callable[[str, bytes, str, str], None]:
        """What a session publishes with: its statuses and record batches through the outbox when the
        controller's streams store them (the task says so), else - and its progress - a plain publish."""

        def publish(subject: str, data: bytes, message_id: str, kind: str) -> None:
            """From a session's thread: queue it on the loop, never wait for it."""
            loop, nc = self._loop, self._nc
            if loop is None or nc is None or loop.is_closed():
                return
            with contextlib.suppress(RuntimeError):  # the loop has just stopped
                if stored and kind != "progress" and self._outbox is not None:
                    droppable = kind == "records"
                    loop.call_soon_threadsafe(self._outbox.put, subject, data, message_id, droppable)
                else:
                    loop.call_soon_threadsafe(self._publish_now, subject, data)

        return publish

    def _publish_now(self, subject: str, data: bytes) -> None:
        nc = self._nc
        if nc is None or not nc.is_connected:
            return  # NATS is away: a status or batch is lost, the session ends at its deadline regardless
        task = asyncio.ensure_future(nc.publish(subject, data))
        task.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def _on_ping(self, msg: Msg) -> None:
        if msg.reply:
            await msg.respond(PingReply(time.time_ns()).encode())

    async def _on_task(self, msg: Msg) -> None:
        try:
            accepted = self.admission.admit(msg.data)
            if not self._cpu_accounting():
                raise TaskRefused(
                    "BPF run-time accounting is off, so the CPU budget cannot be enforced: give the agent "
                    "CAP_SYS_ADMIN or set kernel.bpf_stats_enabled=1",
                    accepted.task,
                )
            with self._lock:
                running = self._sessions.get(accepted.task.session)
                if running is not None and running.task.user != accepted.task.user:
                    raise TaskRefused(f"session {accepted.task.session} already runs here", accepted.task)
                if running is None and len(self._sessions) >= self._limits.max_concurrent:
                    raise TaskRefused(
                        f"{self._limits.max_concurrent} fleet sessions are running, this agent's maximum",
                        accepted.task,
                    )
                if running is None:
                    session = FleetSession(
                        accepted,
                        self.config.host_id,
                        lambda: open_diagnostic(accepted.task.diagnostic, accepted.config, self._context),
                        self.publisher(accepted.task.stored),
                        self._ledger,
                        lambda: self._clock.offset_ns,
                        self._session_ended,
                    )
                    self._sessions[session.id] = session
        except TaskRefused as refused:
            await self._refuse(msg, refused)
            return
        if running is not None:
            # A second signed task (a new id) for a session that runs here: a controller that took the session
            # over while it was preparing and had not heard from this host yet. Nothing new runs.
            if msg.reply:
                await msg.respond(TaskReply(True, "", self._clock.offset_ns).encode())
            _LOG.info("fleet: task %s: session %s already runs here", accepted.task.id, running.id)
            return
        self.accepted += 1
        if msg.reply:
            await msg.respond(TaskReply(True, "", self._clock.offset_ns).encode())
        _LOG.info(
            "fleet: task %s accepted: session %s, %s for %s, %.3g s",
            accepted.task.id,
            session.id,
            accepted.task.diagnostic,
            accepted.task.user,
            accepted.deadline_s,
        )
        session.begin()

    async def _refuse(self, msg: Msg, refused: TaskRefused) -> None:
        self.refused += 1
        reason = str(refused)
        _LOG.warning("fleet: task refused: %s", reason)
        if msg.reply:
            await msg.respond(TaskReply(False, reason, self._clock.offset_ns).encode())
        host = self.config.host_id
        # Every refusal is in the audit trail, whoever sent the message and whatever it held: a task that
        # bypassed the controller, did not parse, or names another host too. What an unsigned or forged
        # task says is only its sender's claim (`signed`: false); the digest identifies the exact bytes.
        record: dict[str, Any] = {
            "time": audit_time(),
            "host": host,
            "action": "task.rejected",
            "decision": "deny",
            "reason": reason,
            "signed": refused.signed,
            "bytes": len(msg.data),
            "sha256": hashlib.sha256(msg.data).hexdigest(),
        }
        task = refused.task
        if task is not None:
            record.update(
                task_id=task.id,
                session=task.session,
                user=task.user,
                diagnostic=task.diagnostic,
                scope=task.scope.to_json(),
            )
            if task.host == host and self._nc is not None:
                # Also as a status on the session's subject, where the controller records outcomes.
                status = HostStatus(host, task.session, "rejected", reason, self._clock.offset_ns)
                with contextlib.suppress(NatsError):
                    await self._nc.publish(status_subject(task.session, host), status.encode())
        await self._audit(record)

    async def _audit(self, record: dict[str, Any]) -> None:
        """Write one refusal record (within RefusalAudit's rate and size), acknowledged by the stream."""
        data = self.audit.admit(record)
        if data is None:
            self._audit_summary_later()
            return
        await self._write_audit(data)

    async def _write_audit(self, data: bytes) -> None:
        nc = self._nc
        if nc is None or not nc.is_connected:
            self.audit.unstored += 1
            return
        try:
            # A JetStream publish (the ack comes to this agent's own inbox): a record the stream refused - too
            # big, its stream missing - is counted and logged, not lost without a word.
            reply = decode((await nc.request(agent_audit_subject(self.config.host_id), data, timeout=2)).data,
                           "audit acknowledgement")  # fmt: skip
            if not isinstance(reply, dict) or "error" in reply:
                raise ProtocolError(f"the audit stream refused the record: {reply}")
        except (TimeoutError, NatsError, ProtocolError) as error:
            self.audit.unstored += 1
            self._set_error(f"audit record not stored: {error or type(error).__name__}")

    def _audit_summary_later(self) -> None:
        loop = self._loop
        if self._audit_summary_due or loop is None:
            return
        self._audit_summary_due = True

        async def flush() -> None:
            while self.audit.pending:
                data = self.audit.summary()
                if data is not None:
                    await self._write_audit(data)
                else:
                    await asyncio.sleep(0.2)
            self._audit_summary_due = False

        loop.call_later(1.0, lambda: asyncio.ensure_future(flush()))

    async def _on_control(self, msg: Msg) -> None:
        host = self.config.host_id
        try:
            control = Control.from_json(decode(msg.data, "control message"))
        except ProtocolError as error:
            _LOG.warning("fleet: control message ignored: %s", error)
            await self._audit({"time": audit_time(), "host": host, "action": "control.ignored",
                               "decision": "deny", "reason": str(error), "bytes": len(msg.data),
                               "sha256": hashlib.sha256(msg.data).hexdigest()})  # fmt: skip
            return
        with self._lock:
            session = self._sessions.get(control.session)
        if session is None:
            _LOG.info("fleet: %s for session %s, which does not run here", control.action, control.session)
            if control.action == "start":
                # A start with no accepted task behind it: the second half of a replay, or a task refused a
                # moment ago. (A cancel for an ended session is an ordinary race: not recorded.)
                record = {"time": audit_time(), "host": host, "action": "control.ignored", "decision": "deny",
                          "session": control.session}  # fmt: skip
                await self._audit(
                    {**record, "reason": f"start for session {control.session}, not running here"}
                )
            return
        if control.action == "start":
            session.start_at(control.t0_ns)
        else:
            session.cancel()

    def _session_ended(self, session: FleetSession) -> None:
        with self._lock:
            self._sessions.pop(session.id, None)
            self.withheld += session.withheld
        if session.state == "failed":
            self.last_error = f"session {session.id} failed: {session.reason}"
        _LOG.info("fleet: session %s %s: %s", session.id, session.state, session.reason)
