"""The controller's NATS side: the connection, the JetStream streams and KV bucket it owns, and one way to
read a stream back.

The controller creates (idempotently) everything the fleet keeps in JetStream, so agents never need the
permission to create anything and no admin has to:

- NETSLEUTH_AUDIT, the controller's decisions (`netsleuth.audit.controller.>`): deny delete and deny purge
  (a record cannot be taken back through the JetStream API once acknowledged) and no limit at all, so that
  nothing ever discards one; when the server's store is full a write fails, and the controller refuses the
  request with 503 rather than act unrecorded.
- NETSLEUTH_AUDIT_AGENTS, the agents' refusals (`netsleuth.audit.agent.<host>`): deny delete and purge too,
  and bounded so that one agent cannot fill the store the controller's records need: a record is at most
  AGENT_AUDIT_MAX_RECORD bytes (larger ones are refused), each host's subject keeps its newest
  `audit.agent_records_per_host` records (a flooding agent discards only its own oldest), and the stream
  keeps `audit.agent_max_bytes` in all (the oldest agent records go first), which nats-server reserves in
  its store when the stream is created.
- NETSLEUTH_SESSIONS, the session history (max_age retention, one message per subject: the latest snapshot).
- NETSLEUTH_STATUS, each host's latest status of each session (`netsleuth.session.*.*.status`, what the
  agents publish anyway): what a controller that restarted mid-session reads back. Bounded in bytes (agents
  write it): a flood of statuses for made-up sessions can only push out other statuses, never the audit.
- NETSLEUTH_RECORDS, every record batch of every session (`netsleuth.session.*.*.records`, what the agents
  publish anyway, acknowledged: fleet/outbox.py): what a controller merges from when its own server died
  mid-session or it took a session over from another controller. Bounded in bytes (reserved in the store,
  `sessions.records_max_bytes`), the oldest go first; a batch sent twice is stored once (Nats-Msg-Id).
- the host registry bucket the agents write their heartbeats to.
- the session leases (`netsleuth_session_owners`, a KV bucket whose max age is `sessions.lease_seconds`):
  which controller runs each session (leases.py).

Each is created with `nats.replicas` copies (3 on a three-server cluster: a server and its disk may be lost).

An existing stream is never changed (the controller's NATS user may not: nats_config.py): one that differs
from what this controller would create is kept when it still holds what the fleet relies on, and is one
sentence naming what an admin must change otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError, NotFoundError, ServerError

from netsleuth.controller.config import ControllerConfig
from netsleuth.controller.leases import ensure_owners_bucket
from netsleuth.fleet.host_registry import ensure_hosts_bucket
from netsleuth.fleet.link_config import login_identity, login_refused, lone_reset
from netsleuth.fleet.protocol import (
    AGENT_AUDIT_MAX_RECORD,
    AGENT_AUDIT_STREAM,
    AGENT_AUDIT_SUBJECTS,
    AUDIT_STREAM,
    AUDIT_SUBJECTS,
    HOSTS_BUCKET,
    RECORDS_STREAM,
    RECORDS_SUBJECTS,
    SESSIONS_STREAM,
    SESSIONS_SUBJECTS,
    STATUS_STREAM,
    STATUS_SUBJECTS,
)

__all__ = [
    "LoginRefused",
    "RenewableWatch",
    "StreamProblem",
    "connect_nats",
    "ensure_streams",
    "patiently",
    "read_stream",
    "stream_batches",
]

_log = logging.getLogger("netsleuth.controller")


_STATUS_MAX_BYTES = 64 << 20  # NETSLEUTH_STATUS: a status is ~0.5 KiB, so ~100,000 host-sessions
_STATUS_MAX_MSG = 64 << 10
_DUPLICATE_WINDOW_S = 120.0  # above the agents' outbox give-up (60 s): a resend is always recognised
_INSUFFICIENT_STORAGE = 10047  # JetStream's "insufficient storage resources available"
_NO_MESSAGE = 10037  # JetStream's "no message found" (vs 10059, "stream not found")


class LoginRefused(Exception):
    """NATS said no to the controller's credentials on its first connect."""


class StreamProblem(Exception):
    """A stream the controller relies on exists in a shape it cannot use; str() says what an admin must do."""


async def connect_nats(
    config: ControllerConfig, on_reconnect: Callable[[], None] | None = None
) -> NatsClient:
    """Connects once (raises on failure, so start-up says why) and then reconnects forever by itself;
    `on_reconnect` runs each time the connection comes back (the registry watches again at once)."""
    connected = False
    last_error: Exception | None = None  # nats-py's, for on_error
    options: dict[str, Any] = {
        # Every server of a cluster: when the one it is on dies, the client goes on with another (and with
        # any other member the servers announce).
        "servers": list(config.nats.urls),
        "name": "netsleuth-controller",
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 3,
        "allow_reconnect": True,
        # A server that stops answering without closing the connection is left after two missed pings.
        "ping_interval": 10,
        "max_outstanding_pings": 2,
    }
    if config.nats.user is not None:
        options["user"] = config.nats.user
        options["password"] = config.nats.password or ""
    if config.nats.creds_file is not None:
        options["user_credentials"] = config.nats.creds_file
    if config.nats.nkey_seed_file is not None:
        options["nkeys_seed"] = config.nats.nkey_seed_file

    async def on_error(error: Exception) -> None:
        nonlocal last_error
        before, last_error = last_error, error
        if not connected and login_refused(error):
            # nats-py retries a refused first login for ever (max_reconnect_attempts=-1): raised from here, it
            # ends connect(), and start-up says which identity was refused instead of hanging.
            login = config.nats
            identity = login_identity("nats", login.user, login.creds_file, login.nkey_seed_file)
            raise LoginRefused(f"it refused the login of {identity}") from error
        if not lone_reset(error, before):
            _log.warning("NATS: %s", error)

    async def reconnected() -> None:
        server = client.connected_url.netloc if client.connected_url else config.nats.url
        _log.info("NATS: reconnected to %s", server)
        if on_reconnect is not None:
            on_reconnect()

    client = NatsClient()
    try:
        await client.connect(error_cb=on_error, reconnected_cb=reconnected, **options)
    except LoginRefused:
        with contextlib.suppress(Exception):
            await client.close()
        raise
    connected = True
    return client


# What an existing stream must still hold for the controller to use it: None, or what is missing.
Requirement = Callable[[js_api.StreamConfig], "str | None"]


def _append_only(config: js_api.StreamConfig) -> str | None:
    return None if config.deny_delete and config.deny_purge else "it allows deleting or purging records"


def _captures_only(subject: str) -> Requirement:
    def check(config: js_api.StreamConfig) -> str | None:
        if list(config.subjects or []) != [subject]:
            # An older netsleuth's single audit stream took netsleuth.audit.>, the agents' records with it.
            return f"it captures {', '.join(config.subjects or [])}, not only {subject}"
        return None

    return check


def _bounded(config: js_api.StreamConfig) -> str | None:
    if (config.max_bytes or -1) <= 0 or (config.max_msg_size or -1) <= 0:
        return "it has no byte limit or no record size limit, so agents could fill the store with it"
    return None


def _per_host(config: js_api.StreamConfig) -> str | None:
    if (config.max_msgs_per_subject or -1) <= 0:
        return "it keeps any number of records per host, so one agent could push out every other's"
    return None


async def _ensure_stream(
    js: JetStreamContext, stream: js_api.StreamConfig, requirements: tuple[Requirement, ...] = ()
) -> None:
    """Create the stream if missing; an existing one is used as it is when it still holds what the fleet
    relies on (`requirements`), and said to be weaker than asked (fewer replicas) in the log."""
    name = str(stream.name)
    try:
        # Asked first, not created "idempotently": nats-server checks a create's storage reservation before
        # it compares the configuration, so re-creating a reserved stream needs its bytes free a second time.
        info = await js.stream_info(name)
    except NotFoundError:
        try:
            await js.add_stream(stream)
            return
        except ServerError as error:
            if error.err_code == _INSUFFICIENT_STORAGE:
                wanted = f" (it reserves {stream.max_bytes} bytes)" if stream.max_bytes else ""
                raise StreamProblem(
                    f"nats-server's JetStream store has no room for stream {name}{wanted}: raise the "
                    "server's jetstream max_file_store, or lower the controller's audit.agent_max_bytes (the "
                    f"bytes reserved for the agents' audit records, {AGENT_AUDIT_STREAM}) or "
                    f"sessions.records_max_bytes (the session records kept, {RECORDS_STREAM})"
                ) from None
            raise
        except BadRequestError as error:
            try:  # another controller created it meanwhile, or its subjects overlap another stream's
                info = await js.stream_info(name)
            except NotFoundError:
                raise StreamProblem(
                    f"stream {name} cannot be created ({error.description or error}): another stream already "
                    f"captures {', '.join(stream.subjects or [])}; an admin must narrow its subjects"
                ) from None
    problems = [problem for check in requirements if (problem := check(info.config)) is not None]
    if problems:
        raise StreamProblem(
            f"stream {name} exists, but {'; '.join(problems)}: an admin must change it (e.g. `nats stream "
            f"edit {name}`), the controller may not"
        )
    if info.config.subjects != stream.subjects or stream.max_bytes not in (None, info.config.max_bytes):
        _log.warning("stream %s kept with its existing configuration (only an admin may change it)", name)
    _check_replicas(info, stream.num_replicas or 1)


def _check_replicas(info: js_api.StreamInfo, wanted: int) -> None:
    name, has = info.config.name, info.config.num_replicas or 1
    if has < wanted:
        # Made before the cluster (or with replicas = 1): still usable, but a lost server loses it.
        _log.warning(
            "stream %s has %d replica(s), not the %d of nats.replicas: an admin must raise it (`nats stream "
            "edit %s --replicas %d`), the controller may not",
            name, has, wanted, name, wanted,
        )  # fmt: skip


async def ensure_streams(js: JetStreamContext, config: ControllerConfig) -> None:
    """Create what is missing, each with `nats.replicas` copies; raises StreamProblem (one sentence) for a
    stream the fleet cannot rely on."""
    replicas = config.nats.replicas
    await _ensure_stream(
        js,
        js_api.StreamConfig(
            name=AUDIT_STREAM,
            subjects=[AUDIT_SUBJECTS],
            storage=js_api.StorageType.FILE,
            num_replicas=replicas,
            deny_delete=True,
            deny_purge=True,
            retention=js_api.RetentionPolicy.LIMITS,
        ),
        (_append_only, _captures_only(AUDIT_SUBJECTS)),
    )
    await _ensure_stream(
        js,
        js_api.StreamConfig(
            name=AGENT_AUDIT_STREAM,
            subjects=[AGENT_AUDIT_SUBJECTS],
            storage=js_api.StorageType.FILE,
            num_replicas=replicas,
            deny_delete=True,
            deny_purge=True,
            retention=js_api.RetentionPolicy.LIMITS,
            discard=js_api.DiscardPolicy.OLD,
            max_msg_size=AGENT_AUDIT_MAX_RECORD,
            max_msgs_per_subject=config.audit.agent_records_per_host,
            max_bytes=config.audit.agent_max_bytes,
        ),
        (_append_only, _bounded, _per_host),
    )
    await _ensure_stream(
        js,
        js_api.StreamConfig(
            name=SESSIONS_STREAM,
            subjects=[SESSIONS_SUBJECTS],
            storage=js_api.StorageType.FILE,
            num_replicas=replicas,
            max_age=config.sessions.history_max_age,
            max_msgs_per_subject=1,  # netsleuth.history.<id>: the latest snapshot of each session
            max_msg_size=1 << 20,  # nats-server's max_payload (nats_config) bounds it anyway
        ),
    )
    await _ensure_stream(
        js,
        js_api.StreamConfig(
            name=STATUS_STREAM,
            subjects=[STATUS_SUBJECTS],
            storage=js_api.StorageType.FILE,
            num_replicas=replicas,
            discard=js_api.DiscardPolicy.OLD,
            max_age=config.sessions.history_max_age,
            max_msgs_per_subject=1,  # netsleuth.session.<id>.<host>.status: that host's latest
            max_msg_size=_STATUS_MAX_MSG,
            max_bytes=_STATUS_MAX_BYTES,
            duplicate_window=_DUPLICATE_WINDOW_S,
        ),
        (_bounded,),
    )
    await _ensure_stream(
        js,
        js_api.StreamConfig(
            name=RECORDS_STREAM,
            subjects=[RECORDS_SUBJECTS],
            storage=js_api.StorageType.FILE,
            num_replicas=replicas,
            discard=js_api.DiscardPolicy.OLD,
            max_age=config.sessions.history_max_age,
            max_msg_size=1 << 20,
            max_bytes=config.sessions.records_max_bytes,
            duplicate_window=_DUPLICATE_WINDOW_S,
        ),
        (_bounded,),
    )
    await ensure_owners_bucket(js, config.sessions.lease_seconds, replicas)
    try:
        _check_replicas(await js.stream_info(f"KV_{HOSTS_BUCKET}"), replicas)
    except NotFoundError:
        await ensure_hosts_bucket(
            js, replicas
        )  # the agents' registry: they may write their key, not create it


async def read_stream(js: JetStreamContext, stream: str, subject: str, **options: Any) -> list[Msg]:
    """Every message of `stream` on `subject` (from `since`, or the last of each subject), in order,
    through an ephemeral pull consumer that acknowledges nothing (reading changes nothing in the stream);
    `options` are stream_batches'."""
    found: list[Msg] = []
    async for messages in stream_batches(js, stream, subject, **options):
        found.extend(messages)
    return found


_T = TypeVar("_T")


class RenewableWatch:
    """A watch that runs for ever (`_follow`, a subclass's), again from the start whenever `renew()` is
    called (NATS reconnected: a restarted server lost the watch's consumer, which nats-py would notice only
    after missed heartbeats), and again after a second when it fails (NATS down, JetStream not back yet).
    `start` waits up to `timeout` for the first full read (`synced`)."""

    what = "watch"

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._renew = asyncio.Event()
        self.synced = asyncio.Event()

    async def _follow(self) -> None:
        raise NotImplementedError

    async def start(self, timeout: float = 5.0) -> None:
        self._task = asyncio.create_task(self._watch(), name=self.what)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.synced.wait(), timeout=timeout)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def renew(self) -> None:
        self._renew.set()

    async def _watch(self) -> None:
        while True:
            self._renew.clear()
            following = asyncio.create_task(self._follow())
            renewing = asyncio.create_task(self._renew.wait())
            try:
                await asyncio.wait({following, renewing}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (following, renewing):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            if following.done() and not following.cancelled() and following.exception() is not None:
                _log.warning("%s: %s; watching again", self.what, following.exception() or "failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._renew.wait(), timeout=1)


async def patiently(call: Callable[[], Awaitable[_T]], give_up: float) -> _T:
    """A JetStream API call, tried again while it times out (a stream electing its leader, a server just
    back) until `give_up` (monotonic)."""
    while True:
        try:
            return await call()
        except NatsTimeoutError:
            if time.monotonic() > give_up:
                raise
        await asyncio.sleep(0.25)


async def stream_batches(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    last_per_subject: bool = False,
    since: datetime.datetime | None = None,
    start_seq: int | None = None,
    batch: int = 256,
    timeout: float = 2.0,
    catch_up: float = 5.0,
) -> AsyncIterator[list[Msg]]:
    """read_stream, a batch at a time (a big session's records need not all be in memory at once).

    Complete as of the call, also on a cluster where a server has just come back: the server places a
    reading consumer on any replica of the stream, and one still catching up reads its own copy, without
    what was stored while it was away (a read right after a restart lacked the last audit record; such a
    consumer is not told of what its replica catches up on). So the stream's leader is asked first for the
    last message the filter matches now, and when a consumer ends short of it the reading goes on from
    where it stopped with a new consumer (placed anew), for `catch_up` seconds at most - then what came is
    returned, and the log says so. A replica holds every message up to the last it has: reaching the
    leader's last sequence means nothing before it is missing."""
    give_up = time.monotonic() + catch_up
    try:
        last = (await patiently(lambda: js.get_msg(stream, subject=subject), give_up)).seq or 0  # leader's
    except NotFoundError as error:
        if error.err_code == _NO_MESSAGE:
            return  # nothing matches
        raise  # no such stream
    if last_per_subject:
        policy = js_api.DeliverPolicy.LAST_PER_SUBJECT
    elif since is not None:
        policy = js_api.DeliverPolicy.BY_START_TIME
    elif start_seq is not None:
        policy = js_api.DeliverPolicy.BY_START_SEQUENCE
    else:
        policy = js_api.DeliverPolicy.ALL
    reached = 0
    while True:
        if reached:  # the rest, after what a consumer on a lagging replica gave
            policy, start_seq = js_api.DeliverPolicy.BY_START_SEQUENCE, reached + 1
        consumer = js_api.ConsumerConfig(
            deliver_policy=policy,
            opt_start_time=since.astimezone(datetime.UTC)
            if policy == js_api.DeliverPolicy.BY_START_TIME and since
            else None,
            opt_start_seq=start_seq if policy == js_api.DeliverPolicy.BY_START_SEQUENCE else None,
            ack_policy=js_api.AckPolicy.NONE,
            filter_subject=subject,
            inactive_threshold=30.0,
            max_ack_pending=-1,
        )
        subscription = await patiently(
            functools.partial(js.pull_subscribe, subject, stream=stream, config=consumer), give_up
        )
        try:
            while True:
                try:
                    fetched = await subscription.fetch(batch, timeout=timeout)
                except TimeoutError:
                    break
                if fetched:
                    reached = max(reached, fetched[-1].metadata.sequence.stream or 0)
                    yield fetched
                if not fetched or fetched[-1].metadata.num_pending == 0:
                    break
        finally:
            # If this fails, the consumer expires by itself (inactive_threshold).
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        if reached >= last:
            return
        if time.monotonic() > give_up:
            _log.warning(
                "read %s up to #%d of #%d: its replicas were still catching up", stream, reached, last
            )
            return
        await asyncio.sleep(0.25)
