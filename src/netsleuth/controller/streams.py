"""The controller's NATS side: the connection, the JetStream streams and KV bucket it owns, and one way to
read a stream back.

The controller creates (idempotently) the audit stream (deny delete + deny purge: an audit record cannot be
taken back through the JetStream API once acknowledged), the session history stream (max_age retention, one
message per session kept: the latest snapshot) and the host registry bucket the agents write their heartbeats
to, so agents never need the permission to create anything.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError, NotFoundError

from netsleuth.controller.config import ControllerConfig
from netsleuth.fleet.host_registry import ensure_hosts_bucket
from netsleuth.fleet.link_config import login_identity, login_refused, lone_reset
from netsleuth.fleet.protocol import (
    AUDIT_STREAM,
    AUDIT_SUBJECTS,
    HOSTS_BUCKET,
    SESSIONS_STREAM,
    SESSIONS_SUBJECTS,
)

__all__ = ["LoginRefused", "connect_nats", "ensure_streams", "read_stream"]

_log = logging.getLogger("netsleuth.controller")


class LoginRefused(Exception):
    """NATS said no to the controller's credentials on its first connect."""


async def connect_nats(config: ControllerConfig) -> NatsClient:
    """Connects once (raises on failure, so start-up says why) and then reconnects forever by itself."""
    connected = False
    last_error: Exception | None = None  # nats-py's, for on_error
    options: dict[str, Any] = {
        "servers": [config.nats.url],
        "name": "netsleuth-controller",
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 3,
        "allow_reconnect": True,
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

    async def on_reconnect() -> None:
        _log.info("NATS: reconnected to %s", config.nats.url)

    client = NatsClient()
    try:
        await client.connect(error_cb=on_error, reconnected_cb=on_reconnect, **options)
    except LoginRefused:
        with contextlib.suppress(Exception):
            await client.close()
        raise
    connected = True
    return client


async def _ensure_stream(js: JetStreamContext, stream: js_api.StreamConfig) -> None:
    try:
        await js.add_stream(stream)
        return
    except BadRequestError:
        pass  # it exists with another configuration (made by an operator, the lab or an older controller)
    try:
        await js.update_stream(stream)
    except Exception as error:
        # The controller's NATS user may not update the audit stream (nats_config denies it: only an
        # admin may loosen it). Accept the existing stream if it keeps what we rely on.
        info = await js.stream_info(str(stream.name))
        if stream.deny_delete and not (info.config.deny_delete and info.config.deny_purge):
            raise RuntimeError(
                f"stream {stream.name} exists without deny_delete/deny_purge and cannot be updated ({error})"
            ) from error
        _log.warning("stream %s kept with its existing configuration (%s)", stream.name, error)


async def ensure_streams(js: JetStreamContext, config: ControllerConfig) -> None:
    await _ensure_stream(
        js,
        js_api.StreamConfig(
            name=AUDIT_STREAM,
            subjects=[AUDIT_SUBJECTS],
            storage=js_api.StorageType.FILE,
            deny_delete=True,
            deny_purge=True,
            retention=js_api.RetentionPolicy.LIMITS,
        ),
    )
    await _ensure_stream(
        js,
        js_api.StreamConfig(
            name=SESSIONS_STREAM,
            subjects=[SESSIONS_SUBJECTS],
            storage=js_api.StorageType.FILE,
            max_age=config.sessions.history_max_age,
            max_msgs_per_subject=1,  # netsleuth.history.<id>: the latest snapshot of each session
            max_msg_size=1 << 20,  # nats-server's max_payload (nats_config) bounds it anyway
        ),
    )
    try:
        await js.key_value(HOSTS_BUCKET)
    except (NotFoundError, BadRequestError):
        await ensure_hosts_bucket(js)  # the agents' registry: they may write their key, not create it


async def read_stream(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    last_per_subject: bool = False,
    since: datetime.datetime | None = None,
    start_seq: int | None = None,
    batch: int = 256,
    timeout: float = 2.0,
) -> list[Msg]:
    """Every message of `stream` on `subject` (from `since`, or the last of each subject), in order,
    through an ephemeral pull consumer that acknowledges nothing (reading changes nothing in the stream)."""
    info = await js.stream_info(stream)
    if info.state.messages == 0:
        return []
    if last_per_subject:
        policy = js_api.DeliverPolicy.LAST_PER_SUBJECT
    elif since is not None:
        policy = js_api.DeliverPolicy.BY_START_TIME
    elif start_seq is not None:
        policy = js_api.DeliverPolicy.BY_START_SEQUENCE
    else:
        policy = js_api.DeliverPolicy.ALL
    consumer = js_api.ConsumerConfig(
        deliver_policy=policy,
        opt_start_time=since.astimezone(datetime.UTC) if since else None,
        opt_start_seq=start_seq if policy == js_api.DeliverPolicy.BY_START_SEQUENCE else None,
        ack_policy=js_api.AckPolicy.NONE,
        filter_subject=subject,
        inactive_threshold=30.0,
        max_ack_pending=-1,
    )
    subscription = await js.pull_subscribe(subject, stream=stream, config=consumer)
    messages: list[Msg] = []
    try:
        while True:
            try:
                fetched = await subscription.fetch(batch, timeout=timeout)
            except TimeoutError:
                break
            messages.extend(fetched)
            if not fetched or fetched[-1].metadata.num_pending == 0:
                break
    finally:
        # If this fails, the consumer expires by itself (inactive_threshold).
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()
    return messages
