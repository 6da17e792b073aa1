"""The audit trail: one JetStream message per decision, acknowledged by the server before the controller acts.

`record()` returns only once the stream stored the message (a JetStream publish waits for the ack), so a task
is never sent for a decision that is not on disk. If the audit stream cannot be written the controller refuses
the request (503): no audit, no diagnosis. Agents record their own refusals on `netsleuth.audit.agent.<host>`,
in a stream of their own (bounded per host: controller/streams.py), and the trail reads back as one.

Who wrote a record is its subject, never its body: only the controller's NATS login may publish on
`netsleuth.audit.controller.*` and only host H's agent on `netsleuth.audit.agent.H` (fleet/nats_config.py).
On read-back `source` ("controller" or "agent") and, for an agent's record, `host` and `hosts` are the
subject's; whatever the body said instead is kept under `claimed`, so a record an agent wrote claiming to be
the controller's reads back as that agent's, with its claim in plain view. An agent record's `time` is the
server's (when the stream stored it), its own clock's under `agent_time`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from netsleuth.controller.streams import patiently, read_stream
from netsleuth.fleet.protocol import AGENT_AUDIT_STREAM, AUDIT_STREAM

__all__ = ["AuditLog", "AuditQuery", "AuditUnavailable", "audit_record"]

_CONTROLLER_SUBJECT = "netsleuth.audit.controller"
_STREAMS = (AUDIT_STREAM, AGENT_AUDIT_STREAM)


class AuditUnavailable(Exception):
    """The audit stream did not acknowledge: the action must not happen."""


@dataclass(frozen=True)
class AuditQuery:
    user: str | None = None
    decision: str | None = None
    since: datetime.datetime | None = None
    limit: int = 200


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


class AuditLog:
    def __init__(self, js: JetStreamContext, timeout: float = 3.0) -> None:
        self._js = js
        self._timeout = timeout

    async def record(
        self,
        *,
        user: str | None,
        action: str,
        decision: str,
        reason: str = "",
        status: int | None = None,
        session: str | None = None,
        diagnostic: str | None = None,
        hosts: list[str] | None = None,
        scope: dict[str, Any] | None = None,
        outcome: str | None = None,
        remote: str | None = None,
        extra: dict[str, Any] | None = None,
        patience: float = 0.0,
    ) -> int:
        """Writes one record and returns its stream sequence; raises AuditUnavailable when not stored.
        `patience`: seconds to keep trying (a record of what already happened - a session's end - is worth
        waiting for while a cluster elects the stream's leader or the controller reconnects)."""
        body: dict[str, Any] = {
            "time": now_iso(),
            "user": user,
            "action": action,
            "decision": decision,
            "reason": reason,
            "status": status,
            "session": session,
            "diagnostic": diagnostic,
            "hosts": hosts or [],
            "scope": scope or {},
            "outcome": outcome,
            "remote": remote,
            **(extra or {}),
        }
        data = json.dumps(body).encode()
        # One message id for every try: a record whose acknowledgement was lost is stored once.
        headers = {"Nats-Msg-Id": f"audit-{secrets.token_hex(12)}"}
        give_up = time.monotonic() + patience
        while True:
            try:
                ack = await self._js.publish(
                    f"{_CONTROLLER_SUBJECT}.{decision}", data, timeout=self._timeout, headers=headers
                )
                return int(ack.seq)
            except Exception as error:  # any failure means "not stored", which is what matters
                if time.monotonic() >= give_up:
                    raise AuditUnavailable(
                        f"the audit stream did not store the record ({error or type(error).__name__})"
                    ) from error
            await asyncio.sleep(0.5)

    async def query(self, query: AuditQuery) -> list[dict[str, Any]]:
        """The controller's and the agents' records, in the order the server stored them, newest last."""
        found: list[tuple[datetime.datetime, int, int, dict[str, Any]]] = []
        for rank, stream in enumerate(_STREAMS):
            for message in await self._read(stream, query):
                record = audit_record(message)
                if query.user is not None and record.get("user") != query.user:
                    continue
                if query.decision is not None and record.get("decision") != query.decision:
                    continue
                metadata = message.metadata
                found.append((metadata.timestamp, rank, metadata.sequence.stream, record))
        found.sort(key=lambda item: item[:3])
        return [record for *_order, record in found[-query.limit :]]

    async def _read(self, stream: str, query: AuditQuery) -> list[Msg]:
        start_seq = None
        try:
            if query.since is None and query.user is None and query.decision is None:
                # The newest `limit` records need only each stream's tail, however long the trail is. (A
                # filtered query reads from `since`: pass one on a long trail.)
                info = await patiently(lambda: self._js.stream_info(stream), time.monotonic() + 5)
                state = info.state
                start_seq = max(state.first_seq, state.last_seq - query.limit + 1)
            return await read_stream(
                self._js, stream, "netsleuth.audit.>", since=query.since, start_seq=start_seq
            )
        except NotFoundError:
            if stream == AUDIT_STREAM:
                raise
            return []  # no agent has a stream of records yet (a controller older than this one made the rest)


def _writer(subject: str) -> tuple[str, str | None]:
    """(source, host) of an audit subject: what the NATS permissions tie to the publisher."""
    parts = subject.split(".")
    if len(parts) == 4 and parts[:3] == ["netsleuth", "audit", "agent"]:
        return "agent", parts[3]
    if len(parts) >= 3 and parts[:3] == ["netsleuth", "audit", "controller"]:
        return "controller", None
    return "unknown", None  # on an audit stream's subjects, but neither (an admin's own publish)


def audit_record(message: Msg) -> dict[str, Any]:
    """One stored message as the trail shows it: who wrote it from its subject, its sequence, and what its
    body claimed otherwise."""
    source, host = _writer(message.subject)
    stored = message.metadata.timestamp.astimezone(datetime.UTC).isoformat(timespec="microseconds")
    try:
        body = json.loads(message.data)
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        # Shown, not skipped: what an agent wrote is in its trail even when it is not a record.
        body = {"time": stored, "action": "unreadable", "reason": f"{len(message.data)} bytes that are not a "
                "JSON object"}  # fmt: skip
    truth: dict[str, Any] = {"source": source}
    if host is not None:
        truth.update(host=host, hosts=[host])
    claimed = {key: body[key] for key, value in truth.items() if key in body and body[key] != value}
    if source == "controller":
        # The controller's records name hosts in `hosts` only; a `host` would be a claim about a writer.
        claimed.update({"host": body.pop("host")} if "host" in body else {})
    for key in claimed:
        body.pop(key, None)
    record = {**body, **truth}
    if claimed:
        record["claimed"] = claimed
    if source != "controller":
        if "time" in body and body["time"] != stored:
            record["agent_time"] = body["time"]
        record["time"] = stored  # the server's clock: an agent's own may be wrong, or chosen
    record["seq"] = message.metadata.sequence.stream
    return record
