"""Sessions against a running agent: real programs, real drops between namespaces, the agent's limits."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from netsleuth.agent.client import AgentError
from tests.netlab import Host, wait_for
from tests.privileged.conftest import Pair
from tests.privileged.test_agent_harness import AgentProcess, wait_released
from tests.record_check import check_records
from tests.tracerun import TraceRun

UDP_SEND = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "for _ in range(int(sys.argv[3])):\n"
    "    try: s.sendto(b'x'*32, (sys.argv[1], int(sys.argv[2])))\n"
    "    except OSError: pass\n"  # EPERM: an OUTPUT DROP rule, the drop we want
)


def udp(host: Host, dst: str, port: int, count: int = 1) -> None:
    host.run(sys.executable, "-c", UDP_SEND, dst, str(port), str(count))


@pytest.fixture
def agent() -> Iterator[AgentProcess]:
    with AgentProcess({"sessions": {"max_concurrent": 2, "max_duration": 120}}) as running:
        running.wait_ready()
        yield running


def drops(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [record for record in records if record["type"] == "drop"]


def only_exporter_attached(agent: AgentProcess) -> bool:
    programs, links = agent.bpf_ids()
    return len(programs) == 1 and len(links) == 1


def test_two_concurrent_sessions_get_only_their_own_events(pair: Pair, agent: AgentProcess) -> None:
    # Closed ports in b: each datagram is one NO_SOCKET drop there.
    netns = pair.b.name
    first = agent.client.session(
        {"diagnostic": "drops", "filters": {"netns": netns, "dport": 5701}, "duration": 60, "max_events": 3}
    )
    second = agent.client.session(
        {"diagnostic": "drops", "filters": {"netns": netns, "dport": 5702}, "duration": 60, "max_events": 4}
    )
    with first, second:
        first_lines, second_lines = iter(first), iter(second)
        assert next(first_lines)["type"] == next(second_lines)["type"] == "session_start"
        # The other session's traffic first: a session that saw it would fill its cap with it.
        udp(pair.a, pair.b4, 5702, 4)
        udp(pair.a, pair.b4, 5701, 3)
        first_records, second_records = list(first_lines), list(second_lines)
    assert [d["dport"] for d in drops(first_records)] == [5701] * 3
    assert [d["dport"] for d in drops(second_records)] == [5702] * 4
    for records, count in ((first_records, 3), (second_records, 4)):
        assert records[-1]["reason"] == "max_events" and records[-1]["events"] == count
        assert records[-2]["type"] == "summary" and records[-2]["total"] >= count
    wait_for(lambda: only_exporter_attached(agent), 10, "the sessions' programs to detach")


def test_session_records_are_the_clis_records(pair: Pair, agent: AgentProcess) -> None:
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "5711", "-j", "DROP")
    filters = {"netns": pair.a.name, "dport": 5711}
    with TraceRun("drops", "--netns", pair.a.name, "--dport", "5711") as cli:
        cli.wait_ready()
        with agent.client.session({"diagnostic": "drops", "filters": filters, "max_events": 1}) as stream:
            lines = iter(stream)
            next(lines)
            udp(pair.a, pair.b4, 5711)
            session_records = list(lines)
        cli.wait_records(lambda r: r.get("type") == "drop")
        cli.stop()
        [cli_drop] = cli.drops()
        cli_summary = cli.summary()
    [session_drop] = drops(session_records)
    # Two programs saw the same drop: everything but the nanosecond they read the clock is identical.
    assert {**session_drop, "time": None} == {**cli_drop, "time": None}
    assert session_drop["netfilter"]["rule"] == "-A OUTPUT -p udp -m udp --dport 5711 -j DROP"
    summary = session_records[-2]
    assert set(summary) == set(cli_summary) and summary["total"] == 1


def test_duration_limit_and_detach(agent: AgentProcess) -> None:
    started = time.monotonic()
    with agent.client.session({"diagnostic": "drops", "filters": {"dport": 9}, "duration": 1.5}) as stream:
        records = list(stream)
    elapsed = time.monotonic() - started
    assert records[-1]["reason"] == "duration" and 1.5 <= elapsed < 5
    wait_for(lambda: only_exporter_attached(agent), 10, "the session's program to detach")
    with pytest.raises(AgentError) as refused:
        agent.client.session({"diagnostic": "drops", "duration": 121})
    assert refused.value.status == 400 and "duration 121 exceeds this agent's limit of 120 seconds" in str(
        refused.value
    )


def test_event_and_byte_caps(pair: Pair, agent: AgentProcess) -> None:
    base = {"diagnostic": "drops", "filters": {"netns": pair.b.name, "dport": 5720}, "duration": 60}
    with agent.client.session({**base, "max_events": 5}) as stream:
        lines = iter(stream)
        next(lines)
        udp(pair.a, pair.b4, 5720, 50)
        records = list(lines)
    assert len(drops(records)) == 5 and records[-1]["reason"] == "max_events"
    with agent.client.session({**base, "max_bytes": 4096}) as stream:
        lines = iter(stream)
        start = next(lines)
        udp(pair.a, pair.b4, 5720, 50)
        records = list(lines)
    streamed = (
        len(json.dumps(start, separators=(",", ":")))
        + 1
        + sum(
            len(json.dumps(record, separators=(",", ":"), ensure_ascii=False)) + 1
            for record in drops(records)
        )
    )
    assert records[-1]["reason"] == "max_bytes" and 0 < len(drops(records)) < 50 and streamed <= 4096


def test_concurrent_session_limit(agent: AgentProcess) -> None:
    long_session = {"diagnostic": "drops", "filters": {"dport": 9}, "duration": 60}
    first = agent.client.session(long_session)
    second = agent.client.session(long_session)
    try:
        next(iter(first))
        next(iter(second))
        with pytest.raises(AgentError) as refused:
            agent.client.session(long_session)
        assert refused.value.status == 429 and "2 sessions are running" in str(refused.value)
    finally:
        first.close()
    wait_for(lambda: len(agent.client.sessions()) == 1, 5, "the closed session to end")
    with agent.client.session({**long_session, "duration": 0.5}) as third:
        assert list(third)[-1]["reason"] == "duration"
    second.close()
    assert agent.metric("netsleuth_sessions_refused_total", cause="busy") == 1


def test_a_client_that_disconnects_does_not_leave_its_session_running(agent: AgentProcess) -> None:
    stream = agent.client.session({"diagnostic": "drops", "duration": 120})
    assert next(iter(stream))["type"] == "session_start"
    programs, links = agent.bpf_ids()
    assert len(programs) == 2
    session_programs = programs - {min(programs)}  # the exporter attached first
    session_links = links - {min(links)}
    started = time.monotonic()
    stream.close()
    wait_for(lambda: agent.client.sessions() == [], 5, "the agent to end the abandoned session")
    assert time.monotonic() - started < 2
    wait_released(session_programs, session_links)
    assert only_exporter_attached(agent)
    assert agent.metric("netsleuth_sessions_total", diagnostic="drops", reason="client_gone") == 1


def test_cpu_budget_aborts_a_session_in_a_drop_storm(pair: Pair, udpflood: str, agent: AgentProcess) -> None:
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "5730", "-j", "DROP")
    request = {
        "diagnostic": "drops",
        "filters": {"netns": pair.a.name, "dport": 5730},
        "duration": 60,
        "cpu_budget_percent": 0.5,
    }
    with agent.client.session(request) as stream:
        lines = iter(stream)
        next(lines)
        flooder = pair.a.popen([udpflood, pair.b4, "5730", "3000000"], stdout=-1)
        try:
            records = list(lines)
        finally:
            flooder.kill()
            flooder.wait()
    end = records[-1]
    assert end["reason"] == "cpu_budget", end
    assert "over the budget of 0.5%" in end["detail"] and end["seconds"] < 30
    assert records[-2]["type"] == "summary"
    assert agent.metric("netsleuth_sessions_total", diagnostic="drops", reason="cpu_budget") == 1
    wait_for(lambda: only_exporter_attached(agent), 10, "the aborted session's program to detach")


def test_every_registered_diagnostic_runs_from_a_json_config(pair: Pair, agent: AgentProcess) -> None:
    """Sessions are not argv: resets and diagnose open from their JSON configs like drops does."""
    from tests.privileged.tcp_helpers import connect

    netns = pair.b.name
    resets = {"diagnostic": "resets", "config": {"netns": netns, "port": 5740}, "max_events": 3}
    with agent.client.session(resets) as stream:
        lines = iter(stream)
        assert next(lines)["diagnostic"] == "resets"
        for _ in range(3):
            assert connect(pair.a, pair.b4, 5740) == "ERROR 111"
        records = list(lines)
    check_records(records)
    sent = [record for record in records if record["type"] == "reset"]
    assert len(sent) == 3 and all(record["cause_code"] == "no_listener" for record in sent)
    assert all(record["v"] == 1 for record in sent)
    summary = records[-2]
    assert (
        summary["type"] == "summary" and summary["diagnostic"] == "resets" and summary["sent"]["total"] == 3
    )

    diagnose = {"diagnostic": "diagnose", "config": {"netns": netns, "dport": 5741}, "duration": 2}
    with agent.client.session(diagnose) as stream:
        lines = iter(stream)
        next(lines)
        udp(pair.a, pair.b4, 5741, 5)
        records = list(lines)
    check_records(records)
    verdicts = [record for record in records if record["type"] == "verdict"]
    summary = records[-2]
    assert summary["diagnostic"] == "diagnose" and summary["drops"]["total"] == 5
    assert verdicts and verdicts[0]["rank"] == 1 and sum(v["evidence"].get("drops", 0) for v in verdicts) == 5
    assert records[-1]["reason"] == "duration"
    wait_for(lambda: only_exporter_attached(agent), 10, "the sessions' programs to detach")

    with pytest.raises(AgentError) as refused:
        agent.client.session({"diagnostic": "resets", "config": {"proto": "udp"}})
    assert refused.value.status == 400 and "proto can only be tcp: this command traces TCP" in str(
        refused.value
    )
