"""Which controller runs a session (controller/leases.py) and what a listing keeps of a big session
(controller/session_store.py), without a server: a fake KV with the server's compare-and-set rules."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from nats.js.errors import KeyWrongLastSequenceError

from netsleuth.controller.leases import LeaseLost, Leases
from netsleuth.controller.session_store import summary_of


class FakeBucket:
    """create succeeds only on an absent key; update only at the key's current revision; `expire` is the
    server forgetting a key nobody renewed (the bucket's max age)."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[int, bytes]] = {}
        self.revision = 0

    def expire(self, key: str) -> None:
        self.values.pop(key, None)

    async def create(self, key: str, value: bytes) -> int:
        if key in self.values:
            raise KeyWrongLastSequenceError()
        self.revision += 1
        self.values[key] = (self.revision, value)
        return self.revision

    async def update(self, key: str, value: bytes, last: int) -> int:
        if key not in self.values or self.values[key][0] != last:
            raise KeyWrongLastSequenceError()
        self.revision += 1
        self.values[key] = (self.revision, value)
        return self.revision

    async def delete(self, key: str, last: int) -> bool:
        self.values.pop(key, None)
        return True

    async def get(self, key: str) -> Entry:
        revision, value = self.values[key]
        return Entry(value, revision)


@dataclass
class Entry:
    value: bytes
    revision: int


class LostAcks(FakeBucket):
    """A busy server: the write is stored, but its acknowledgement never comes back (while `busy`)."""

    busy = True

    async def update(self, key: str, value: bytes, last: int) -> int:
        revision = await super().update(key, value, last)
        if self.busy:
            raise TimeoutError("nats: timeout")
        return revision


def test_one_controller_runs_a_session_and_another_only_once_the_lease_ran_out() -> None:
    async def scenario() -> None:
        bucket = FakeBucket()
        first, second = Leases(bucket, "first"), Leases(bucket, "second")  # type: ignore[arg-type]
        assert await first.take("s1") and not await second.take("s1")
        await first.renew("s1")  # at its revision: kept
        assert not await second.take("s1")
        bucket.expire("s1")  # the first stopped renewing (it died, or stalled past the lease)
        assert await second.take("s1")
        with pytest.raises(LeaseLost):
            await first.renew("s1")  # the revision moved on: the first stops running it
        assert bucket.values["s1"][1] == b"second"
        await second.release("s1")
        assert await first.take("s1")  # given back: taken at once

    asyncio.run(scenario())


def test_a_lease_that_ran_out_with_nobody_taking_it_is_taken_again_by_its_holder() -> None:
    async def scenario() -> None:
        bucket = FakeBucket()
        first = Leases(bucket, "first")  # type: ignore[arg-type]
        assert await first.take("s1")
        bucket.expire("s1")  # a stall longer than the lease, but no other controller came
        await first.renew("s1")
        assert bucket.values["s1"][1] == b"first" and first.held("s1")

    asyncio.run(scenario())


def test_a_renewal_whose_acknowledgement_was_lost_is_still_this_controllers_lease() -> None:
    """Under load a write can be stored while its acknowledgement times out: the revision moved on by this
    controller's own hand, which the next renewal must recognise (it lost a 10,000-host session to itself)."""

    async def scenario() -> None:
        bucket = LostAcks()
        first = Leases(bucket, "first")  # type: ignore[arg-type]
        assert await first.take("s1")
        with pytest.raises(TimeoutError):
            await first.renew("s1")
        bucket.busy = False  # acknowledgements come back again
        await first.renew("s1")  # at a revision it did not know: its own
        assert bucket.values["s1"][1] == b"first" and first.held("s1")

    asyncio.run(scenario())


def test_a_listing_of_a_big_session_names_the_hosts_not_ended_first_and_counts_the_rest() -> None:
    hosts = {f"h{n:05d}": {"state": "ended"} for n in range(10_000)}
    hosts["h09999"] = {"state": "failed", "reason": "agent stopped answering"}
    entry = summary_of({"id": "s", "state": "ended", "hosts": hosts, "timeline": [{}] * 5, "verdicts": [{}]})
    assert "timeline" not in entry and entry["verdicts_count"] == 1
    assert entry["hosts_total"] == 10_000 and entry["hosts_by_state"] == {"ended": 9_999, "failed": 1}
    assert len(entry["hosts"]) == 200 and next(iter(entry["hosts"])) == "h09999"
    small = summary_of({"id": "s", "hosts": {"a": {"state": "ended"}}})
    assert small["hosts"] == {"a": {"state": "ended"}} and "hosts_by_state" not in small


def test_a_running_sessions_summary_is_the_listing_of_its_snapshot() -> None:
    from netsleuth.controller.fleet_session import FleetSession, SessionSpec
    from netsleuth.fleet.protocol import Scope

    for count in (3, 1_000):
        hosts = tuple(f"h{n:05d}" for n in range(count))
        spec = SessionSpec("alice", "drops", {}, Scope(), 1.0, hosts)
        session = FleetSession("s1", spec, {}, 100)
        session.set_host(hosts[-1], "failed", "not ready within 15 s")
        session.set_host(hosts[0], "ended", "duration: ran for its 1 s")
        assert session.summary() == summary_of(session.snapshot(timeline=False)), count
