"""Policy routing read from a recorded rtnetlink dump (tests/fixtures/route/policy_nsrtrec.json, made in a
namespace with:

    ip route add 198.18.7.0/24 via 198.18.3.2 dev veth0 table 100
    ip route add blackhole 198.18.5.0/24 table 100
    ip route add unreachable 198.18.6.0/24 table 100
    ip rule add from 198.18.3.0/24 to 198.18.7.0/24 lookup 100 pref 900
    ip rule add from 198.18.3.0/24 lookup 100 pref 1000
    ip rule add fwmark 0x10/0xff iif veth0 ipproto udp dport 53 lookup 200 pref 1100
    ip route add 198.18.9.0/24 via 198.18.3.9 dev veth0
    ip route add prohibit 198.18.8.0/24 table 200

and the lookups the kernel reports for it: which rule sent each to its table, which prefix matched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netsleuth.diagnostics.route.policy import LookupKey, PolicySnapshot, snapshot_from_fields
from netsleuth.diagnostics.route.session import lookup_result

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "route" / "policy_nsrtrec.json"
LO, VETH0 = 1, 3


@pytest.fixture
def policy() -> PolicySnapshot:
    data = json.loads(FIXTURE.read_text())
    return snapshot_from_fields(data["rules"], data["routes"], [tuple(link) for link in data["links"]])


def test_rules_are_in_priority_order_and_print_like_ip_rule(policy: PolicySnapshot) -> None:
    assert [rule.priority for rule in policy.rules] == [0, 900, 1000, 1100, 32766, 32767]
    assert [rule.text for rule in policy.rules] == [
        "0: from all lookup local",
        "900: from 198.18.3.0/24 to 198.18.7.0/24 lookup 100",
        "1000: from 198.18.3.0/24 lookup 100",
        "1100: from all fwmark 0x10/0xff iif veth0 ipproto 17 dport 53 lookup 200",
        "32766: from all lookup main",
        "32767: from all lookup default",
    ]
    assert policy.has_custom_rules


def test_the_first_matching_rule_for_the_table_is_named(policy: PolicySnapshot) -> None:
    steered = LookupKey("198.18.7.5", "198.18.3.1", iif=LO)
    assert policy.rule_for(steered, 100).text.startswith("900:")  # type: ignore[union-attr]
    other = LookupKey("198.18.5.9", "198.18.3.1", iif=LO)
    assert policy.rule_for(other, 100).text.startswith("1000:")  # type: ignore[union-attr]
    # An unbound socket's first lookup has no source yet: no source rule sends it to table 100.
    assert policy.rule_for(LookupKey("198.18.5.9", "0.0.0.0", iif=LO), 100) is None
    assert policy.rule_for(LookupKey("198.18.5.9", "0.0.0.0", iif=LO), 254).priority == 32766  # type: ignore[union-attr]


def test_fwmark_iif_proto_and_port_selectors(policy: PolicySnapshot) -> None:
    dns = LookupKey("198.18.8.8", "198.18.4.4", iif=VETH0, mark=0x110, proto=17, dport=53)
    assert policy.rule_for(dns, 200).priority == 1100  # type: ignore[union-attr]
    for miss in (
        LookupKey("198.18.8.8", "198.18.4.4", iif=VETH0, mark=0x111, proto=17, dport=53),  # mark under mask
        LookupKey("198.18.8.8", "198.18.4.4", iif=LO, mark=0x10, proto=17, dport=53),  # locally generated
        LookupKey("198.18.8.8", "198.18.4.4", iif=VETH0, mark=0x10, proto=6, dport=53),  # tcp
        LookupKey("198.18.8.8", "198.18.4.4", iif=VETH0, mark=0x10, proto=17, dport=54),
    ):
        assert policy.rule_for(miss, 200) is None


def test_longest_prefix_of_the_table_and_reject_types(policy: PolicySnapshot) -> None:
    assert policy.route_for(100, "198.18.7.5").text == "198.18.7.0/24 via 198.18.3.2 dev veth0"  # type: ignore[union-attr]
    assert policy.route_for(100, "198.18.5.9", [6]).text == "blackhole 198.18.5.0/24"  # type: ignore[union-attr]
    assert policy.route_for(100, "198.18.6.1").text == "unreachable 198.18.6.0/24"  # type: ignore[union-attr]
    assert policy.route_for(200, "198.18.8.8").text == "prohibit 198.18.8.0/24"  # type: ignore[union-attr]
    assert policy.route_for(254, "198.18.9.4").text == "198.18.9.0/24 via 198.18.3.9 dev veth0"  # type: ignore[union-attr]
    assert policy.route_for(100, "198.18.200.1") is None


@pytest.mark.parametrize(
    ("err", "result"),
    [(0, "route"), (-22, "blackhole"), (-113, "unreachable"), (-13, "prohibit"), (-11, "no match")],
)
def test_lookup_results_follow_fib_props(err: int, result: str) -> None:
    assert lookup_result(err) == result
