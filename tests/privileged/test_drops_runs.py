"""The per-CPU runs of `drops --summary` (bpf/drops.h struct drop_run) keep every group exact when kinds of
drops alternate on one CPU, which flushes a run on almost every drop, as well as in a one-kind storm."""

from __future__ import annotations

import sys

from tests.privileged.conftest import Pair
from tests.tracerun import TraceRun

COUNT = 20_000

# Alternate two kinds of drop from one process, two of each in turn, so both happen on its CPU and every
# change of kind flushes a run of two: a datagram to port 5950 that the OUTPUT rule drops (NETFILTER_DROP,
# refused with EPERM), and one over loopback to a port nobody listens on (NO_SOCKET in the receive path,
# unless the backlog overflows first).
_ALTERNATE = """
import socket, sys
count, refused = int(sys.argv[1]), 0
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(count // 2):
    for _ in range(2):
        try:
            s.sendto(b'x', ('198.18.0.2', 5950))
        except PermissionError:
            refused += 1
    for _ in range(2):
        try:
            s.sendto(b'y', ('127.0.0.1', 5951))
        except OSError:
            pass  # the loopback port's ICMP error comes back on the next send
print(refused)
"""


def test_alternating_kinds_keep_exact_groups(pair: Pair) -> None:
    pair.a.run("ip", "link", "set", "lo", "up")
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "5950", "-j", "DROP")
    with TraceRun("drops", "--summary", "--netns", pair.a.name) as trace:
        trace.wait_ready()
        refused = int(pair.a.run(sys.executable, "-c", _ALTERNATE, str(COUNT)).stdout)
        assert trace.stop() == 0
        summary = trace.summary()
    assert refused == COUNT
    by_reason: dict[str, int] = {}
    for group in summary["groups"]:
        by_reason[group["reason"]] = by_reason.get(group["reason"], 0) + group["count"]
    assert by_reason["NETFILTER_DROP"] == COUNT
    # Every loopback datagram was dropped once: at the closed port, or before it when the backlog was full.
    assert by_reason["NO_SOCKET"] + by_reason.get("CPU_BACKLOG", 0) == COUNT
    # Nothing is left in a run: the groups add up to the exact total.
    assert sum(by_reason.values()) == summary["total"]
    assert summary["ungrouped"] == 0 and summary["lost"] == 0
