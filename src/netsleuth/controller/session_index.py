"""Every session's latest summary, whichever controller runs it, kept by one watch of the history stream.

What `GET /api/v1/sessions` lists, what a user's concurrency limit counts (their sessions on every
controller), and where a controller finds the running sessions no live controller holds any more (their
lease expired: controller/leases.py). One ordered consumer over `netsleuth.history.*.summary`, last per
subject then live, started again when NATS reconnects (a restarted server lost it). A summary read from a
replica that lags can be older than the leader's; what matters - taking a session over - is checked
against the leader (SessionStore.summary) before anything is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api

from netsleuth.controller.fleet_session import ACTIVE
from netsleuth.controller.streams import RenewableWatch
from netsleuth.fleet.protocol import SESSIONS_STREAM

__all__ = ["SessionIndex"]

_log = logging.getLogger("netsleuth.controller")
_SUMMARIES = "netsleuth.history.*.summary"


class SessionIndex(RenewableWatch):
    what = "session index watch"

    def __init__(self, js: JetStreamContext) -> None:
        super().__init__()
        self._js = js
        self._summaries: dict[str, dict[str, Any]] = {}

    def note(self, summary: dict[str, Any]) -> None:
        """A summary this controller just wrote: known at once, not when the watch brings it back."""
        if isinstance(summary.get("id"), str):
            self._summaries[summary["id"]] = summary

    def get(self, session_id: str) -> dict[str, Any] | None:
        return self._summaries.get(session_id)

    def all(self) -> list[dict[str, Any]]:
        return list(self._summaries.values())

    def active(self) -> list[dict[str, Any]]:
        return [summary for summary in self._summaries.values() if summary.get("state") in ACTIVE]

    async def _follow(self) -> None:
        try:
            await self._js.get_msg(SESSIONS_STREAM, subject=_SUMMARIES)
        except Exception as error:
            if getattr(error, "err_code", None) != 10037:  # "no message found": no session yet
                raise
            self.synced.set()

        async def received(message: Msg) -> None:
            with contextlib.suppress(ValueError):
                body = json.loads(message.data)
                if isinstance(body, dict):
                    self.note(body)
            if message.metadata.num_pending == 0:
                self.synced.set()

        subscription = await self._js.subscribe(
            _SUMMARIES,
            stream=SESSIONS_STREAM,
            cb=received,
            ordered_consumer=True,
            deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT,
            idle_heartbeat=5.0,
        )
        try:
            await asyncio.Event().wait()  # until watched again (cancelled)
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
