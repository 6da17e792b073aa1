"""Which controller runs a session: a lease in a JetStream KV bucket, decided by the server, not by us.

The bucket `netsleuth_session_owners` keeps one key per running session, whose value is the id of the
controller that runs it, and the bucket's max age (`sessions.lease_seconds`) makes the server forget a key
that nobody renews. The controller that creates a session takes its key with a create (a compare-and-set
on "no such key": only one create of a key succeeds), and renews it every quarter of the lease with an
update at the revision it holds (another compare-and-set). If it dies, its keys expire on the server's
clock - no controller's clock is compared with another's - and the first other controller whose create
succeeds runs the session from then on. A controller that finds its revision moved on (it stalled longer
than the lease and another took over) stops running that session at once: the revision is the fencing
token. No election, no leader: each session has its own owner, and any controller can be one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BadRequestError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from netsleuth.fleet.protocol import OWNERS_BUCKET

__all__ = ["LeaseLost", "Leases", "controller_instance", "ensure_owners_bucket"]

_log = logging.getLogger("netsleuth.controller")


def controller_instance() -> str:
    """This controller process, as its leases name it (a restart is another instance)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class LeaseLost(Exception):
    """Another controller runs the session now (this one stalled past the lease, or never had it)."""


async def ensure_owners_bucket(js: JetStreamContext, lease_seconds: float, replicas: int) -> KeyValue:
    """The bucket, created if missing. One made with another max age is used as it is (the controller's
    login may not change it), and the log says so: its age is every controller's lease."""
    try:
        bucket = await js.key_value(OWNERS_BUCKET)
    except (NotFoundError, BadRequestError):
        config = KeyValueConfig(
            bucket=OWNERS_BUCKET, history=1, ttl=lease_seconds, storage=StorageType.FILE, replicas=replicas
        )
        return await js.create_key_value(config)
    info = await js.stream_info(f"KV_{OWNERS_BUCKET}")
    if abs((info.config.max_age or 0) - lease_seconds) > 0.001:
        _log.warning(
            "bucket %s expires leases after %g s, not the %g s of sessions.lease_seconds: an admin must "
            "change it, the controller may not",
            OWNERS_BUCKET, info.config.max_age or 0, lease_seconds,
        )  # fmt: skip
    return bucket


class Leases:
    def __init__(self, kv: KeyValue, instance: str) -> None:
        self._kv = kv
        self.instance = instance
        self._revisions: dict[str, int] = {}

    def held(self, session_id: str) -> bool:
        return session_id in self._revisions

    async def take(self, session_id: str) -> bool:
        """True when this controller now runs the session (nobody held it, or the holder's lease ran out)."""
        try:
            self._revisions[session_id] = await self._kv.create(session_id, self.instance.encode())
        except KeyWrongLastSequenceError:
            return await self._ours_after_all(session_id)
        return True

    async def _ours_after_all(self, session_id: str) -> bool:
        """A compare-and-set refused because of this controller's own write, whose acknowledgement was lost
        (a busy server timed it out, and it was stored): the key names this instance, at a newer revision."""
        with contextlib.suppress(Exception):
            entry = await self._kv.get(session_id)
            if entry.value == self.instance.encode() and entry.revision is not None:
                self._revisions[session_id] = entry.revision
                return True
        return False

    async def renew(self, session_id: str) -> None:
        """Raises LeaseLost when another controller took the session over."""
        revision = self._revisions.get(session_id)
        if revision is None:
            raise LeaseLost(f"session {session_id} is not run here")
        try:
            self._revisions[session_id] = await self._kv.update(
                session_id, self.instance.encode(), last=revision
            )
            return
        except KeyWrongLastSequenceError:
            pass
        # The key moved on: this controller's own renewal whose acknowledgement was lost, or it expired (this
        # controller stalled past the lease) - then taking it again works unless another controller did.
        if await self._ours_after_all(session_id):
            return
        if not await self.take(session_id):
            self._revisions.pop(session_id, None)
            raise LeaseLost(f"session {session_id} is run by another controller now")
        _log.warning("session %s: its lease had run out; taken again", session_id)

    async def release(self, session_id: str) -> None:
        """The session ended here (or this controller stops): another may take it at once."""
        revision = self._revisions.pop(session_id, None)
        if revision is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(session_id, last=revision)

    async def holder(self, session_id: str) -> str | None:
        with contextlib.suppress(Exception):
            entry = await self._kv.get(session_id)
            return entry.value.decode() if entry.value else None
        return None
