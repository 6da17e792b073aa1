"""Session requests, limits and the streaming loop, with a scripted diagnostic and a fake clock (no BPF)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from netsleuth.agent.config import SessionLimits
from netsleuth.agent.cpu_budget import CpuBudget
from netsleuth.agent.programs import ProgramLedger
from netsleuth.agent.session_diagnostics import DiagnosticContext, open_session
from netsleuth.agent.session_request import parse_session_request
from netsleuth.agent.sessions import ClientGone, SessionManager, SessionRefused
from netsleuth.bpf.stats import ProgramStats
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError
from netsleuth.kernel.reasons import load_drop_reasons
from netsleuth.render.jsonl import encode_line
from tests.unit.json_record import JsonRecord

FIXTURES = Path(__file__).parents[1] / "fixtures"
LIMITS = SessionLimits(
    max_concurrent=2,
    default_duration=5,
    max_duration=60,
    max_events=1000,
    max_bytes=1 << 20,
    cpu_budget_percent=5,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Kernel:
    """bpf_stats of fake program fds: run time grows with the fake clock at `percent` of one CPU."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.percent = 0.0
        self.run_ns = 0.0
        self.last = clock.now

    def stats_of(self, fd: int) -> ProgramStats:
        self.run_ns += (self.clock.now - self.last) * 1e9 * self.percent / 100
        self.last = self.clock.now
        return ProgramStats(run_count=int(self.run_ns // 100), run_time_ns=int(self.run_ns))


class Blobbed(list[JsonRecord]):
    """A poll's records that make their lines whole, as a drop storm's batch does (json_blob)."""

    blobs = 0  # batches written whole

    def json_lines(self) -> list[bytes]:
        return [encode_line(record.to_json()) for record in self]

    def json_blob(self) -> bytes:
        Blobbed.blobs += 1
        return b"".join(self.json_lines())


class Scripted:
    """A diagnostic that produces `per_poll` drop records each poll and moves the clock by the poll time
    (as one batch that makes its lines whole with `blob`)."""

    instances: ClassVar[list[Scripted]] = []

    def __init__(self, config: Mapping[str, Any], clock: Clock) -> None:
        if config.get("port") == 0:
            raise UsageError("--port '0' is not a port: give a number from 1 to 65535")
        self.per_poll = int(config.get("per_poll", 1))
        self.blob = bool(config.get("blob"))
        self.clock = clock
        self.attach_kind = "fake"
        self.emitted = 0
        self.closed = False
        self.started = False
        Scripted.instances.append(self)

    def start(self) -> None:
        self.started = True

    def _records(self, count: int) -> list[JsonRecord]:
        records = [JsonRecord({"type": "drop", "n": self.emitted + i, "pad": "x" * 50}) for i in range(count)]
        self.emitted += count
        return records

    def poll(self, timeout_ms: int) -> list[JsonRecord]:
        self.clock.now += timeout_ms / 1000
        records = self._records(self.per_poll)
        return Blobbed(records) if self.blob else records

    def drain(self) -> list[JsonRecord]:
        return self._records(2)

    def totals(self) -> EventTotals:
        return EventTotals(matched=self.emitted, emitted=self.emitted)

    def summary(self, interrupted: bool) -> JsonRecord:
        groups = [{"reason": "X", "count": i, "example": {"pad": "y" * 100}} for i in range(50)]
        return JsonRecord(
            {"type": "summary", "total": self.emitted, "interrupted": interrupted, "groups": groups}
        )

    def program_fds(self) -> dict[str, int]:
        return {"fake_prog": 1000}

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed = True


class Sink:
    def __init__(self, gone_after_checks: int | None = None, stall_after_writes: int | None = None) -> None:
        self.data = b""
        self.checks = 0
        self.writes = 0
        self.gone_after_checks = gone_after_checks
        self.stall_after_writes = stall_after_writes
        self.deadlines: list[float] = []

    def write(self, data: bytes, deadline: float) -> None:
        self.writes += 1
        if self.stall_after_writes is not None and self.writes > self.stall_after_writes:
            raise ClientGone("the client stopped reading")
        self.deadlines.append(deadline)
        self.data += data

    def client_gone(self) -> bool:
        self.checks += 1
        return self.gone_after_checks is not None and self.checks > self.gone_after_checks

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.data.decode().splitlines()]


def manager(
    clock: Clock, limits: SessionLimits = LIMITS, accounting: bool = True
) -> tuple[SessionManager, Kernel]:
    kernel = Kernel(clock)
    reasons = load_drop_reasons(Path("/nonexistent"), [FIXTURES / "reasons" / "kfree_skb_format_6.1.txt"])
    sessions = SessionManager(
        limits,
        DiagnosticContext(reasons),
        ProgramLedger(kernel.stats_of),
        lambda: accounting,
        clock=clock,
        diagnostics={"fake": lambda config, _context: Scripted(config, clock)},
        read_config=lambda _name, config: config,  # the scripted diagnostic reads its own config
    )
    return sessions, kernel


def body(**fields: Any) -> bytes:
    return json.dumps({"diagnostic": "fake", **fields}).encode()


@pytest.fixture(autouse=True)
def _fresh_instances() -> None:
    Scripted.instances.clear()


def run(sessions: SessionManager, sink: Sink, **fields: Any) -> str:
    return sessions.open(body(**fields), "test").stream(sink)


def test_request_defaults_and_refusals() -> None:
    request = parse_session_request(b'{"diagnostic": "drops"}', LIMITS, ("drops",))
    assert (request.duration, request.max_events, request.max_bytes, request.cpu_budget_percent) == (
        5,
        1000,
        1 << 20,
        5,
    )
    bad = [
        (b"{", "the request body is not valid JSON"),
        (b"[]", "JSON object"),
        (b'{"diagnostic": "nope"}', "unknown diagnostic 'nope' (known: drops)"),
        (b'{"diagnostic": "drops", "duration": 61}', "duration 61 exceeds this agent's limit of 60 seconds"),
        (b'{"diagnostic": "drops", "duration": -1}', "duration must be a positive number"),
        (b'{"diagnostic": "drops", "max_events": 1001}', "max_events 1001 exceeds"),
        (b'{"diagnostic": "drops", "max_events": 1.5}', "max_events must be a positive whole number"),
        (b'{"diagnostic": "drops", "cpu_budget_percent": 50}', "cpu_budget_percent 50 exceeds"),
        (b'{"diagnostic": "drops", "filters": []}', "filters must be a JSON object"),
        (b'{"diagnostic": "drops", "config": "x"}', "config must be a JSON object"),
        (b'{"diagnostic": "drops", "durration": 1}', "unknown field 'durration'"),
    ]
    for raw, expected in bad:
        with pytest.raises(UsageError, match=re.escape(expected)):
            parse_session_request(raw, LIMITS, ("drops",))


def test_drops_config_is_the_cli_flags() -> None:
    from netsleuth.diagnostics.drops.session import DropsDiagnostic

    reasons = load_drop_reasons()
    context = DiagnosticContext(reasons)
    opened = open_session(
        "drops",
        {
            "proto": "udp",
            "dport": 53,
            "host": ["198.18.0.0/15"],
            "family": 4,
            "reason": "NETFILTER_DROP",
            "stack": True,
            "sample": 3,
        },
        context,
    )
    session = opened.session  # type: ignore[attr-defined]
    assert isinstance(session, DropsDiagnostic)
    config = session.config
    assert config.packet_filter.proto == 17 and config.packet_filter.dport == 53
    assert [str(net) for net in config.packet_filter.hosts] == ["198.18.0.0/15"]
    assert config.packet_filter.family == 4 and config.stack and config.sample_every == 3
    assert config.reasons == {reasons.value("NETFILTER_DROP")}
    assert context.symbols.holders == 1
    opened.close()
    assert context.symbols.holders == 0  # the last session out lets the symbol table go
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("drops", {"port": 70000}, "^port 70000 is not a port: give a number from 1 to 65535$"),
        ("drops", {"reason": "NOPE"}, "^unknown drop reason 'NOPE'"),
        ("drops", {"family": 5}, r"^family must be one of 4, 6 \(got 5\)$"),
        ("drops", {"pcap": "/tmp/x.pcapng"}, "^pcap is not an option of drops; it knows comm, dev, dport, "),
        (
            "drops",
            {"dport": [1, 2]},
            r"^dport must be a port: give a number from 1 to 65535 \(got \[1, 2\]\)$",
        ),
        ("resets", {"proto": "udp"}, "^proto can only be tcp: this command traces TCP$"),
        ("tcp.queues", {"summary": "yes"}, "^summary must be true or false"),
        ("diagnose", {"duration": 7200}, "^duration 7200 is not a number of seconds over 0 and at most 3600"),
        ("nope", {}, "unknown diagnostic 'nope'"),
    ]
    for name, config_json, expected in cases:
        with pytest.raises(UsageError, match=expected):
            open_session(name, config_json, context)
    assert context.symbols.holders == 0  # refused configs hold nothing


def test_stream_is_start_records_summary_end() -> None:
    clock = Clock()
    sessions, _ = manager(clock)
    sink = Sink()
    assert run(sessions, sink, duration=1) == "duration"
    lines = sink.lines()
    assert lines[0]["type"] == "session_start" and lines[0]["duration"] == 1 and lines[0]["attach"] == "fake"
    drops = [line for line in lines if line["type"] == "drop"]
    assert [drop["n"] for drop in drops] == list(range(len(drops)))
    # Ten-odd 100 ms polls (float steps), then the drain at the deadline; every record made it out.
    assert len(drops) == Scripted.instances[0].emitted >= 10 + 2
    assert lines[-2]["type"] == "summary" and lines[-2]["interrupted"] is False
    end = lines[-1]
    assert end["type"] == "session_end" and end["reason"] == "duration" and end["events"] == len(drops)
    assert Scripted.instances[0].closed
    assert sessions.stats.ended[("fake", "duration")] == 1 and sessions.stats.active == 0
    # Every write is bounded by the session's deadline, whatever the client does.
    assert set(sink.deadlines) == {100.0 + 1}


@pytest.mark.parametrize("blob", [False, True])
def test_event_cap_ends_with_exactly_that_many(blob: bool) -> None:
    clock = Clock()
    sessions, _ = manager(clock)
    sink = Sink()
    Blobbed.blobs = 0
    options = {"per_poll": 7, "blob": blob}
    assert run(sessions, sink, duration=30, max_events=25, options=options) == "max_events"
    lines = sink.lines()
    assert [line["n"] for line in lines if line["type"] == "drop"] == list(range(25))
    assert lines[-1]["reason"] == "max_events" and lines[-2]["interrupted"] is True
    # Whole batches go as their one blob while they fit (0-6, 7-13, 14-20); the one the cap cuts, by line.
    assert Blobbed.blobs == (3 if blob else 0)


@pytest.mark.parametrize("blob", [False, True])
def test_byte_cap_counts_what_was_sent_and_trims_the_summary(blob: bool) -> None:
    clock = Clock()
    sessions, _ = manager(clock)
    sink = Sink()
    options = {"per_poll": 3, "blob": blob}
    assert run(sessions, sink, duration=30, max_bytes=2000, options=options) == "max_bytes"
    lines = sink.lines()
    summary, end = lines[-2], lines[-1]
    assert end["reason"] == "max_bytes"
    # Events stop before the cap; the summary always follows, its group list cut to the room left.
    streamed = sink.data.decode().rsplit("\n", 3)[0]
    assert len(streamed) + 1 <= 2000
    assert summary["groups_omitted"] == 50 and summary["groups"] == [] and summary["total"] > 0


def test_cpu_budget_aborts_and_says_why() -> None:
    clock = Clock()
    sessions, kernel = manager(clock)
    kernel.percent = 12.0
    sink = Sink()
    assert run(sessions, sink, duration=30, cpu_budget_percent=2) == "cpu_budget"
    end = sink.lines()[-1]
    assert end["reason"] == "cpu_budget" and "over the budget of 2%" in end["detail"]
    assert "12.00% of one CPU" in end["detail"]
    assert clock.now - 100.0 < 1.0  # after the half-second minimum span, not at the deadline


def test_within_budget_runs_to_its_deadline() -> None:
    clock = Clock()
    sessions, kernel = manager(clock)
    kernel.percent = 1.0
    sink = Sink()
    assert run(sessions, sink, duration=3, cpu_budget_percent=2) == "duration"
    assert sink.lines()[-1]["bpf_cpu_percent"] == pytest.approx(1.0, abs=0.05)


def test_a_client_that_leaves_ends_the_session_and_frees_the_programs() -> None:
    clock = Clock()
    sessions, _ = manager(clock)
    sink = Sink(gone_after_checks=3)
    assert run(sessions, sink, duration=60) == "client_gone"
    assert clock.now - 100.0 < 1.0
    assert Scripted.instances[0].closed and sessions.active() == []
    assert sessions.stats.ended[("fake", "client_gone")] == 1
    assert sink.lines()[-1]["type"] == "drop"  # nothing more is sent to a client that is gone
    assert [cost.attached for cost in sessions.ledger.costs()] == [0]


def test_a_client_that_stops_reading_ends_the_session() -> None:
    clock = Clock()
    sessions, _ = manager(clock)
    assert run(sessions, Sink(stall_after_writes=2), duration=60) == "client_gone"
    assert Scripted.instances[0].closed


def test_concurrency_limit_and_release() -> None:
    clock = Clock()
    sessions, _ = manager(clock)
    first = sessions.open(body(), "a")
    second = sessions.open(body(), "b")
    with pytest.raises(SessionRefused) as refused:
        sessions.open(body(), "c")
    assert refused.value.status == 429 and "2 sessions are running" in str(refused.value)
    assert {session["peer"] for session in sessions.active()} == {"a", "b"}
    first.stream(Sink())
    third = sessions.open(body(), "c")
    second.abandon("test")
    third.abandon("test")
    assert sessions.stats.refused["busy"] == 1 and sessions.active() == []


def test_refusals() -> None:
    clock = Clock()
    sessions, _ = manager(clock, accounting=False)
    with pytest.raises(SessionRefused, match="CPU budget cannot be enforced") as off:
        sessions.open(body(), "a")
    assert off.value.status == 503
    sessions, _ = manager(clock)
    with pytest.raises(SessionRefused, match="is not a port") as invalid:
        sessions.open(body(filters={"port": 0}), "a")
    assert invalid.value.status == 400 and sessions.active() == []
    disabled, _ = manager(clock, SessionLimits(enabled=False))
    with pytest.raises(SessionRefused, match="disabled"):
        disabled.open(body(), "a")


def test_agent_stopping_ends_sessions_with_their_summary() -> None:
    clock = Clock()
    sessions, _ = manager(clock)
    session = sessions.open(body(duration=60), "a")
    sink = Sink(gone_after_checks=None)
    original = sink.client_gone

    def stop_midway() -> bool:
        if sink.checks == 5:
            sessions.stopping.set()
        return original()

    sink.client_gone = stop_midway  # type: ignore[method-assign]
    assert session.stream(sink) == "agent_stopping"
    assert [line["type"] for line in sink.lines()[-2:]] == ["summary", "session_end"]
    assert sessions.stop_all(timeout=1)


def test_cpu_budget_window() -> None:
    clock = Clock()
    kernel = Kernel(clock)
    budget = CpuBudget(10, [1], stats_of=kernel.stats_of, clock=clock)
    assert budget.check() is None
    kernel.percent = 50
    clock.now += 0.3
    assert budget.check() is None  # too short a span to judge
    clock.now += 0.3
    assert budget.check() is not None
    # Quiet again: the one-second window forgets the burst.
    kernel.percent = 0
    clock.now += 1.5
    budget.check()
    clock.now += 0.6
    assert budget.check() is None
