"""`netsleuth route` for IPv6 (fib6:fib6_table_lookup, neighbour discovery) against real policy routing in
namespaces: a flow steered by `ip -6 rule` into table 100, an IPv6 blackhole route counted exactly, a next hop
that never answers neighbour solicitation and the packets the kernel drops behind it, and the `diagnose`
verdicts. Addresses only from 2001:db8::/32, added with `nodad` so no test waits for duplicate detection."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.netlab import Host
from tests.privileged.conftest import Pair
from tests.tracerun import TraceRun, diagnose_verdicts

pytestmark = pytest.mark.privileged

CLIENT = "2001:db8:3::1"
PEER = "2001:db8:3::2"
STEERED = (
    "2001:db8:7::5"  # table 100 via PEER, by `ip -6 rule from 2001:db8:3::/64 to 2001:db8:7::/64 lookup 100`
)
BLACKHOLED = (
    "2001:db8:5::9"  # blackhole 2001:db8:5::/64 in table 100 (`ip -6 rule from 2001:db8:3::/64 lookup 100`)
)
SILENT_HOP = "2001:db8:3::9"  # a gateway nobody answers neighbour solicitations for
BEHIND_SILENT_HOP = "2001:db8:9::4"

# UDP datagrams from a bound source, one sendto each (an unconnected socket looks its route up for every
# datagram); prints how many the kernel accepted and the errno of the rest.
SENDER = r"""
import errno, socket, sys
src, dst, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
sock = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((src, 0))
sent = failed = 0
codes = set()
for _ in range(count):
    try:
        sock.sendto(b"route-test", (dst, 9999))
        sent += 1
    except OSError as error:
        failed += 1
        codes.add(errno.errorcode.get(error.errno, str(error.errno)))
print(sent, failed, ",".join(sorted(codes)))
"""


@pytest.fixture
def routed6(pair: Pair) -> Iterator[Pair]:
    """The pair with IPv6 policy routing on the client (a): table 100 with a route via the peer and a
    blackhole, two `ip -6 rule`s, and a main-table route through a gateway that never answers (one
    solicitation, 100 ms: it fails within the test). The namespaces' own sysctls go with them."""
    a: Host = pair.a
    pair.b.run("ip", "addr", "add", f"{PEER}/64", "dev", "veth0", "nodad")
    a.run("ip", "addr", "add", f"{CLIENT}/64", "dev", "veth0", "nodad")
    a.run("ip", "-6", "route", "add", "2001:db8:7::/64", "via", PEER, "dev", "veth0", "table", "100")
    a.run("ip", "-6", "route", "add", "blackhole", "2001:db8:5::/64", "table", "100")
    a.run(
        "ip",
        "-6",
        "rule",
        "add",
        "from",
        "2001:db8:3::/64",
        "to",
        "2001:db8:7::/64",
        "lookup",
        "100",
        "pref",
        "900",
    )
    a.run("ip", "-6", "rule", "add", "from", "2001:db8:3::/64", "lookup", "100", "pref", "1000")
    a.run("ip", "-6", "route", "add", "2001:db8:9::/64", "via", SILENT_HOP, "dev", "veth0")
    a.run("sysctl", "-qw", "net.ipv6.neigh.veth0.mcast_solicit=1", "net.ipv6.neigh.veth0.retrans_time_ms=100")
    yield pair


def send(host: Host, src: str, dst: str, count: int) -> tuple[int, int, str]:
    out = host.run(sys.executable, "-c", SENDER, src, dst, str(count)).stdout.split()
    return int(out[0]), int(out[1]), out[2] if len(out) > 2 else ""


def of_type(records: list[dict[str, Any]], record_type: str) -> list[dict[str, Any]]:
    return [record for record in records if record.get("type") == record_type]


def test_ipv6_rule_and_table_named_for_a_steered_flow(routed6: Pair) -> None:
    run_ = TraceRun("route", "-6", "--netns", routed6.a.name, "--dport", "9999")
    try:
        run_.wait_ready()
        # The same port over IPv4 in the same namespace: left out by -6, in the kernel.
        assert send(routed6.a, routed6.a4, routed6.b4, 3)[0] == 3
        sent, failed, _ = send(routed6.a, CLIENT, STEERED, 5)
        assert (sent, failed) == (5, 0)
        run_.wait_records(lambda record: record.get("type") == "route", count=5)
    finally:
        run_.stop()
    lookups = of_type(run_.records(), "route")
    assert len(lookups) == 5, lookups  # one per IPv6 datagram (-6, --dport in the kernel)
    for lookup in lookups:
        assert lookup["family"] == 6 and lookup["netns_name"] == routed6.a.name
        assert lookup["table"] == 100 and lookup["result"] == "route"
        assert lookup["rule"] == "900: from 2001:db8:3::/64 to 2001:db8:7::/64 lookup 100"
        assert lookup["route"] == f"2001:db8:7::/64 via {PEER} dev veth0 metric 1024"
        assert lookup["gateway"] == PEER and lookup["dev"] == "veth0"
        assert (lookup["src"], lookup["dst"], lookup["proto"], lookup["dport"]) == (
            CLIENT,
            STEERED,
            "udp",
            9999,
        )
        assert lookup["comm"].startswith("python")
    summary = run_.records()[-1]
    assert summary["type"] == "summary" and summary["by_kind"]["lookup"]["total"] == 5


def test_ipv6_blackhole_route_counted_exactly_and_named(routed6: Pair) -> None:
    run_ = TraceRun("route", "--netns", routed6.a.name, "--failed", "--summary")
    try:
        run_.wait_ready()
        sent, failed, codes = send(routed6.a, CLIENT, BLACKHOLED, 37)
        assert (sent, failed, codes) == (0, 37, "EINVAL")  # an IPv6 blackhole fails the send with EINVAL too
    finally:
        run_.stop()
    summary = run_.records()[-1]
    groups = [group for group in summary["groups"] if group["kind"] == "lookup"]
    assert len(groups) == 1, groups
    assert groups[0]["count"] == 37 and summary["by_kind"]["lookup"]["total"] == 37
    example = groups[0]["example"]
    assert (example["family"], example["result"], example["err"], example["table"]) == (
        6,
        "blackhole",
        -22,
        100,
    )
    assert example["route"] == "blackhole 2001:db8:5::/64 dev lo metric 1024"
    assert example["rule"] == "1000: from 2001:db8:3::/64 lookup 100"
    assert example["dst"] == BLACKHOLED and example["netns_name"] == routed6.a.name
    assert example["dev"] is None and example["gateway"] is None  # a reject route forwards nowhere


def test_unresolved_ipv6_next_hop_fails_and_its_packets_are_dropped(routed6: Pair) -> None:
    run_ = TraceRun("route", "-6", "--netns", routed6.a.name, "--failed")
    try:
        run_.wait_ready()
        sent, _, _ = send(routed6.a, CLIENT, BEHIND_SILENT_HOP, 3)
        assert sent == 3  # queued while neighbour discovery runs: the send itself succeeds
        run_.wait_records(
            lambda record: record.get("type") == "neigh" and record["event"] == "failed", timeout=10
        )
        run_.wait_records(lambda record: record.get("type") == "route_drop", count=3, timeout=10)
    finally:
        run_.stop()
    records = run_.records()
    failures = of_type(records, "neigh")
    assert {(r["family"], r["address"], r["dev"], r["event"]) for r in failures} == {
        (6, SILENT_HOP, "veth0", "failed")
    }
    # ndisc frees the held packets without a drop reason; route counts them by where they are freed.
    drops = of_type(records, "route_drop")
    assert len(drops) == 3
    assert {(drop["reason"], drop["src"], drop["dst"]) for drop in drops} == {
        ("NEIGH_FAILED", CLIENT, BEHIND_SILENT_HOP)
    }
    assert not of_type(records, "route")


def test_diagnose_turns_ipv6_blackhole_and_silent_next_hop_into_verdicts(routed6: Pair) -> None:
    def traffic() -> None:
        send(routed6.a, CLIENT, BLACKHOLED, 12)
        send(routed6.a, CLIENT, BEHIND_SILENT_HOP, 4)

    verdicts = diagnose_verdicts("--netns", routed6.a.name, traffic=traffic, duration=3, attach_timeout=30)
    by_category = {verdict["category"]: verdict for verdict in verdicts}
    blackhole = by_category["route-reject"]
    assert (
        f"packets to {BLACKHOLED} from netns {routed6.a.name} hit blackhole route 2001:db8:5::/64 in table "
        "100 (ip rule 1000: from 2001:db8:3::/64 lookup 100)" in blackhole["cause"]
    )
    assert blackhole["evidence"]["lookups"] == 12
    assert any("ip -6 rule del pref 1000" in fix for fix in blackhole["fix"])
    silent = by_category["next-hop-unresolved"]
    assert f"next hop {SILENT_HOP} never answered neighbour solicitation" in silent["cause"]
    assert silent["evidence"]["drops"] == 4
    # Those 4 drops carry no reason (ndisc frees them with kfree_skb): not reported again as plain drops.
    assert not [verdict for verdict in verdicts if "neigh_invalidate" in verdict["cause"]], verdicts
