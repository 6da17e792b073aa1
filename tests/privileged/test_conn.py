"""`netsleuth conn` end to end: connections between namespaces, killed in known ways, and their verdicts."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from netsleuth.diagnostics.drops.program import FALLBACK_ENV
from tests.netlab import Host, Lab, lab
from tests.privileged.conftest import Pair
from tests.privileged.tcp_helpers import Server, connect
from tests.tracerun import TraceRun, netsleuth_argv


def _fast_syn_timeout(host: Host) -> None:
    """Give up a connect after one SYN retransmission (per-namespace sysctls, gone with the namespace)."""
    host.run("sysctl", "-qw", "net.ipv4.tcp_syn_retries=1")
    if Path("/proc/sys/net/ipv4/tcp_syn_linear_timeouts").exists():  # 6.5+: extra linear retries first
        host.run("sysctl", "-qw", "net.ipv4.tcp_syn_linear_timeouts=0")


def _conns(trace: TraceRun) -> list[dict[str, Any]]:
    return [record for record in trace.records() if record.get("type") == "conn"]


def _connect_through_an_input_drop(pair: Pair, port: int) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A connect from a to b:port that b's INPUT drops until it times out, traced by conn: its record, the
    run's summary and stderr. The tcp side is scoped to the client's namespace; the drop is the server's."""
    _fast_syn_timeout(pair.a)
    pair.b.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP")
    with TraceRun("conn", "--dst", f"{pair.b4}:{port}", "--netns", pair.a.name) as trace:
        trace.wait_ready()
        assert connect(pair.a, pair.b4, port, timeout=30) == "ERROR 110"
        trace.wait_records(lambda r: r.get("type") == "conn")
        assert trace.stop() == 0
        [conn] = _conns(trace)
        return conn, trace.summary(), trace.stderr()


def test_verdict_for_a_connection_killed_by_a_firewall_drop(pair: Pair) -> None:
    conn, summary, _ = _connect_through_an_input_drop(pair, 7090)
    rule = "-A INPUT -p tcp -m tcp --dport 7090 -j DROP"
    client = f"{pair.a4}:{conn['sport']}"
    assert conn["outcome"] == "timeout" and conn["established"] is False
    assert conn["errno"] == "ETIMEDOUT"
    assert conn["syn_retransmits"] >= 1 and conn["drops"] == conn["syn_retransmits"] + 1
    assert conn["verdict"] == (
        f"connect {client} → {pair.b4}:7090 failed after {conn['syn_retransmits']} SYN retransmit"
        f'{"s" if conn["syn_retransmits"] > 1 else ""}: SYNs dropped by NETFILTER_DROP at "{rule}" '
        f"(netns {pair.b.name})"
    )
    assert conn["client_netns"] == pair.a.name and conn["server_netns"] is None
    assert conn["comm"].startswith("python") and conn["owner"] == "task"
    events = [(entry["event"], entry["netns"]) for entry in conn["timeline"]]
    assert ("drop", pair.b.name) in events and ("retransmit", pair.a.name) in events
    assert events[0] == ("state", pair.a.name)  # connect() comes first
    drop = next(entry for entry in conn["timeline"] if entry["event"] == "drop")
    assert drop["reason"] == "NETFILTER_DROP" and drop["netfilter"]["rule"] == rule
    assert summary["connections"] == 1 and summary["outcomes"] == {"timeout": 1}


def test_inferred_drop_reasons_are_marked_in_the_verdict_and_timeline(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a kernel without drop reasons (forced here), conn says the reason is inferred, as drops does."""
    monkeypatch.setenv(FALLBACK_ENV, "no-reason")  # TraceRun's netsleuth inherits it
    conn, _, stderr = _connect_through_an_input_drop(pair, 7091)
    rule = "-A INPUT -p tcp -m tcp --dport 7091 -j DROP"
    assert f'SYNs dropped by NETFILTER_DROP (inferred) at "{rule}"' in conn["verdict"], conn["verdict"]
    drops = [entry for entry in conn["timeline"] if entry["event"] == "drop"]
    assert drops and len(drops) == conn["drops"]
    assert all(entry["reason"] == "NETFILTER_DROP" and entry["reason_inferred"] is True for entry in drops)
    assert all("NETFILTER_DROP (inferred)" in entry["text"] for entry in drops)
    assert "inferred from where each packet was freed" in stderr


def test_verdict_for_a_connection_killed_by_a_reset(pair: Pair) -> None:
    with (
        Server(pair.b, pair.b4, 7091, "linger0") as server,
        TraceRun("conn", "--dst", f"{pair.b4}:7091") as trace,
    ):
        trace.wait_ready()
        assert connect(pair.a, pair.b4, 7091) == "ERROR 104"
        trace.wait_records(lambda r: r.get("type") == "conn")
        assert trace.stop() == 0
        [conn] = _conns(trace)
    assert conn["outcome"] == "reset" and conn["established"] is True
    assert conn["verdict"].startswith(
        f"connection {pair.a4}:{conn['sport']} → {pair.b4}:7091 established in "
    )
    closer = f"python3[{server.pid}] closed {pair.b4}:7091 -> {pair.a4}:{conn['sport']}"
    assert "reset by the server after" in conn["verdict"]
    assert f"{closer} with SO_LINGER {{on, 0}}" in conn["verdict"]
    assert conn["client_netns"] == pair.a.name and conn["server_netns"] == pair.b.name
    states = [entry["text"] for entry in conn["timeline"] if entry["event"] == "state"]
    assert any(text.startswith("SYN_SENT → ESTABLISHED") for text in states)
    assert any(text.startswith("LISTEN → SYN_RECV") for text in states)
    resets = [entry for entry in conn["timeline"] if entry["event"] == "reset"]
    assert {entry["direction"] for entry in resets} == {"sent", "received"}


def test_verdict_for_a_reject_rule(pair: Pair) -> None:
    pair.b.run(
        "iptables",
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        "7092",
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    )
    with TraceRun("conn", "--dst", f"{pair.b4}:7092") as trace:
        trace.wait_ready()
        assert connect(pair.a, pair.b4, 7092) == "ERROR 111"
        trace.wait_records(lambda r: r.get("type") == "conn")
        assert trace.stop() == 0
        [conn] = _conns(trace)
    rule = "-A INPUT -p tcp -m tcp --dport 7092 -j REJECT --reject-with tcp-reset"
    assert conn["outcome"] == "refused" and conn["errno"] == "ECONNREFUSED"
    assert conn["verdict"] == (
        f'connect {pair.a4}:{conn["sport"]} → {pair.b4}:7092 refused by firewall rule "{rule}" '
        f"(filter/INPUT, netns {pair.b.name})"
    )


def test_ipv6_endpoint_and_closed_port(pair: Pair) -> None:
    with TraceRun("conn", "--dst", f"[{pair.b6}]:7093") as trace:
        trace.wait_ready()
        assert connect(pair.a, pair.b6, 7093) == "ERROR 111"
        # Another port on the same host is not selected.
        assert connect(pair.a, pair.b6, 7094) == "ERROR 111"
        trace.wait_records(lambda r: r.get("type") == "conn")
        assert trace.stop() == 0
        conns = _conns(trace)
    assert [conn["dport"] for conn in conns] == [7093]
    [conn] = conns
    assert conn["family"] == 6 and conn["server"] == f"[{pair.b6}]:7093"
    assert conn["verdict"].endswith(f"refused: nothing listens on [{pair.b6}]:7093 (netns {pair.b.name})")


def test_text_output_has_timeline_and_verdict(pair: Pair) -> None:
    with TraceRun("conn", "--dst", f"{pair.b4}:7095", json_output=False) as trace:
        trace.wait_ready()
        assert connect(pair.a, pair.b4, 7095) == "ERROR 111"
        assert trace.stop() == 0
        text = trace.stdout()
    assert f"connection {pair.a4}:" in text and f"→ {pair.b4}:7095" in text
    assert "  verdict: connect " in text and "refused: nothing listens on" in text
    assert text.rstrip().endswith("1 connection: 1 refused")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dst", "198.18.0.2:99999"], "is not a port"),
        (["--dst", "[2001:db8::1"], "write an IPv6 endpoint as [ADDR]:PORT"),
        (["--dst", "198.18.0.2:80", "--dst", "198.18.0.3:81"], "give one server port"),
        (["--dst", "198.18.0.2:80", "--dport", "81"], "disagree"),
        (["--proto", "udp"], "--proto can only be tcp"),
    ],
)
def test_bad_input_exits_2(argv: list[str], message: str) -> None:
    result = subprocess.run(netsleuth_argv("conn", *argv), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def _nat_lab(the_lab: Lab) -> tuple[Host, Host, Host]:
    """client (198.18.70.1) -> lb (198.18.70.2 | 198.18.71.1; nftables DNAT 198.18.70.2:80 ->
    198.18.71.2:8080) -> server (198.18.71.2), all namespaces of this host."""
    client, balancer, server = the_lab.host("c"), the_lab.host("lb"), the_lab.host("s")
    the_lab.link(client, balancer, ["198.18.70.1/24"], ["198.18.70.2/24"])
    the_lab.link(balancer, server, ["198.18.71.1/24"], ["198.18.71.2/24"], names=("veth1", "veth0"))
    server.run("ip", "route", "add", "default", "via", "198.18.71.1")
    balancer.run("sysctl", "-qw", "net.ipv4.ip_forward=1")  # per namespace: gone with it
    balancer.run(
        "nft",
        "-f",
        "-",
        input_text=(
            "table ip netsleuth_test_lb {\n"
            "  chain pre { type nat hook prerouting priority dstnat; "
            "ip daddr 198.18.70.2 tcp dport 80 dnat to 198.18.71.2:8080; }\n"
            "}\n"
        ),
    )
    return client, balancer, server


@pytest.mark.parametrize("select", ["netns", "dst"])
def test_verdict_through_dnat_names_the_hop_and_the_rule_that_dropped_the_translated_syn(select: str) -> None:
    """Issue 13 item 8: client -> lb (nftables DNAT 198.18.70.2:80 -> 198.18.71.2:8080) -> srv (INPUT drops
    8080), all on this host. The dropped SYN carries the translated pair; conntrack in lb joins it back.
    Selected by the client's namespace, or by the address it dials (which the dropped SYN no longer has)."""
    with lab() as the_lab:
        client, balancer, server = _nat_lab(the_lab)
        server.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "8080", "-j", "DROP")
        _fast_syn_timeout(client)
        selection = ("--netns", client.name) if select == "netns" else ("--dst", "198.18.70.2:80")
        with TraceRun("conn", *selection) as trace:
            trace.wait_ready()
            # conn reads lb's entry while the client retries (it lives 120 s in SYN_SENT there).
            assert connect(client, "198.18.70.2", 80, timeout=30) == "ERROR 110"
            trace.wait_records(lambda r: r.get("type") == "conn" and r.get("daddr") == "198.18.70.2")
            assert trace.stop() == 0
            [conn] = [record for record in _conns(trace) if record["daddr"] == "198.18.70.2"]
    rule = "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"
    client_end = f"198.18.70.1:{conn['sport']}"
    retransmits = conn["syn_retransmits"]
    assert conn["outcome"] == "timeout" and retransmits >= 1
    assert conn["verdict"] == (
        f"connect {client_end} → 198.18.70.2:80 failed after {retransmits} SYN retransmit"
        f"{'s' if retransmits > 1 else ''}: DNAT 198.18.70.2:80 → 198.18.71.2:8080 in netns {balancer.name}, "
        f'then SYNs dropped by NETFILTER_DROP at "{rule}" (netns {server.name})'
    )
    assert conn["drops"] == retransmits + 1
    [hop] = conn["nat"]
    assert hop["kind"] == "DNAT" and hop["where"] == f"netns {balancer.name}"
    assert hop["before"] == {"src": "198.18.70.1", "sport": conn["sport"], "dst": "198.18.70.2", "dport": 80}
    assert hop["after"] == {"src": "198.18.70.1", "sport": conn["sport"], "dst": "198.18.71.2", "dport": 8080}
    assert hop["state"] == "SYN_SENT" and "DST_NAT" in hop["status"]
    events = [(entry["event"], entry["netns"]) for entry in conn["timeline"]]
    assert ("nat", balancer.name) in events and ("drop", server.name) in events
    assert events.index(("nat", balancer.name)) < events.index(("drop", server.name))


def test_refused_through_dnat_names_the_hop_from_the_entry_the_rst_killed() -> None:
    """Nothing listens on 198.18.71.2:8080: the server's RST kills lb's SYN_SENT entry at once, so only its
    destroy event (kept by the reader from the start) can name the hop."""
    with lab() as the_lab:
        client, balancer, _ = _nat_lab(the_lab)
        with TraceRun("conn", "--netns", client.name) as trace:
            trace.wait_ready()
            assert connect(client, "198.18.70.2", 80) == "ERROR 111"
            trace.wait_records(lambda r: r.get("type") == "conn" and r.get("daddr") == "198.18.70.2")
            assert trace.stop() == 0
            [conn] = [record for record in _conns(trace) if record["daddr"] == "198.18.70.2"]
    assert conn["outcome"] == "refused"
    assert conn["verdict"] == (
        f"connect 198.18.70.1:{conn['sport']} → 198.18.70.2:80 refused: DNAT 198.18.70.2:80 → "
        f"198.18.71.2:8080 in netns {balancer.name}, then 198.18.71.2:8080 answered the SYN with RST"
    )
    [hop] = conn["nat"]
    assert hop["kind"] == "DNAT" and hop["state"] in ("CLOSE", "SYN_SENT")
