"""`diagnose`'s route verdicts from the kernel's groups: reject routes named with rule, table and prefix;
failed next hops with the packets dropped behind them (joined through the lookups that chose the hop)."""

from __future__ import annotations

from netsleuth.diagnostics.route.policy import table_name
from netsleuth.diagnostics.route.records import NeighRecord, RouteDropRecord, RouteGroup, RouteLookupRecord
from netsleuth.diagnostics.route.rules import route_verdicts
from netsleuth.spec.records import WallTime

NETNS = 4026532999


def lookup(
    dst: str, result: str, err: int, route: str | None, rule: str | None, gateway: str | None = None
) -> RouteLookupRecord:
    table = 100 if err else 254
    return RouteLookupRecord(
        time=WallTime(1.0), netns=NETNS, netns_name="client", table=table, table_name=table_name(table),
        family=4, result=result, err=err, src="198.18.3.1", dst=dst, proto="udp", sport=40000, dport=9999,
        iif="lo", oif=None, mark=0, gateway=gateway, dev="veth0" if gateway else None, rule=rule, route=route,
        pid=42, comm="python3", cpu=0,
    )  # fmt: skip


def neigh(netns_name: str | None, address: str, family: int = 4) -> NeighRecord:
    return NeighRecord(
        time=WallTime(1.0), netns=NETNS, netns_name=netns_name, family=family, event="failed",
        address=address, dev="veth0", state="FAILED",
    )  # fmt: skip


def route_drop(netns: int, netns_name: str, src: str, dst: str) -> RouteDropRecord:
    return RouteDropRecord(
        time=WallTime(1.0), netns=netns, netns_name=netns_name, reason="NEIGH_FAILED", src=src, dst=dst,
        proto="udp", dev="veth0",
    )  # fmt: skip


def group(kind: str, count: int, example: RouteLookupRecord | NeighRecord | RouteDropRecord) -> RouteGroup:
    return RouteGroup(
        kind=kind, count=count, first_time=WallTime(1.0), last_time=WallTime(2.0), example=example
    )


def test_blackhole_lookups_become_one_verdict_naming_rule_table_and_prefix() -> None:
    example = lookup(
        "198.18.5.9", "blackhole", -22, "blackhole 198.18.5.0/24", "1000: from 198.18.3.0/24 lookup 100"
    )
    verdicts, explained = route_verdicts([group("lookup", 30, example), group("lookup", 7, example)], 10.0)
    assert explained == 0
    (verdict,) = verdicts
    assert verdict.category == "route-reject"
    assert verdict.cause == (
        "packets to 198.18.5.9 from netns client hit blackhole route 198.18.5.0/24 in table 100 "
        "(ip rule 1000: from 198.18.3.0/24 lookup 100): 37 lookup(s) refused"
    )
    assert verdict.evidence["lookups"] == 37 and verdict.evidence["process"] == {"comm": "python3", "pid": 42}
    assert (
        verdict.fix[0] == "ip netns exec client ip route del blackhole 198.18.5.0/24 table 100"
        "   # if this traffic should be routed"
    )


def test_failed_next_hop_gets_the_drops_of_destinations_routed_through_it() -> None:
    hop = neigh("client", "198.18.3.9")
    via_hop = lookup(
        "198.18.9.4",
        "route",
        0,
        "198.18.9.0/24 via 198.18.3.9 dev veth0",
        "32766: from all lookup main",
        "198.18.3.9",
    )
    drop = route_drop(NETNS, "client", "198.18.3.1", "198.18.9.4")
    other_drop = route_drop(NETNS + 1, "elsewhere", "198.18.4.1", "198.18.9.4")
    groups = [
        group("neigh", 2, hop),
        group("lookup", 37, via_hop),
        group("drop", 37, drop),
        group("drop", 5, other_drop),
    ]
    verdicts, explained = route_verdicts(groups, 10.0)
    assert explained == 37  # the other namespace's drops are not this hop's
    (verdict,) = verdicts
    assert verdict.category == "next-hop-unresolved"
    assert (
        verdict.cause
        == "next hop 198.18.3.9 never answered ARP: 37 packet(s) dropped (dev veth0, netns client)"
    )
    assert verdict.evidence["drops"] == 37 and verdict.evidence["resolution_failures"] == 2
    assert verdict.evidence["destinations"] == ["198.18.9.4"]


def test_a_failed_hop_without_drops_is_a_warning() -> None:
    hop = neigh(None, "2001:db8::9", family=6)
    (verdict,), _ = route_verdicts([group("neigh", 1, hop)], 5.0)
    assert verdict.severity.label == "warning"
    assert (
        verdict.cause == "next hop 2001:db8::9 never answered neighbour solicitation (1 time(s))"
        f" (dev veth0, netns {NETNS})"
    )


def test_ipv6_blackhole_verdict_names_rule_table_prefix_and_fixes_with_ip_6() -> None:
    example = RouteLookupRecord(
        time=WallTime(1.0), netns=NETNS, netns_name="client", table=100, table_name="100", family=6,
        result="blackhole", err=-22, src="2001:db8:3::1", dst="2001:db8:5::9", proto="udp", sport=40000,
        dport=9999, iif="lo", oif=None, mark=0, gateway=None, dev=None,
        rule="1000: from 2001:db8:3::/64 lookup 100", route="blackhole 2001:db8:5::/64 dev lo metric 1024",
        pid=42, comm="python3", cpu=0,
    )  # fmt: skip
    (verdict,), _ = route_verdicts([group("lookup", 12, example)], 3.0)
    assert verdict.cause == (
        "packets to 2001:db8:5::9 from netns client hit blackhole route 2001:db8:5::/64 in table 100 "
        "(ip rule 1000: from 2001:db8:3::/64 lookup 100): 12 lookup(s) refused"
    )
    # `ip rule` without -6 would act on the IPv4 rule of the same preference.
    assert verdict.fix == (
        "ip netns exec client ip -6 route del blackhole 2001:db8:5::/64 dev lo metric 1024 table 100"
        "   # if this traffic should be routed",
        "ip netns exec client ip -6 rule del pref 1000   # if the rule should not steer it",
        "ip netns exec client ip -6 route get 2001:db8:5::9 from 2001:db8:3::1"
        "   # what the kernel decides now",
    )


def test_failed_ipv6_next_hop_gets_its_drops() -> None:
    hop = neigh("client", "2001:db8:3::9", family=6)
    via_hop = RouteLookupRecord(
        time=WallTime(1.0), netns=NETNS, netns_name="client", table=254, table_name="main", family=6,
        result="route", err=0, src="2001:db8:3::1", dst="2001:db8:9::4", proto="udp", sport=40000,
        dport=9999, iif="lo", oif=None, mark=0, gateway="2001:db8:3::9", dev="veth0",
        rule="32766: from all lookup main", route="2001:db8:9::/64 via 2001:db8:3::9 dev veth0 metric 1024",
        pid=42, comm="python3", cpu=0,
    )  # fmt: skip
    drop = route_drop(NETNS, "client", "2001:db8:3::1", "2001:db8:9::4")
    verdicts, explained = route_verdicts(
        [group("neigh", 1, hop), group("lookup", 4, via_hop), group("drop", 4, drop)], 3.0
    )
    assert explained == 4
    (verdict,) = verdicts
    assert verdict.cause == (
        "next hop 2001:db8:3::9 never answered neighbour solicitation: 4 packet(s) dropped "
        "(dev veth0, netns client)"
    )
    assert verdict.fix[0].endswith("ip netns exec client ip -6 neigh show 2001:db8:3::9")
