"""The table that infers a drop's reason from where the packet was freed (netsleuth.kernel.inferred_reasons,
for kernels before 5.17 whose skb:kfree_skb has no reason), checked against this kernel's own reasons: real
drops of each kind the table names - a firewall rule, no socket (TCP and UDP, IPv4 and IPv6), a full UDP
receive buffer - are traced with `netsleuth drops`, and the reason inferred from each drop's location must be
the one the kernel gave."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from netsleuth.kernel.inferred_reasons import infer_reason
from tests.privileged.conftest import Pair
from tests.privileged.test_drops import UDP_SINK, tcp_connect, udp
from tests.tracerun import TraceRun


def _inferred_and_given(drops: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (drop["location"].split("+", 1)[0], infer_reason(drop["location"]), drop["reason"]) for drop in drops
    }


def test_inferred_reasons_match_the_kernels_reasons(pair: Pair) -> None:
    pair.b.run("iptables", "-A", "INPUT", "-p", "udp", "--dport", "5601", "-j", "DROP")
    sink = pair.b.popen(
        [sys.executable, "-c", UDP_SINK, "5602"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert sink.stdout is not None and sink.stdout.readline().strip() == b"bound"
        with TraceRun("drops", "--netns", pair.b.name) as trace:
            trace.wait_ready()
            udp(pair.a, pair.b4, 5601)  # firewall
            udp(pair.a, pair.b4, 5603)  # no UDP socket
            udp(pair.a, pair.b6, 5603)
            tcp_connect(pair.a, pair.b4, 5604)  # no TCP socket
            tcp_connect(pair.a, pair.b6, 5604)
            udp(pair.a, pair.b4, 5602, count=200)  # the sink's receive buffer overflows
            wanted = {"NETFILTER_DROP", "NO_SOCKET", "SOCKET_RCVBUFF"}
            trace.wait_records(lambda r: r.get("reason") in wanted, 6)
            trace.wait_records(lambda r: r.get("reason") == "SOCKET_RCVBUFF")
            trace.wait_records(lambda r: r.get("reason") == "NO_SOCKET" and r.get("proto") == "tcp", 2)
            trace.wait_records(lambda r: r.get("reason") == "NO_SOCKET" and r.get("proto") == "udp", 2)
            assert trace.stop() == 0
            drops = [d for d in trace.drops() if d["dport"] in (5601, 5602, 5603, 5604)]
    finally:
        sink.kill()
        sink.wait()
    found = _inferred_and_given(drops)
    assert {given for _, _, given in found} == {"NETFILTER_DROP", "NO_SOCKET", "SOCKET_RCVBUFF"}
    # Every location the kernel named a reason at is in the table, with that reason.
    assert all(inferred == given for _, inferred, given in found), found
