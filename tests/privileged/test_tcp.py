"""`netsleuth tcp life|states|retrans|connlat|queues` end to end, between the lab's namespaces."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tests.privileged.conftest import Pair
from tests.privileged.tcp_helpers import HeldClient, Server, connect
from tests.tracerun import TraceRun, netsleuth_argv

_OPEN_MANY = """
import socket, sys, time
sockets = []
for _ in range(int(sys.argv[3])):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect((sys.argv[1], int(sys.argv[2])))
    except BlockingIOError:
        pass
    sockets.append(s)
time.sleep(float(sys.argv[4]))
"""


def _typed(trace: TraceRun, kind: str) -> list[dict[str, Any]]:
    return [record for record in trace.records() if record.get("type") == kind]


def test_retransmits_caused_by_a_drop_rule(pair: Pair) -> None:
    with (
        Server(pair.b, pair.b4, 7101, "hold"),
        HeldClient(pair.a, pair.b4, 7101) as client,
        TraceRun("tcp", "retrans", "--port", "7101") as trace,
    ):
        trace.wait_ready()
        pair.b.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "7101", "-j", "DROP")
        client.send(1000)
        trace.wait_records(lambda r: r.get("type") == "retrans" and r["kind"] == "timeout", 2)
        assert trace.stop() == 0
        records = _typed(trace, "retrans")
        summary = trace.summary()
    assert all(
        r["state"] == "ESTABLISHED" and r["saddr"] == pair.a4 and r["sport"] == client.local_port
        for r in records
    )
    kinds = [r["kind"] for r in records]
    # A tail loss probe comes first (net.ipv4.tcp_early_retrans defaults to 3), then the timer's retransmits.
    assert kinds[0] == "tlp" and "timeout" in kinds
    assert [r["flow_count"] for r in records] == list(range(1, len(records) + 1))
    assert all(r["pid"] == client.pid and r["owner"] == "socket" for r in records)
    assert all(r["netns_name"] == pair.a.name for r in records)
    timeouts = [r for r in records if r["kind"] == "timeout"]
    assert timeouts[0]["congestion_state"] == "Loss" and timeouts[-1]["unanswered"] >= 1
    # Exact kernel counts: every retransmit printed, and grouped per flow and kind.
    assert summary["total"] == summary["emitted"] == len(records)
    assert sum(group["count"] for group in summary["groups"]) == len(records)


def test_syn_and_synack_retransmits(pair: Pair) -> None:
    # Drop the SYN-ACKs on the client: the client retransmits its SYN, the server its SYN-ACK.
    pair.a.run("iptables", "-A", "INPUT", "-p", "tcp", "--sport", "7102", "-j", "DROP")
    with Server(pair.b, pair.b4, 7102, "hold"), TraceRun("tcp", "retrans", "--port", "7102") as trace:
        trace.wait_ready()
        process = pair.a.popen(
            [sys.executable, "-c", _OPEN_MANY, pair.b4, "7102", "1", "30"], stdout=subprocess.DEVNULL
        )
        try:
            trace.wait_records(lambda r: r.get("type") == "retrans" and r["kind"] == "syn")
            trace.wait_records(lambda r: r.get("type") == "retrans" and r["kind"] == "synack")
        finally:
            process.kill()
            process.wait()
        assert trace.stop() == 0
        records = _typed(trace, "retrans")
    syn = next(r for r in records if r["kind"] == "syn")
    synack = next(r for r in records if r["kind"] == "synack")
    assert syn["state"] == "SYN_SENT" and syn["netns_name"] == pair.a.name and syn["daddr"] == pair.b4
    assert synack["state"] == "NEW_SYN_RECV" and synack["netns_name"] == pair.b.name
    assert synack["saddr"] == pair.b4 and synack["sport"] == 7102 and synack["synack_retransmits"] >= 1


def test_accept_queue_overflow(pair: Pair) -> None:
    # Listen after the trace started: a SYN finds its listener through the listen() the tracker saw.
    with TraceRun("tcp", "queues", "--netns", pair.b.name) as trace:
        trace.wait_ready()
        with Server(pair.b, pair.b4, 7103, "never_accept") as server:
            process = pair.a.popen(
                [sys.executable, "-c", _OPEN_MANY, pair.b4, "7103", "6", "30"], stdout=subprocess.DEVNULL
            )
            try:
                trace.wait_records(lambda r: r.get("what") == "accept_queue_overflow")
            finally:
                process.kill()
                process.wait()
            assert trace.stop() == 0
            overflow = next(r for r in _typed(trace, "queue") if r["what"] == "accept_queue_overflow")
            summary = trace.summary()
    somaxconn = int(pair.b.run("cat", "/proc/sys/net/core/somaxconn").stdout)
    assert overflow["state"] == "LISTEN" and overflow["sport"] == 7103 and overflow["saddr"] == pair.b4
    assert overflow["backlog"] == 1 and overflow["queued"] == 2 and overflow["somaxconn"] == somaxconn
    assert overflow["pid"] == server.pid and overflow["owner"] == "socket"
    assert f"listen() backlog 1, net.core.somaxconn {somaxconn}" in overflow["text"]
    assert f"python3[{server.pid}] to accept()" in overflow["text"]
    assert "ss -ltn 'sport = :7103'" in overflow["check"]
    assert summary["netstat"]["ListenOverflows"] >= 1


def test_connect_latency_and_failures(pair: Pair) -> None:
    with Server(pair.b, pair.b4, 7104, "hold"), TraceRun("tcp", "connlat", "--host", pair.b4) as trace:
        trace.wait_ready()
        with HeldClient(pair.a, pair.b4, 7104) as client:
            assert connect(pair.a, pair.b4, 7105) == "ERROR 111"
            trace.wait_records(lambda r: r.get("type") == "connect", 2)
            assert trace.stop() == 0
            records = _typed(trace, "connect")
            summary = trace.summary()
    ok = next(r for r in records if r["ok"])
    failed = next(r for r in records if not r["ok"])
    assert ok["pid"] == client.pid and ok["dport"] == 7104 and ok["sport"] == client.local_port
    assert 0 < ok["latency_ms"] < 1000
    assert (
        failed["errno"] == "ECONNREFUSED" and failed["dport"] == 7105 and failed["comm"].startswith("python")
    )
    assert summary["total"] == 2 and len(summary["groups"]) == 2


def test_life_and_states_of_one_connection(pair: Pair) -> None:
    with (
        Server(pair.b, pair.b4, 7106, "drain", "300"),
        TraceRun("tcp", "life", "--port", "7106") as life,
        TraceRun("tcp", "states", "--port", "7106", "--netns", pair.a.name) as states,
    ):
        life.wait_ready()
        states.wait_ready()
        with HeldClient(pair.a, pair.b4, 7106) as client:
            client.send(1000)
            client.close(graceful=True)
        life.wait_records(lambda r: r.get("type") == "life", 2)
        states.wait_records(lambda r: r.get("new_state") == "CLOSE")
        assert life.stop() == 0 and states.stop() == 0
        lives = _typed(life, "life")
        transitions = _typed(states, "state")
    client_life = next(r for r in lives if r["sport"] == client.local_port)
    server_life = next(r for r in lives if r["sport"] == 7106)
    assert client_life["pid"] == client.pid and client_life["side"] == "client"
    # tcpi_bytes_acked / tcpi_bytes_received count SYN and FIN as one byte each (sequence space).
    assert client_life["bytes_acked"] == 1000 + 2 and client_life["bytes_received"] == 300 + 1
    assert server_life["side"] == "server" and server_life["netns_name"] == pair.b.name
    assert 0 < client_life["duration_s"] < 20
    sequence = [(r["old_state"], r["new_state"]) for r in transitions]
    assert sequence == [
        ("CLOSE", "SYN_SENT"),
        ("SYN_SENT", "ESTABLISHED"),
        ("ESTABLISHED", "FIN_WAIT1"),
        ("FIN_WAIT1", "FIN_WAIT2"),
        ("FIN_WAIT2", "CLOSE"),
    ]
    assert transitions[0]["previous_state_s"] is None
    assert all(r["previous_state_s"] > 0 for r in transitions[1:])
    assert transitions[0]["pid"] == client.pid and transitions[0]["owner"] == "task"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required"),
        (["bogus"], "invalid choice"),
        (["life", "--port", "x"], "--port 'x' is not a port"),
        (["queues", "--sample", "0"], "--sample '0' is not a sample rate: 1 (every event) or more"),
        # TCP events belong to sockets, not interfaces: --dev is no option of tcp.
        (["states", "--dev", "eth0"], "unrecognized arguments: --dev eth0"),
    ],
)
def test_bad_input_exits_2(argv: list[str], message: str) -> None:
    result = subprocess.run(netsleuth_argv("tcp", *argv), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_raw_tp_variants_load_too() -> None:
    """Kernels that refuse tp_btf get the raw_tp programs: every one of them must pass the verifier here "
    "too."""
    from netsleuth._generated.tcp_abi import EventKind
    from netsleuth.bpf.program_session import Variant
    from netsleuth.diagnostics.tcp import program as tcp_session
    from netsleuth.kernel.reasons import load_drop_reasons

    kinds = frozenset(EventKind)
    config = tcp_session.TcpSessionConfig(emit=kinds, group=kinds, stack=kinds)
    raw_tp_only = (Variant("_r", "raw_tp"),)
    with tcp_session.TcpSession(config, load_drop_reasons(), variants=raw_tp_only) as session:
        session.start()
        assert session.attach_kind == "raw_tp"
        assert {name.removesuffix("_r") for name in session.programs} >= {
            "nst_state",
            "nst_rst_sent",
            "nst_skdrop",
        }
        assert all(name.endswith("_r") for name in session.programs)
