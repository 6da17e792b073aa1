"""Simulated fleet agents: many hosts in one asyncio process, each speaking the real agent protocol to a real
NATS server (netsleuth.fleet.protocol), for the scale benchmark (bench/fleet_scale.py) and the UI load test.

Each simulated host registers in the KV bucket and keeps its entry fresh, answers clock pings, checks every
task like the real agent's admission does where it matters for load (the Ed25519 signature over the task,
the host, the expiry, replays), replies, and then plays a session: preparing -> ready (after `prepare_s`),
running at T0, `records` drop records in batches spread over the window, a summary, `ended` with exact
totals and the number of batches sent. When the task says `stored` (the controller's streams keep the
session), each status and batch is a JetStream publish with its message id, awaited like the real agent's
outbox waits for the acknowledgement. It attaches nothing: it measures the protocol, the server and the
controller, not the kernel. `labels(host)` gives each host its labels (e.g. a zone), for selectors.

    fleet = SimulatedFleet(nats_url, credentials, hosts=[f"sim-{i:04d}" for i in range(1000)],
                           controller_key=public_key, agents_per_connection=25)
    await fleet.start()       # connected, subscribed, registered
    fleet.ready_at[session]   # {host: time.monotonic() of its "ready"}; ended_at likewise
    await fleet.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nats.aio.client import Client
from nats.aio.msg import Msg

from netsleuth import __version__
from netsleuth.fleet.protocol import (
    HOSTS_BUCKET,
    Control,
    HostEntry,
    HostStatus,
    PingReply,
    ProtocolError,
    RecordBatch,
    SignedTask,
    Task,
    TaskReply,
    control_subject,
    decode,
    ping_subject,
    progress_subject,
    records_subject,
    status_subject,
    task_subject,
)

__all__ = ["SimulatedFleet", "SimulatedSession"]

_ISO = "%Y-%m-%dT%H:%M:%S"


def _iso(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).isoformat(timespec="microseconds")


@dataclass
class SimulatedSession:
    task: Task
    host: str
    client: Client
    t0_ns: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False
    statuses: int = 0
    batches: int = 0
    runner: asyncio.Task[None] | None = None


class SimulatedFleet:
    def __init__(
        self,
        nats_url: str | list[str],
        credentials: dict[str, str],
        hosts: Sequence[str],
        controller_key: Ed25519PublicKey,
        agents_per_connection: int = 25,
        records: int = 10,
        batch_records: int = 64,
        prepare_s: float = 0.0,
        heartbeat_s: float = 5.0,
        labels: Callable[[str], dict[str, str]] | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.credentials = credentials
        self.hosts = list(hosts)
        self.controller_key = controller_key
        self.agents_per_connection = max(1, agents_per_connection)
        self.records = records
        self.batch_records = batch_records
        self.prepare_s = prepare_s
        self.heartbeat_s = heartbeat_s
        self.labels = labels or (lambda host: {"sim": "yes"})
        self.clients: list[Client] = []
        self._client_of: dict[str, Client] = {}
        self._sessions: dict[tuple[str, str], SimulatedSession] = {}
        self._seen_tasks: set[str] = set()
        self._heartbeat: asyncio.Task[None] | None = None
        self.ready_at: dict[str, dict[str, float]] = defaultdict(dict)
        self.running_at: dict[str, dict[str, float]] = defaultdict(dict)
        self.ended_at: dict[str, dict[str, float]] = defaultdict(dict)
        self.tasks_received = 0
        self.task_at: dict[str, dict[str, float]] = defaultdict(dict)  # when each host's task arrived
        self.start_at: dict[str, dict[str, float]] = defaultdict(dict)  # when its start arrived
        self.t0_ns: dict[str, int] = {}
        self.refused: list[str] = []
        self.sent = 0  # statuses and batches sent for JetStream to store ...
        self.acked = 0  # ... acknowledged by it ...
        self.ack_errors: list[str] = []  # ... or refused
        self._acks_inbox: dict[int, str] = {}
        # (monotonic, seconds late) of a 10 ms timer in this process's event loop: how far behind the
        # simulator itself is - large lags mean its timestamps measure the simulator, not the controller.
        self.loop_lag: list[tuple[float, float]] = []
        self._lag_probe: asyncio.Task[None] | None = None
        self.gc_pauses: list[tuple[float, float]] = []  # (monotonic at its end, seconds) of each collection
        self._gc_started = 0.0
        self._gc_threshold: tuple[int, int, int] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        groups = [
            self.hosts[start : start + self.agents_per_connection]
            for start in range(0, len(self.hosts), self.agents_per_connection)
        ]
        for group in groups:
            client = await nats.connect(
                self.nats_url, name="netsleuth-sim", max_reconnect_attempts=-1, pending_size=16 << 20,
                **self.credentials,
            )  # fmt: skip
            self.clients.append(client)
            inbox = f"_INBOX.sim-acks.{len(self.clients)}"
            self._acks_inbox[id(client)] = inbox
            await client.subscribe(inbox, cb=self._on_ack)
            for host in group:
                self._client_of[host] = client
                await client.subscribe(task_subject(host), cb=self._task_handler(host))
                await client.subscribe(control_subject(host), cb=self._control_handler(host))
                await client.subscribe(ping_subject(host), cb=self._on_ping)
            await client.flush()
        await self._register_all()
        self._heartbeat = asyncio.create_task(self._heartbeats())
        self._lag_probe = asyncio.create_task(self._probe_lag())
        gc.callbacks.append(self._on_gc)
        # This one process stands for 10,000 agents, each a process with a small heap of its own: a full
        # collection over all of their state at once is a cost no agent has (it stalled this loop for up to
        # 2.1 s, 9.8 s in all, during a 10,000-host session). What exists now lives as long as the fleet;
        # only the young generations are collected until stop().
        self._gc_threshold = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(self._gc_threshold[0], self._gc_threshold[1], 1_000_000)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._gc_started = now
        else:
            self.gc_pauses.append((now, now - self._gc_started))

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
            gc.unfreeze()
        for background in (self._heartbeat, self._lag_probe):
            if background is not None:
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await background
        for session in list(self._sessions.values()):
            if session.runner is not None:
                session.runner.cancel()
        for client in self.clients:
            with contextlib.suppress(Exception):
                await client.close()

    async def _probe_lag(self, period: float = 0.01) -> None:
        while True:
            due = time.monotonic() + period
            await asyncio.sleep(period)
            now = time.monotonic()
            self.loop_lag.append((now, now - due))

    def lag_between(self, since: float, until: float) -> dict[str, float]:
        """The simulator's event-loop lag between two monotonic times: p50 / p99 / max in ms."""
        lags = sorted(lag for at, lag in self.loop_lag if since <= at <= until)
        if not lags:
            return {}
        pauses = [took for at, took in self.gc_pauses if since <= at <= until]
        return {
            "loop_lag_ms_p50": round(lags[len(lags) // 2] * 1000, 1),
            "loop_lag_ms_p99": round(lags[min(len(lags) - 1, int(len(lags) * 0.99))] * 1000, 1),
            "loop_lag_ms_max": round(lags[-1] * 1000, 1),
            "gc_pause_s_total": round(sum(pauses), 3),
            "gc_pause_ms_max": round(max(pauses, default=0.0) * 1000, 1),
        }

    # -- registry ----------------------------------------------------------------------------------------
    def _entry(self, host: str) -> bytes:
        now = time.time_ns()
        return HostEntry(
            host=host,
            hostname=host,
            kernel="6.18-sim",
            features={"simulated": True},
            version=__version__,
            labels=self.labels(host),
            namespaces=[],
            containers=[],
            heartbeat=time.strftime(_ISO, time.gmtime(now / 1e9)) + "Z",
            heartbeat_ns=now,
            diagnostics=("drops", "resets", "conn", "diagnose"),
        ).encode()

    async def _register_all(self) -> None:
        # A KV put is a JetStream publish to the key's subject; wait for every ack, a few hundred at a time.
        for start in range(0, len(self.hosts), 200):
            chunk = self.hosts[start : start + 200]
            await asyncio.gather(
                *(
                    self._client_of[host].request(f"$KV.{HOSTS_BUCKET}.{host}", self._entry(host), timeout=10)
                    for host in chunk
                )
            )

    async def _heartbeats(self) -> None:
        """Each host every `heartbeat_s`, spread evenly over the period as independent agents' are (not all
        of them at the same instant)."""
        period = self.heartbeat_s
        slots = max(1, int(period / 0.1))
        while True:
            for slot in range(slots):
                started = time.monotonic()
                with contextlib.suppress(Exception):
                    await asyncio.gather(*(self._register(host) for host in self.hosts[slot::slots]))
                await asyncio.sleep(max(0.0, period / slots - (time.monotonic() - started)))

    async def _register(self, host: str) -> None:
        await self._client_of[host].request(f"$KV.{HOSTS_BUCKET}.{host}", self._entry(host), timeout=10)

    # -- protocol ----------------------------------------------------------------------------------------
    async def _on_ack(self, msg: Msg) -> None:
        self.acked += 1
        if b'"error"' in msg.data and len(self.ack_errors) < 20:
            self.ack_errors.append(msg.data.decode(errors="replace"))

    async def _on_ping(self, msg: Msg) -> None:
        if msg.reply:
            await msg.respond(PingReply(time.time_ns()).encode())

    def _task_handler(self, host: str) -> Any:
        async def on_task(msg: Msg) -> None:
            self.tasks_received += 1
            arrived = time.monotonic()
            try:
                signed = SignedTask.from_json(decode(msg.data, "task"))
                signed.verify(self.controller_key)
                task = signed.task
                if task.host != host:
                    raise ProtocolError(f"the task is for host {task.host!r}")
                if task.expires_at <= time.time():
                    raise ProtocolError("the task expired")
                if task.id in self._seen_tasks:
                    raise ProtocolError(f"task {task.id} was already received: a replay")
                self._seen_tasks.add(task.id)
            except ProtocolError as error:
                self.refused.append(str(error))
                await msg.respond(TaskReply(False, str(error)).encode())
                return
            await msg.respond(TaskReply(True, "", 0).encode())
            self.task_at[task.session][host] = arrived
            session = SimulatedSession(task, host, self._client_of[host])
            self._sessions[(task.session, host)] = session
            session.runner = asyncio.create_task(self._play(session))

        return on_task

    def _control_handler(self, host: str) -> Any:
        async def on_control(msg: Msg) -> None:
            with contextlib.suppress(ProtocolError):
                control = Control.from_json(decode(msg.data, "control"))
                session = self._sessions.get((control.session, host))
                if session is None:
                    return
                if control.action == "start":
                    session.t0_ns = control.t0_ns
                    self.start_at[control.session][host] = time.monotonic()
                    self.t0_ns[control.session] = control.t0_ns
                else:
                    session.cancelled = True
                session.started.set()

        return on_control

    async def _send(self, session: SimulatedSession, subject: str, data: bytes, message_id: str) -> None:
        """As the real agent: for a `stored` task a JetStream publish with its message id, whose
        acknowledgement the stream sends back - the server does what it does for 10,000 real agents - but
        counted on one subscription per connection rather than awaited one by one: a real agent awaits its
        own on its own machine; 10,000 awaits in this one process would measure the simulator."""
        if not session.task.stored:
            await session.client.publish(subject, data)
            return
        inbox = self._acks_inbox[id(session.client)]
        await session.client.publish(subject, data, reply=inbox, headers={"Nats-Msg-Id": message_id})
        self.sent += 1

    async def _status(self, session: SimulatedSession, state: Any, reason: str = "", **extra: Any) -> None:
        session.statuses += 1
        task, host = session.task, session.host
        status = HostStatus(host, task.session, state, reason, 0, batches=session.batches, **extra)
        if state in ("preparing", "running"):  # progress, stored by no stream (as the real agent's)
            await session.client.publish(progress_subject(task.session, host), status.encode())
            return
        message_id = f"{task.session}.{host}.status.{session.statuses}"
        await self._send(session, status_subject(task.session, host), status.encode(), message_id)

    @staticmethod
    def _drop_record(host: str, now_ns: int, sport: int) -> dict[str, Any]:
        """A drop record as the real `drops` diagnostic writes it (its declared schema, record_schemas)."""
        return {
            "type": "drop",
            "v": 1,
            "time": _iso(now_ns),
            "reason": "NETFILTER_DROP",
            "reason_code": 8,
            "location": "nf_hook_slow+0x9a",
            "family": 2,
            "proto": "tcp",
            "saddr": "198.18.0.5",
            "sport": sport,
            "daddr": "198.18.2.7",
            "dport": 8080,
            "length": 60,
            "netns": 4026532000,
            "netns_name": host,
            "ifname": "eth0",
            "ifindex": 2,
            "cpu": 0,
            "sk_state": None,
            "pid": None,
            "comm": "swapper/0",
            "owner": "kernel",
            "container": None,
        }

    async def _play(self, session: SimulatedSession) -> None:
        task, host = session.task, session.host
        await self._status(session, "preparing")
        if self.prepare_s:
            await asyncio.sleep(self.prepare_s)
        await self._status(session, "ready")
        self.ready_at[task.session][host] = time.monotonic()
        try:
            await asyncio.wait_for(session.started.wait(), max(0.1, task.expires_at - time.time()))
        except TimeoutError:
            await self._status(session, "ended", "start_timeout: no start came before the task expired")
            return
        if session.cancelled:
            await self._status(session, "ended", "cancelled")
            self.ended_at[task.session][host] = time.monotonic()
            return
        await asyncio.sleep(max(0.0, (session.t0_ns - time.time_ns()) / 1e9))
        await self._status(session, "running", start_skew_ns=time.time_ns() - session.t0_ns)
        self.running_at[task.session][host] = time.monotonic()
        sent = 0
        batches = max(1, -(-self.records // self.batch_records))
        gap = task.deadline_s / (batches + 1)
        subject = records_subject(task.session, host)
        for seq in range(batches):
            await asyncio.sleep(gap)
            if session.cancelled:
                break
            count = min(self.batch_records, self.records - sent)
            now = time.time_ns()
            records = [
                self._drop_record(host, now, port) for port in range(40000 + sent, 40000 + sent + count)
            ]
            batch = RecordBatch(host, task.session, seq, records).encode()
            await self._send(session, subject, batch, f"{task.session}.{host}.records.{seq}")
            session.batches += 1
            sent += count
        await asyncio.sleep(max(0.0, (session.t0_ns + task.deadline_s * 1e9 - time.time_ns()) / 1e9))
        totals = {"seen": sent, "total": sent, "emitted": sent, "sampled": 0, "lost": 0, "ungrouped": 0}
        wall, mono = time.time_ns(), time.monotonic_ns()
        summary = {
            "type": "summary",
            "v": 1,
            "diagnostic": task.diagnostic,
            **totals,
            "attach": "simulated",
            "interrupted": session.cancelled,
            "clock": {"monotonic_ns": mono, "wall_ns": wall, "offset_ns": wall - mono},
            "groups": [],
        }
        summary_batch = RecordBatch(host, task.session, batches, [summary]).encode()
        await self._send(session, subject, summary_batch, f"{task.session}.{host}.records.{batches}")
        session.batches += 1
        reason = "cancelled" if session.cancelled else f"duration: ran for its {task.deadline_s:g} s"
        await self._status(
            session, "ended", reason, totals=totals, lost=0, sampled=0, events=sent,
            sent_bytes=len(json.dumps(summary)) * sent,
        )  # fmt: skip
        self.ended_at[task.session][host] = time.monotonic()
        self._sessions.pop((task.session, host), None)
