"""IPv6 policy routing read from a recorded rtnetlink dump (tests/fixtures/route/policy6_nsrtrec.json, made in
a namespace with veth0 = 2001:db8:3::1/64, 198.18.3.1/24 and:

    ip -6 route add 2001:db8:7::/64 via 2001:db8:3::2 dev veth0 table 100
    ip -6 route add blackhole 2001:db8:5::/64 table 100
    ip -6 route add unreachable 2001:db8:6::/64 table 100
    ip -6 rule add from 2001:db8:3::/64 to 2001:db8:7::/64 lookup 100 pref 900
    ip -6 rule add from 2001:db8:3::/64 lookup 100 pref 1000
    ip -6 rule add fwmark 0x10/0xff iif veth0 ipproto udp dport 53 lookup 200 pref 1100
    ip -6 route add prohibit 2001:db8:8::/64 table 200
    ip -6 route add 2001:db8:9::/64 via 2001:db8:3::9 dev veth0
    ip rule add from 198.18.3.0/24 lookup 100 pref 800
    ip route add blackhole 198.18.5.0/24 table 100

Each family has its own rules and its own routes in tables of the same ids: an IPv6 lookup in table 100 is
named by an `ip -6 rule`, never by the IPv4 rule 800 that also says `lookup 100`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netsleuth.diagnostics.route.policy import LookupKey, PolicySnapshot, snapshot_from_fields

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "route" / "policy6_nsrtrec.json"
LO, VETH0 = 1, 4644
CLIENT = "2001:db8:3::1"


@pytest.fixture
def policy() -> PolicySnapshot:
    data = json.loads(FIXTURE.read_text())
    return snapshot_from_fields(data["rules"], data["routes"], [tuple(link) for link in data["links"]])


def test_both_families_rules_print_like_ip_rule(policy: PolicySnapshot) -> None:
    by_family = {family: [rule.text for rule in policy.rules if rule.family == family] for family in (2, 10)}
    assert by_family[10] == [
        "0: from all lookup local",
        "900: from 2001:db8:3::/64 to 2001:db8:7::/64 lookup 100",
        "1000: from 2001:db8:3::/64 lookup 100",
        "1100: from all fwmark 0x10/0xff iif veth0 ipproto 17 dport 53 lookup 200",
        "32766: from all lookup main",
    ]
    assert by_family[2] == [
        "0: from all lookup local",
        "800: from 198.18.3.0/24 lookup 100",
        "32766: from all lookup main",
        "32767: from all lookup default",
    ]
    assert policy.has_custom_rules


def test_an_ipv6_lookup_is_named_by_an_ipv6_rule_only(policy: PolicySnapshot) -> None:
    steered = LookupKey("2001:db8:7::5", CLIENT, iif=LO)
    assert policy.rule_for(steered, 100).text.startswith("900:")  # type: ignore[union-attr]
    blackholed = LookupKey("2001:db8:5::9", CLIENT, iif=LO)
    assert policy.rule_for(blackholed, 100).text.startswith("1000:")  # type: ignore[union-attr]
    # Unbound (::) source: no `ip -6 rule` sends it to table 100, and IPv4's rule 800 does not count.
    assert policy.rule_for(LookupKey("2001:db8:5::9", "::", iif=LO), 100) is None
    assert policy.rule_for(LookupKey("2001:db8:5::9", "::", iif=LO), 254).priority == 32766  # type: ignore[union-attr]
    # And the IPv4 lookup of the same table is named by the IPv4 rule.
    assert policy.rule_for(LookupKey("198.18.5.9", "198.18.3.1", iif=LO), 100).priority == 800  # type: ignore[union-attr]


def test_ipv6_fwmark_iif_proto_and_port_selectors(policy: PolicySnapshot) -> None:
    dns = LookupKey("2001:db8:8::8", "2001:db8:4::4", iif=VETH0, mark=0x110, proto=17, dport=53)
    assert policy.rule_for(dns, 200).priority == 1100  # type: ignore[union-attr]
    locally_generated = LookupKey("2001:db8:8::8", CLIENT, iif=LO, mark=0x10, proto=17, dport=53)
    assert policy.rule_for(locally_generated, 200) is None


def test_ipv6_routes_and_reject_types_print_like_ip_route(policy: PolicySnapshot) -> None:
    assert policy.route_for(100, "2001:db8:7::5").text == (  # type: ignore[union-attr]
        "2001:db8:7::/64 via 2001:db8:3::2 dev veth0 metric 1024"
    )
    assert policy.route_for(100, "2001:db8:5::9", [6]).text == (  # type: ignore[union-attr]
        "blackhole 2001:db8:5::/64 dev lo metric 1024"
    )
    assert policy.route_for(100, "2001:db8:6::1").type_name == "unreachable"  # type: ignore[union-attr]
    assert policy.route_for(200, "2001:db8:8::8").type_name == "prohibit"  # type: ignore[union-attr]
    assert policy.route_for(254, "2001:db8:9::4").gateway == "2001:db8:3::9"  # type: ignore[union-attr]
    # Table 100 holds an IPv4 blackhole too; an IPv6 destination outside its prefixes matches nothing there.
    assert policy.route_for(100, "2001:db8:200::1") is None
    assert policy.route_for(100, "198.18.5.9").text == "blackhole 198.18.5.0/24"  # type: ignore[union-attr]
