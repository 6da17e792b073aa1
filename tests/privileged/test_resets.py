"""`netsleuth resets` end to end: real programs on the running kernel, real resets between namespaces."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.netlab import Host, wait_for
from tests.privileged.conftest import Pair
from tests.privileged.tcp_helpers import Server, connect, send_segment
from tests.tracerun import TraceRun, bpftool_netsleuth_programs, netsleuth_argv


def _resets(trace: TraceRun, **fields: Any) -> list[dict[str, Any]]:
    return [
        record
        for record in trace.records()
        if record.get("type") == "reset" and all(record.get(key) == value for key, value in fields.items())
    ]


def _wait(trace: TraceRun, count: int = 1, **fields: Any) -> None:
    trace.wait_records(
        lambda r: r.get("type") == "reset" and all(r.get(key) == value for key, value in fields.items()),
        count,
    )


@pytest.mark.parametrize("family", [4, 6])
def test_closed_port_is_no_listener_and_refused(pair: Pair, family: int) -> None:
    server = pair.b4 if family == 4 else pair.b6
    with TraceRun("resets", "--host", server, "--port", "7081") as trace:
        trace.wait_ready()
        assert connect(pair.a, server, 7081) == "ERROR 111"
        _wait(trace, direction="sent")
        _wait(trace, direction="received")
        assert trace.stop() == 0
        sent = _resets(trace, direction="sent")[0]
        received = _resets(trace, direction="received")[0]
        summary = trace.summary()
    assert sent["cause_code"] == "no_listener"
    assert sent["state"] is None and sent["by_firewall"] is False
    assert sent["trigger"]["flags"] == "SYN" and sent["trigger"]["len"] == 0
    assert sent["saddr"] == server and sent["sport"] == 7081 and sent["family"] == family
    assert sent["netns"] == pair.b.inode and sent["netns_name"] == pair.b.name
    assert sent["reason"] in ("NO_SOCKET", None)  # None only on kernels before 6.10
    assert f"nothing listens on {sent['local']} (netns {pair.b.name})" in sent["cause"]
    assert "ss -ltnp 'sport = :7081'" in sent["check"]
    assert received["cause_code"] == "connection_refused" and received["state"] == "SYN_SENT"
    assert received["side"] == "client" and received["comm"].startswith("python")
    assert received["peer_cause"] == sent["cause"]
    assert summary["sent"]["total"] == 1 and summary["received"]["total"] == 1
    assert summary["total"] == 2


def test_non_syn_segment_to_listener(pair: Pair) -> None:
    with Server(pair.b, pair.b4, 7082, "hold") as server, TraceRun("resets", "--netns", pair.b.name) as trace:
        trace.wait_ready()
        send_segment(pair.a, pair.a4, pair.b4, 40001, 7082, "A", 1000, 2000)
        _wait(trace, direction="sent")
        assert trace.stop() == 0
        sent = _resets(trace, direction="sent")[0]
    assert sent["cause_code"] == "non_syn_to_listener"
    assert sent["state"] == "LISTEN"
    assert sent["trigger"] == {"flags": "ACK", "seq": 1000, "ack": 2000, "len": 0}
    assert sent["reason"] in ("TCP_FLAGS", None)
    assert sent["daddr"] == pair.a4 and sent["dport"] == 40001
    # The listener's owner, seen when it called listen().
    assert sent["pid"] == server.pid and sent["owner"] == "socket"
    assert "which only accepts SYNs" in sent["cause"]
    conntrack = sent["conntrack"]
    assert conntrack is not None and "loaded" in conntrack
    if conntrack["loaded"]:
        assert "nf_conntrack_tcp_be_liberal=" in sent["cause"] and conntrack["be_liberal"] in (0, 1)
    assert "nf_conntrack_tcp_be_liberal=1" in sent["check"]


def test_linger_zero_abort(pair: Pair) -> None:
    with Server(pair.b, pair.b4, 7083, "linger0") as server, TraceRun("resets", "--port", "7083") as trace:
        trace.wait_ready()
        assert connect(pair.a, pair.b4, 7083) == "ERROR 104"
        _wait(trace, direction="sent")
        _wait(trace, direction="received")
        assert trace.stop() == 0
        sent = _resets(trace, direction="sent")[0]
        received = _resets(trace, direction="received")[0]
    assert sent["cause_code"] == "linger_zero" and sent["linger_zero"] is True
    assert sent["trigger"] is None  # an abortive close answers no segment
    assert sent["reason"] in ("TCP_STATE", None)
    assert sent["pid"] == server.pid and sent["owner"] == "task" and sent["comm"].startswith("python")
    assert "SO_LINGER {on, 0}" in sent["cause"]
    assert received["cause_code"] == "peer_reset" and received["state"] == "ESTABLISHED"
    assert received["peer_cause"] == sent["cause"]


def _one_abort(pair: Pair, server: str, client: Host, *filters: str) -> tuple[list[dict[str, Any]], int]:
    """The resets, and the summary's total, of a trace with `filters` while a server at `server`:7088 (in b)
    aborts one connection from `client`. Once connect() has seen ECONNRESET, both the RST sent and the RST
    received are counted in the kernel: the summary read after the stop is final."""
    with Server(pair.b, server, 7088, "linger0"), TraceRun("resets", *filters) as trace:
        trace.wait_ready()
        assert connect(client, server, 7088) == "ERROR 104"
        assert trace.stop() == 0
        return _resets(trace), trace.summary()["total"]


def test_port_filters_read_each_reset_as_its_record_does(pair: Pair) -> None:
    # On one namespace's loopback both ends are traced: the server's abortive close sends an RST from :7088
    # and the client receives it. Both records say sport 7088 (the RST packet's source), so --sport 7088
    # matches both and --dport 7088 neither. The kernel read a received RST from the socket's side (source =
    # the local port) and kept the wrong half of each.
    resets, total = _one_abort(pair, "127.0.0.1", pair.b, "--netns", pair.b.name, "--sport", "7088")
    assert sorted(r["direction"] for r in resets) == ["received", "sent"], resets
    assert all(r["sport"] == 7088 and r["dport"] != 7088 for r in resets), resets
    assert total == 2
    resets, total = _one_abort(pair, "127.0.0.1", pair.b, "--netns", pair.b.name, "--dport", "7088")
    assert resets == [] and total == 0


def test_address_filters_read_each_reset_as_its_record_does(pair: Pair) -> None:
    # The server in b aborts a connection from a: one RST from b to a, sent in b and received in a; both
    # records say saddr b, daddr a, and --src b --dst a keeps both.
    resets, total = _one_abort(pair, pair.b4, pair.a, "--src", pair.b4, "--dst", pair.a4, "--port", "7088")
    assert sorted(r["direction"] for r in resets) == ["received", "sent"], resets
    assert all(r["saddr"] == pair.b4 and r["daddr"] == pair.a4 for r in resets), resets
    assert total == 2


def test_close_with_unread_data(pair: Pair) -> None:
    payload = "x" * 37
    with (
        Server(pair.b, pair.b4, 7084, "unread", str(len(payload))) as server,
        TraceRun("resets", "--port", "7084", "--netns", pair.b.name) as trace,
    ):
        trace.wait_ready()
        assert connect(pair.a, pair.b4, 7084, payload=payload) == "ERROR 104"
        _wait(trace, direction="sent")
        assert trace.stop() == 0
        sent = _resets(trace, direction="sent")[0]
    assert sent["cause_code"] == "unread_data"
    assert sent["unread"] == len(payload)
    assert sent["reason"] in ("TCP_ABORT_ON_CLOSE", None)
    assert sent["pid"] == server.pid and sent["owner"] == "task"
    assert f"with {len(payload)} bytes it had not read" in sent["cause"]


def test_reject_with_tcp_reset_rule_is_named(pair: Pair) -> None:
    pair.b.run(
        "iptables",
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        "7085",
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    )
    with TraceRun("resets", "--port", "7085") as trace:
        trace.wait_ready()
        assert connect(pair.a, pair.b4, 7085) == "ERROR 111"
        _wait(trace, by_firewall=True)
        _wait(trace, direction="received")
        assert trace.stop() == 0
        firewall = _resets(trace, by_firewall=True)[0]
        received = _resets(trace, direction="received")[0]
        summary = trace.summary()
    rule = "-A INPUT -p tcp -m tcp --dport 7085 -j REJECT --reject-with tcp-reset"
    assert firewall["cause_code"] == "firewall_reject" and firewall["direction"] == "sent"
    assert firewall["netfilter"]["rule"] == rule
    assert firewall["netfilter"]["hook"] == "input" and firewall["netfilter"]["chain"] == "INPUT"
    assert f'"{rule}"' in firewall["cause"] and f"netns {pair.b.name}" in firewall["cause"]
    assert firewall["trigger"]["flags"] == "SYN" and firewall["trigger"]["inferred"] is True
    assert firewall["netns"] == pair.b.inode
    # No TCP-stack RST: the kernel's own tcp_send_reset never fired for this port.
    assert not [
        r
        for r in summary["groups"]
        if r["example"]["direction"] == "sent" and not r["example"]["by_firewall"]
    ]
    assert received["cause_code"] == "connection_refused" and received["peer_cause"] == firewall["cause"]
    assert summary["firewall"]["total"] == 1


def test_summary_counts_exactly(pair: Pair) -> None:
    with TraceRun("resets", "--summary", "--netns", pair.b.name, "--port", "7086") as trace:
        trace.wait_ready()
        for _ in range(5):
            assert connect(pair.a, pair.b4, 7086) == "ERROR 111"
        assert trace.stop() == 0
        summary = trace.summary()
        assert not _resets(trace)  # --summary prints no individual resets
    assert summary["sent"]["total"] == 5 and summary["sent"]["emitted"] == 0
    assert summary["received"]["total"] == 0  # the receiver is in another netns
    [group] = summary["groups"]
    assert group["count"] == 5 and group["example"]["cause_code"] == "no_listener"


def _program_ids() -> set[int]:
    return {int(program["id"]) for program in bpftool_netsleuth_programs("nst_")}


def test_nothing_left_attached(pair: Pair) -> None:
    # By program id: another tracer on the host (an agent, a parallel test) may hold tcp programs of its own.
    before = _program_ids()
    with TraceRun("resets", "--netns", pair.b.name) as trace:
        trace.wait_ready()
        ours = _program_ids() - before
        assert ours
        assert trace.stop() == 0
    # The kernel frees programs once the last fd closes, after an RCU grace period: wait, bounded.
    wait_for(lambda: not ours & _program_ids(), 10, "programs released")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "0"], "--port '0' is not a port"),
        (["--proto", "udp"], "--proto can only be tcp: this command traces TCP"),
        (["--duration=0"], "--duration '0' is not a positive number of seconds"),
        (["--host", "not-an-ip"], "is not an IP address"),
        (["--summary", "--stack"], "--stack needs individual resets: it cannot be combined with --summary"),
        (["--netns", "no-such-netns-xyz"], "unknown network namespace"),
    ],
)
def test_bad_input_exits_2(argv: list[str], message: str) -> None:
    result = subprocess.run(netsleuth_argv("resets", *argv), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
