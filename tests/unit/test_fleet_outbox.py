"""The agent's outbox (fleet/outbox.py): statuses and record batches kept until JetStream acknowledges them,
sent again under the same message id after a failure, in order, within bounds."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from netsleuth.fleet.outbox import Outbox


@dataclass
class _Reply:
    data: bytes


@dataclass
class FakeNats:
    """Acknowledges like a stream with duplicate detection; fails the sends it is told to."""

    failures: list[type[Exception]] = field(default_factory=list)
    is_connected: bool = True
    stored: dict[str, bytes] = field(default_factory=dict)
    sent: list[str] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)

    async def request(self, subject: str, data: bytes, timeout: float, headers: dict[str, str]) -> _Reply:
        message_id = headers["Nats-Msg-Id"]
        self.sent.append(message_id)
        await asyncio.sleep(0)
        if self.failures:
            raise self.failures.pop(0)()
        if message_id in self.refuse:
            return _Reply(
                json.dumps({"error": {"code": 400, "description": "message size exceeds maximum"}}).encode()
            )
        duplicate = message_id in self.stored
        self.stored.setdefault(message_id, data)
        return _Reply(json.dumps({"stream": "S", "seq": len(self.stored), "duplicate": duplicate}).encode())


async def _drain(outbox: Outbox, nats: FakeNats, seconds: float = 2.0) -> None:
    runner = asyncio.create_task(outbox.run())
    try:
        for _ in range(int(seconds / 0.01)):
            if not outbox.waiting:
                return
            await asyncio.sleep(0.01)
    finally:
        runner.cancel()


def _run(coroutine: Any) -> None:
    asyncio.run(coroutine)


def test_a_message_without_acknowledgement_is_sent_again_under_its_id_and_stored_once() -> None:
    async def scenario() -> None:
        nats = FakeNats(failures=[NatsTimeoutError, NoRespondersError])
        outbox = Outbox(lambda: nats, window=1)  # type: ignore[arg-type, return-value]
        for seq in range(3):
            outbox.put("netsleuth.session.s1.h.records", b"batch", f"s1.h.records.{seq}")
        outbox.put("netsleuth.session.s1.h.status", b"ended", "s1.h.status.1", droppable=False)
        await _drain(outbox, nats)
        assert outbox.waiting == 0
        assert list(nats.stored) == ["s1.h.records.0", "s1.h.records.1", "s1.h.records.2", "s1.h.status.1"]
        assert nats.sent[:3] == ["s1.h.records.0"] * 3  # the first, until it was acknowledged; then in order
        assert (outbox.counts.stored, outbox.counts.resent, outbox.counts.dropped) == (4, 2, 0)

    _run(scenario())


def test_while_disconnected_nothing_is_sent_and_everything_goes_once_back() -> None:
    async def scenario() -> None:
        nats = FakeNats(is_connected=False)
        outbox = Outbox(lambda: nats)  # type: ignore[arg-type, return-value]
        runner = asyncio.create_task(outbox.run())
        outbox.put("s", b"x", "a")
        await asyncio.sleep(0.05)
        assert nats.sent == [] and outbox.waiting == 1
        nats.is_connected = True
        outbox.poke()
        for _ in range(100):
            if not outbox.waiting:
                break
            await asyncio.sleep(0.01)
        runner.cancel()
        assert nats.sent == ["a"] and list(nats.stored) == ["a"]

    _run(scenario())


def test_bounds_drop_record_batches_beyond_the_bytes_and_messages_past_the_give_up() -> None:
    async def scenario() -> None:
        nats = FakeNats(is_connected=False)
        now = [0.0]
        outbox = Outbox(lambda: nats, max_bytes=10, give_up_s=60, clock=lambda: now[0])  # type: ignore[arg-type, return-value]
        assert outbox.put("s", b"12345678", "r0")
        assert not outbox.put("s", b"12345678", "r1")  # no room: a record batch is dropped ...
        assert outbox.put("s", b"status", "st", droppable=False)  # ... a status never is
        now[0] = 61.0
        runner = asyncio.create_task(outbox.run())
        outbox.poke()
        await asyncio.sleep(0.05)
        runner.cancel()
        assert outbox.waiting == 0 and outbox.counts.dropped == 3 and nats.sent == []

    _run(scenario())


def test_a_refusal_by_the_stream_is_final() -> None:
    async def scenario() -> None:
        nats = FakeNats(refuse={"big"})
        outbox = Outbox(lambda: nats)  # type: ignore[arg-type, return-value]
        outbox.put("s", b"x" * 100, "big")
        await _drain(outbox, nats)
        assert nats.sent == ["big"] and outbox.counts.refused == 1 and outbox.waiting == 0

    _run(scenario())
