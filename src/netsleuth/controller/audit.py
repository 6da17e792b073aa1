"""The audit trail: one JetStream message per decision, acknowledged by the server before the controller acts.

`record()` returns only once the stream stored the message (a JetStream publish waits for the ack), so a task
is never sent for a decision that is not on disk. If the audit stream cannot be written the controller refuses
the request (503): no audit, no diagnosis. Agents report their own refusals on `netsleuth.audit.agent.<host>`
into the same stream.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext

from netsleuth.controller.streams import read_stream
from netsleuth.fleet.protocol import AUDIT_STREAM

__all__ = ["AuditLog", "AuditQuery", "AuditUnavailable"]

_CONTROLLER_SUBJECT = "netsleuth.audit.controller"


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
    ) -> int:
        """Writes one record and returns its stream sequence; raises AuditUnavailable when not stored."""
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
        try:
            ack = await self._js.publish(
                f"{_CONTROLLER_SUBJECT}.{decision}", json.dumps(body).encode(), timeout=self._timeout
            )
        except Exception as error:  # any failure means "not stored", which is what matters
            raise AuditUnavailable(
                f"the audit stream did not store the record ({error or type(error).__name__})"
            ) from error
        return int(ack.seq)

    async def query(self, query: AuditQuery) -> list[dict[str, Any]]:
        start_seq = None
        if query.since is None and query.user is None and query.decision is None:
            # The newest `limit` records need only the stream's tail, however long the trail is. (A filtered
            # query reads from `since`: pass one on a long trail.)
            state = (await self._js.stream_info(AUDIT_STREAM)).state
            start_seq = max(state.first_seq, state.last_seq - query.limit + 1)
        messages = await read_stream(
            self._js, AUDIT_STREAM, "netsleuth.audit.>", since=query.since, start_seq=start_seq
        )
        records: list[dict[str, Any]] = []
        for message in messages:
            try:
                body = json.loads(message.data)
            except ValueError:
                continue  # not ours (the stream takes anything on netsleuth.audit.>); nothing to show
            if not isinstance(body, dict):
                continue
            if query.user is not None and body.get("user") != query.user:
                continue
            if query.decision is not None and body.get("decision") != query.decision:
                continue
            body["seq"] = message.metadata.sequence.stream
            body.setdefault(
                "source", message.subject.split(".")[2] if message.subject.count(".") >= 2 else ""
            )
            records.append(body)
        return records[-query.limit :]
