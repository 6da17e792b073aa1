"""What an agent's sessions say - statuses and record batches - kept until JetStream has stored it.

A task the controller marks `stored` (its streams capture the session's subjects) has every status and record
batch sent as a JetStream publish: the stream's acknowledgement comes back to the agent's own inbox, and
until it does the message stays here. The messages go out in order, up to WINDOW of them awaiting their
acknowledgement at once; one that is not acknowledged - the server it went to died, the connection dropped,
a stream was electing its leader - is sent again once the link is back, under the same `Nats-Msg-Id`, so the
stream keeps one copy however often it was sent (its duplicate window is two minutes, above GIVE_UP_S).
So a nats-server of a cluster can die mid-session and the controller, wherever it is, still gets every batch.

Bounded, never blocking a session: at most MAX_BYTES wait here (a record batch beyond that is dropped and
counted, which the controller sees as a batch gap; statuses always fit), and a message not stored within
GIVE_UP_S of its first try is dropped and counted. A refusal by the stream (a message too big) is final.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.errors import Error as NatsError

__all__ = ["Outbox", "OutboxCounts"]

_LOG = logging.getLogger("netsleuth.agent.fleet")
WINDOW = 32
MAX_BYTES = 16 << 20
GIVE_UP_S = 60.0
ACK_TIMEOUT_S = 3.0
RETRY_S = 0.25  # after a failed send: the connection is being re-established, or a stream elects a leader


@dataclass
class _Message:
    subject: str
    data: bytes
    msg_id: str
    first_try: float
    sending: bool = False


@dataclass
class OutboxCounts:
    stored: int = 0  # acknowledged by the stream (a resend it already had counts once, as stored)
    resent: int = 0  # sends that got no acknowledgement, and were (or will be) sent again
    dropped: int = 0  # not stored: beyond MAX_BYTES, or past GIVE_UP_S
    refused: int = 0  # the stream answered with an error (e.g. over its message size)


class Outbox:
    def __init__(
        self,
        client: Callable[[], Client | None],
        window: int = WINDOW,
        max_bytes: int = MAX_BYTES,
        give_up_s: float = GIVE_UP_S,
        ack_timeout_s: float = ACK_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._window = window
        self._max_bytes = max_bytes
        self._give_up_s = give_up_s
        self._ack_timeout_s = ack_timeout_s
        self._clock = clock
        self._queue: collections.deque[_Message] = collections.deque()
        self._bytes = 0
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._sending: set[asyncio.Task[None]] = set()
        self.counts = OutboxCounts()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def put(self, subject: str, data: bytes, msg_id: str, droppable: bool = True) -> bool:
        """Queue one message (on the link's loop); False when it was dropped for want of room."""
        if droppable and self._bytes + len(data) > self._max_bytes:
            self.counts.dropped += 1
            _LOG.warning("fleet: %s dropped: %d bytes already wait for the stream", msg_id, self._bytes)
            return False
        self._queue.append(_Message(subject, data, msg_id, self._clock()))
        self._bytes += len(data)
        self._wake.set()
        return True

    def poke(self) -> None:
        """The link is back: send what waits now."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._expire()
            client = self._client()
            if client is None or not client.is_connected:
                continue  # woken again by poke() on reconnect, or by the next put()
            for message in list(self._queue):
                if self._in_flight >= self._window:
                    break
                if not message.sending:
                    message.sending = True
                    self._in_flight += 1
                    sending = asyncio.create_task(self._send(client, message))
                    self._sending.add(sending)
                    sending.add_done_callback(self._sending.discard)

    def _expire(self) -> None:
        now = self._clock()
        while self._queue and not self._queue[0].sending and now - self._queue[0].first_try > self._give_up_s:
            message = self._queue.popleft()
            self._bytes -= len(message.data)
            self.counts.dropped += 1
            _LOG.warning("fleet: %s dropped: not stored within %g s", message.msg_id, self._give_up_s)

    def _forget(self, message: _Message) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(message)
            self._bytes -= len(message.data)

    async def _send(self, client: Client, message: _Message) -> None:
        retry = False
        try:
            reply = await client.request(
                message.subject,
                message.data,
                timeout=self._ack_timeout_s,
                headers={"Nats-Msg-Id": message.msg_id},
            )
            answer = json.loads(reply.data) if reply.data else {}
            if isinstance(answer, dict) and "error" in answer:
                self.counts.refused += 1
                _LOG.warning("fleet: the stream refused %s: %s", message.msg_id, answer["error"])
            else:
                self.counts.stored += 1
            self._forget(message)
        except (TimeoutError, NatsError, OSError, ValueError):
            # No acknowledgement (nats-py's no-responders, timeout and connection errors are NatsErrors): sent
            # again, once the connection is back or after a pause.
            retry = True
        finally:
            self._in_flight -= 1
            message.sending = False
        if retry:
            self.counts.resent += 1
            await asyncio.sleep(RETRY_S)
        self._wake.set()
