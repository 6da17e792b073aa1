"""A session's state in JetStream, where every controller reads it: what lets any controller answer for any
session, and finish one whose controller died.

Everything is in the NETSLEUTH_SESSIONS stream (replicated like the others, `netsleuth.history.>`, one
message kept per subject: the latest), under `netsleuth.history.<id>.`:

    spec          the authorised request: user, diagnostic, config, scope, duration, hosts, created
    summary       the session for listings (its state; hosts, capped for big sessions), at each phase
    t0            T0 and each host's clock offset (ns) and round trip, written before any host is started
    decided.<h>   a host the controller itself decided (failed: not ready, stopped answering, no end ...)
    cancel        who asked to cancel it (any controller may be asked; the one running it acts)
    result.<n>    the ended session as JSON, zlib-compressed, in chunks under NATS's message size ...
    done          ... and, once every chunk is stored, how many there are, their size and sha256

What the hosts said is in NETSLEUTH_STATUS and NETSLEUTH_RECORDS (streams.py). Which controller runs a
session is not here but in a lease (leases.py). Nothing here is believed about hosts: a host's own words
are only the statuses and records on its own subjects.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import zlib
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from netsleuth.controller.fleet_session import SUMMARY_HOSTS, SessionSpec
from netsleuth.controller.streams import read_stream
from netsleuth.fleet.protocol import SESSIONS_STREAM, Scope

__all__ = ["SessionStore", "StoredSpec", "StoredT0", "history_subject", "summary_of"]

_CHUNK = 900 << 10  # under max_payload (1 MiB) with room for headers


def history_subject(session_id: str, part: str) -> str:
    return f"netsleuth.history.{session_id}.{part}"


@dataclass(frozen=True)
class StoredSpec:
    """The session's authorised request as stored: what another controller runs or shows it from."""

    id: str
    request: SessionSpec
    created_ns: int

    def to_json(self) -> dict[str, Any]:
        request = self.request
        return {
            "id": self.id,
            "user": request.user,
            "diagnostic": request.diagnostic,
            "config": request.config,
            "scope": request.scope.to_json(),
            "duration": request.duration,
            "hosts": list(request.hosts),
            "created_ns": self.created_ns,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> StoredSpec:
        request = SessionSpec(
            user=str(body["user"]),
            diagnostic=str(body["diagnostic"]),
            config=dict(body.get("config") or {}),
            scope=Scope.from_json(body.get("scope") or {}),
            duration=float(body["duration"]),
            hosts=tuple(str(host) for host in body["hosts"]),
        )
        return cls(str(body["id"]), request, int(body["created_ns"]))


@dataclass(frozen=True)
class StoredT0:
    t0_ns: int
    offsets: dict[str, tuple[int | None, int | None]]  # host -> (offset_ns, rtt_ns)


def summary_of(body: dict[str, Any]) -> dict[str, Any]:
    """A session for lists: no timeline, verdicts counted, and the hosts capped (a 10,000-host session's
    views would not fit a message): the ones not ended first, the rest counted by state."""
    entry = {key: value for key, value in body.items() if key not in ("timeline", "verdicts")}
    entry["verdicts_count"] = len(body.get("verdicts") or [])
    hosts = body.get("hosts") or {}
    entry["hosts_total"] = len(hosts)
    if len(hosts) > SUMMARY_HOSTS:
        by_state: dict[str, int] = {}
        for view in hosts.values():
            by_state[str(view.get("state"))] = by_state.get(str(view.get("state")), 0) + 1
        shown = sorted(hosts, key=lambda host: (hosts[host].get("state") == "ended", host))[:SUMMARY_HOSTS]
        entry["hosts"] = {host: hosts[host] for host in shown}
        entry["hosts_by_state"] = by_state
    return entry


class SessionStore:
    def __init__(self, js: JetStreamContext, timeout: float = 5.0) -> None:
        self._js = js
        self._timeout = timeout

    async def _put(self, session_id: str, part: str, body: dict[str, Any] | bytes) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        await self._js.publish(history_subject(session_id, part), data, timeout=self._timeout)

    async def _get(self, session_id: str, part: str) -> dict[str, Any] | None:
        try:
            message = await self._js.get_last_msg(SESSIONS_STREAM, history_subject(session_id, part))
        except NotFoundError:
            return None
        body = json.loads(message.data) if message.data else None
        return body if isinstance(body, dict) else None

    # -- writes (the controller running the session) ---------------------------------------------------
    async def save_spec(self, spec: StoredSpec) -> None:
        await self._put(spec.id, "spec", spec.to_json())

    async def save_summary(self, summary: dict[str, Any]) -> None:
        """`summary`: summary_of(the session's body)."""
        await self._put(str(summary["id"]), "summary", summary)

    async def save_t0(self, session_id: str, t0: StoredT0) -> None:
        offsets = {host: list(pair) for host, pair in t0.offsets.items()}
        await self._put(session_id, "t0", {"t0_ns": t0.t0_ns, "offsets": offsets})

    async def save_decision(self, session_id: str, host: str, state: str, reason: str) -> None:
        await self._put(session_id, f"decided.{host}", {"state": state, "reason": reason})

    async def request_cancel(self, session_id: str, user: str) -> None:
        await self._put(session_id, "cancel", {"user": user})

    async def save_result(self, session_id: str, data: bytes) -> None:
        """The ended session (JSON), compressed, in chunks; `done` last, so a reader never sees a part."""
        packed = await asyncio.to_thread(zlib.compress, data, 1)
        chunks = [packed[start : start + _CHUNK] for start in range(0, len(packed), _CHUNK)] or [b""]
        await asyncio.gather(*(self._put(session_id, f"result.{n}", chunk) for n, chunk in enumerate(chunks)))
        digest = hashlib.sha256(packed).hexdigest()
        await self._put(session_id, "done", {"chunks": len(chunks), "bytes": len(packed), "sha256": digest})

    # -- reads (any controller) ------------------------------------------------------------------------
    async def spec(self, session_id: str) -> StoredSpec | None:
        body = await self._get(session_id, "spec")
        return StoredSpec.from_json(body) if body is not None else None

    async def summary(self, session_id: str) -> dict[str, Any] | None:
        return await self._get(session_id, "summary")

    async def t0(self, session_id: str) -> StoredT0 | None:
        body = await self._get(session_id, "t0")
        if body is None:
            return None
        offsets = {str(host): (pair[0], pair[1]) for host, pair in (body.get("offsets") or {}).items()}
        return StoredT0(int(body["t0_ns"]), offsets)

    async def decisions(self, session_id: str) -> dict[str, tuple[str, str]]:
        found = {}
        for message in await read_stream(
            self._js, SESSIONS_STREAM, history_subject(session_id, "decided.*"), last_per_subject=True
        ):
            body = json.loads(message.data)
            found[message.subject.rsplit(".", 1)[1]] = (str(body["state"]), str(body["reason"]))
        return found

    async def cancel_requested(self, session_id: str) -> bool:
        return await self._get(session_id, "cancel") is not None

    async def result(self, session_id: str) -> bytes | None:
        """The ended session's JSON, or None (not ended yet, or older than this store: see `legacy`)."""
        done = await self._get(session_id, "done")
        if done is None:
            return None
        parts: dict[int, bytes] = {}
        for message in await read_stream(
            self._js, SESSIONS_STREAM, history_subject(session_id, "result.*"), last_per_subject=True
        ):
            parts[int(message.subject.rsplit(".", 1)[1])] = bytes(message.data)
        packed = b"".join(parts.get(n, b"") for n in range(int(done["chunks"])))
        if hashlib.sha256(packed).hexdigest() != done.get("sha256"):
            raise ValueError(f"session {session_id}: its stored result is incomplete")
        return await asyncio.to_thread(zlib.decompress, packed)

    async def legacy(self, session_id: str) -> dict[str, Any] | None:
        """A session an older controller saved whole (`full`, under a MiB)."""
        return await self._get(session_id, "full")
