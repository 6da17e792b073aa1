"""FirewallMatcher on recorded rulesets: which rule it names, with what confidence, and how often it reads.

The fixtures hold one namespace's iptables-nft (v4+v6), iptables-legacy (v4+v6) and native nft tables,
recorded before and after one UDP packet sent as uid 4242 (dropped by the `-m owner` rule only).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.firewall import matcher as matcher_module
from netsleuth.firewall.iptables import BACKEND_LEGACY, BACKEND_NFT, IptablesRuleset, parse_iptables_save
from netsleuth.firewall.matcher import FirewallMatcher, FirewallSnapshot, FirewallVerdict
from netsleuth.firewall.nftables import NftChain, NftRuleset, parse_nft_json
from netsleuth.kernel.netns_exec import CommandFailed
from netsleuth.packet import PacketTuple

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "firewall"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def iptables_rulesets(
    stage: str, backends: Sequence[str] = (BACKEND_NFT, BACKEND_LEGACY)
) -> list[IptablesRuleset]:
    files = {
        (BACKEND_NFT, 4): "iptables-save",
        (BACKEND_NFT, 6): "ip6tables-save",
        (BACKEND_LEGACY, 4): "iptables-legacy-save",
        (BACKEND_LEGACY, 6): "ip6tables-legacy-save",
    }
    return [
        parse_iptables_save(read(f"mixed.{stage}.{name}.txt"), backend, family)
        for (backend, family), name in files.items()
        if backend in backends
    ]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Reader:
    """Serves the recorded snapshots: the first read (at start) is `before`, later ones `after`."""

    def __init__(self, clock: Clock, stages: Sequence[str] = ("before", "after")) -> None:
        self.clock = clock
        self.stages = list(stages)
        self.reads = 0

    def __call__(self, netns_path: str | None) -> FirewallSnapshot:
        stage = self.stages[min(self.reads, len(self.stages) - 1)]
        self.reads += 1
        nft = parse_nft_json(read(f"mixed.{stage}.nft.json"))
        return FirewallSnapshot.build(iptables_rulesets(stage), nft, self.clock())


def stateless_listing(chain: NftChain) -> str:
    """What `nft -a -s list chain` prints, cut out of the recorded `nft -a -s list ruleset`."""
    text = read("mixed.nft-stateless.txt")
    table_text = re.search(rf"^table {chain.family} {chain.table} {{.*?^}}", text, re.S | re.M)
    assert table_text is not None
    chain_text = re.search(rf"^\tchain {chain.name} {{.*?^\t}}", table_text.group(0), re.S | re.M)
    assert chain_text is not None
    return chain_text.group(0)


def make_matcher(
    stages: Sequence[str] = ("before", "after"), listing: Callable[[NftChain], str] = stateless_listing
) -> tuple[FirewallMatcher, Reader, Clock]:
    clock = Clock()
    reader = Reader(clock, stages)
    return FirewallMatcher(None, reader=reader, chain_listing=listing, clock=clock), reader, clock


def udp(saddr: str, daddr: str, dport: int) -> PacketTuple:
    return PacketTuple(6 if ":" in saddr else 4, 17, saddr, daddr, 40001, dport)


def tcp(saddr: str, daddr: str, dport: int, flags: int) -> PacketTuple:
    return PacketTuple(6 if ":" in saddr else 4, 6, saddr, daddr, 40001, dport, tcp_flags=flags)


def summary(verdict: FirewallVerdict | None) -> tuple[object, ...] | None:
    if verdict is None:
        return None
    number = verdict.rule_number if verdict.rule_number is not None else verdict.handle
    return (verdict.backend, verdict.table, verdict.chain, verdict.rule, number, verdict.confidence)


@pytest.mark.parametrize(
    ("packet", "hook", "in_ifname", "out_ifname", "expected"),
    [
        (
            udp("198.18.0.9", "198.18.0.1", 9),
            "input",
            "veth0",
            None,
            ("iptables-nft", "filter", "INPUT", "-A INPUT -p udp -m udp --dport 9 -j DROP", 7, "matched"),
        ),
        # Jumps into BLOCK, then LOGDROP (after a LOG rule that only logs).
        (
            tcp("198.18.0.9", "198.18.0.1", 1500, 0x02),
            "input",
            "veth0",
            None,
            ("iptables-nft", "filter", "LOGDROP", "-A LOGDROP -j DROP", 2, "matched"),
        ),
        (
            tcp("198.18.0.9", "198.18.0.1", 23, 0x02),
            "input",
            "veth0",
            None,
            (
                "iptables-nft",
                "filter",
                "BLOCK",
                "-A BLOCK -p tcp -m tcp --dport 23 -j REJECT --reject-with tcp-reset",
                1,
                "matched",
            ),
        ),
        # Not a SYN: BLOCK is skipped; from outside 198.18.0.0/15 through veth+: the REJECT rule.
        (
            tcp("203.0.113.5", "198.18.0.1", 80, 0x10),
            "input",
            "veth0",
            None,
            (
                "iptables-nft",
                "filter",
                "INPUT",
                "-A INPUT ! -s 198.18.0.0/15 -i veth+ -j REJECT --reject-with icmp-host-prohibited",
                6,
                "matched",
            ),
        ),
        # Accepted by iptables-nft's filter table, dropped later by the native inet table (priority 10).
        (
            udp("198.18.7.3", "198.18.0.1", 7),
            "input",
            "ext0",
            None,
            ("nftables", "fw", "input", "ip saddr @blocked4 counter drop # handle 10", 10, "matched"),
        ),
        (
            udp("198.18.0.3", "198.18.0.1", 4000),
            "input",
            "ext0",
            None,
            (
                "nftables",
                "fw",
                "input",
                "udp dport vmap { 4000 : drop, 4001 : accept } # handle 19",
                19,
                "matched",
            ),
        ),
        (
            tcp("198.18.0.3", "198.18.0.1", 6000, 0x10),
            "input",
            "ext0",
            None,
            ("nftables", "fw", "tarpit", "counter drop # handle 22", 22, "matched"),
        ),
        (
            udp("198.18.9.9", "198.18.0.1", 4444),
            "prerouting",
            "ext0",
            None,
            ("iptables-nft", "raw", "PREROUTING", "-A PREROUTING -s 198.18.9.9/32 -j DROP", 1, "matched"),
        ),
        (
            udp("2001:db8::1", "2001:db8:ff::1", 19),
            "output",
            None,
            "ext0",
            (
                "iptables-nft",
                "filter",
                "OUTPUT",
                "-A OUTPUT -d 2001:db8:ff::/48 -j REJECT --reject-with icmp6-port-unreachable",
                1,
                "matched",
            ),
        ),
        (
            udp("2001:db8:bad::2", "2001:db8::1", 19),
            "input",
            "ext0",
            None,
            (
                "nftables",
                "fw",
                "input",
                "ip6 saddr 2001:db8:bad::/48 counter drop # handle 14",
                14,
                "matched",
            ),
        ),
        (
            udp("2001:db8::9", "2001:db8::1", 9999),
            "prerouting",
            "ext0",
            None,
            ("nftables", "v6guard", "pre", "udp dport 9999 counter drop # handle 2", 2, "matched"),
        ),
        (
            tcp("2001:db8::9", "2001:db8::1", 80, 0x02),
            "input",
            "ext0",
            None,
            ("iptables-legacy", "filter", "INPUT", "-A INPUT -p tcp -m tcp --dport 80 -j DROP", 1, "matched"),
        ),
        (
            udp("2001:db8::1", "2001:db8:1::1", 19),
            "forward",
            "ext0",
            "ext1",
            ("iptables-nft", "filter", "FORWARD", "-P FORWARD DROP", None, "matched"),
        ),
    ],
)
def test_names_the_rule(
    packet: PacketTuple,
    hook: str,
    in_ifname: str | None,
    out_ifname: str | None,
    expected: tuple[object, ...],
) -> None:
    matcher, _, _ = make_matcher()
    assert summary(matcher.explain(packet, hook, in_ifname, out_ifname)) == expected


def test_counter_growth_picks_among_undecidable_rules() -> None:
    # Only -m owner (uid 4242) can have dropped it; the earlier -m owner/-m mark "maybe" rules did not grow.
    matcher, _, _ = make_matcher()
    verdict = matcher.explain(udp("198.18.0.1", "198.18.0.50", 5000), "output", None, "ext0")
    assert summary(verdict) == (
        "iptables-nft",
        "filter",
        "OUTPUT",
        "-A OUTPUT -p udp -m owner --uid-owner 4242 -j DROP",
        3,
        "counters",
    )


def test_without_counter_growth_an_undecidable_rule_is_only_possible() -> None:
    matcher, _, _ = make_matcher(stages=("after", "after"))
    verdict = matcher.explain(udp("198.18.0.1", "198.18.0.50", 5000), "output", None, "ext0")
    assert summary(verdict) == (
        "iptables-nft",
        "filter",
        "OUTPUT",
        "-A OUTPUT -p udp -m owner --uid-owner 4242 -j DROP",
        3,
        "possible",
    )


def test_nothing_can_have_dropped_it() -> None:
    matcher, _, _ = make_matcher()
    ping = PacketTuple(4, 1, "198.18.0.1", "198.18.0.2", icmp_type=8, icmp_code=0)
    assert matcher.explain(ping, "postrouting", None, "ext0") is None  # no dropping rule on that hook
    assert matcher.explain(ping, "no-such-hook", "lo", None) is None
    # On input, iptables accepts it from lo, but the inet table's `ct state invalid` rule comes first there.
    verdict = matcher.explain(ping, "input", "lo", None)
    assert verdict is not None
    assert (verdict.rule, verdict.confidence) == ("ct state invalid counter drop # handle 7", "possible")


def test_policy_of_a_native_chain() -> None:
    matcher, _, _ = make_matcher()
    verdict = matcher.explain(udp("198.18.0.1", "198.18.3.3", 53), "forward", "ext0", "ext1")
    # iptables-nft's FORWARD policy drops first (same priority, listed first).
    assert verdict is not None and verdict.rule == "-P FORWARD DROP" and verdict.is_policy


def test_to_json() -> None:
    matcher, _, _ = make_matcher()
    verdict = matcher.explain(udp("198.18.7.3", "198.18.0.1", 7), "input", "ext0", None)
    assert verdict is not None
    assert verdict.to_json() == {
        "hook": "input",
        "table": "fw",
        "chain": "input",
        "rule": "ip saddr @blocked4 counter drop # handle 10",
        "backend": "nftables",
        "family": "inet",
        "rule_number": None,
        "handle": 10,
        "confidence": "matched",
    }


def test_rule_text_falls_back_to_rendering_when_nft_cannot_list() -> None:
    def broken(chain: NftChain) -> str:
        raise EnvironmentProblem("nft failed")

    matcher, _, _ = make_matcher(listing=broken)
    verdict = matcher.explain(udp("198.18.0.3", "198.18.0.1", 10050), "input", "ext0", None)
    assert verdict is not None
    assert verdict.rule == 'udp dport 10000-10100 counter drop comment "udp range" # handle 12'


def test_reads_are_cached_and_refreshed() -> None:
    matcher, reader, clock = make_matcher()
    assert reader.reads == 1  # the start snapshot
    definite = udp("198.18.0.9", "198.18.0.1", 9)
    matcher.explain(definite, "input", "veth0", None)
    matcher.explain(definite, "input", "veth0", None)
    assert reader.reads == 2  # the start snapshot predates every drop, then one reading for the burst
    clock.now += 0.3
    matcher.explain(definite, "input", "veth0", None)
    assert reader.reads == 2  # still fresh, and the answer did not need counters
    clock.now += 0.3
    matcher.explain(definite, "input", "veth0", None)
    assert reader.reads == 3
    clock.now += 0.2
    # Undecidable: a reading 0.2 s old may predate this drop, so read once more for fresh counters.
    matcher.explain(udp("198.18.0.1", "198.18.0.50", 5000), "output", None, "ext0")
    assert reader.reads == 4
    matcher.explain(udp("198.18.0.1", "198.18.0.50", 5000), "output", None, "ext0")
    assert reader.reads == 4


class Version:
    """The rules' version as the matcher asks it (netsleuth.firewall.ruleset_version), set by the test."""

    def __init__(self) -> None:
        self.token: tuple[int, ...] | None = (1,)
        self.asked = 0

    def __call__(self) -> tuple[int, ...] | None:
        self.asked += 1
        return self.token


def test_a_reading_stands_while_the_rules_version_holds_and_no_answer_needed_counters() -> None:
    clock = Clock()
    reader, version = Reader(clock, ("before", "after")), Version()
    matcher = FirewallMatcher(
        None, reader=reader, chain_listing=stateless_listing, clock=clock, version=version
    )
    definite = udp("198.18.0.9", "198.18.0.1", 9)  # one rule certainly drops it
    first = matcher.explain(definite, "input", "veth0", None)
    assert first is not None and first.confidence == "matched"
    assert reader.reads == 1  # the start's reading decides the first drops too: the version held
    for _ in range(10):  # a storm of the same drop, five seconds long
        clock.now += 0.5
        assert matcher.explain(definite, "input", "veth0", None) == first
    assert reader.reads == 1 and version.asked >= 5  # asked the version, never ran the tools again
    version.token = (2,)  # a rule changed
    clock.now += 0.6
    matcher.explain(definite, "input", "veth0", None)
    assert reader.reads == 2


def test_the_start_reading_is_read_again_when_an_answer_weighs_counters() -> None:
    """Its counters are the baseline, so they cannot show growth: an undecidable drop at once reads again,
    however young the start reading is."""
    clock = Clock()
    reader, version = Reader(clock, ("before", "after")), Version()
    matcher = FirewallMatcher(
        None, reader=reader, chain_listing=stateless_listing, clock=clock, version=version
    )
    matcher.explain(udp("198.18.0.1", "198.18.0.50", 5000), "output", None, "ext0")  # the owner match
    assert reader.reads == 2


def test_an_answer_that_weighed_counters_is_read_again_whatever_the_version() -> None:
    clock = Clock()
    reader, version = Reader(clock, ("before", "after")), Version()
    matcher = FirewallMatcher(
        None, reader=reader, chain_listing=stateless_listing, clock=clock, version=version
    )
    undecidable = udp("198.18.0.1", "198.18.0.50", 5000)  # the owner match: only counters tell
    matcher.explain(undecidable, "output", None, "ext0")
    reads = reader.reads
    clock.now += 0.6
    matcher.explain(undecidable, "output", None, "ext0")
    assert reader.reads == reads + 1  # counters move with every drop: a fresh reading


def test_without_a_version_every_reading_ages_out() -> None:
    clock = Clock()
    reader, version = Reader(clock, ("before", "after")), Version()
    version.token = None  # e.g. legacy tables, whose rules have no version
    matcher = FirewallMatcher(
        None, reader=reader, chain_listing=stateless_listing, clock=clock, version=version
    )
    definite = udp("198.18.0.9", "198.18.0.1", 9)
    matcher.explain(definite, "input", "veth0", None)
    clock.now += 0.6
    matcher.explain(definite, "input", "veth0", None)
    assert reader.reads == 3


def test_iptables_nft_tables_are_not_reported_twice() -> None:
    nft = parse_nft_json(read("mixed.after.nft.json"))
    snapshot = FirewallSnapshot.build(iptables_rulesets("after"), nft, 0.0)
    assert [(t.family, t.name) for t in snapshot.nft_tables] == [("inet", "fw"), ("ip6", "v6guard")]
    # Without iptables-nft-save to ask, nft's own hints give the same split.
    guessed = FirewallSnapshot.build(iptables_rulesets("after", backends=(BACKEND_LEGACY,)), nft, 0.0)
    assert [(t.family, t.name) for t in guessed.nft_tables] == [("inet", "fw"), ("ip6", "v6guard")]


def test_a_native_table_iptables_cannot_show_is_matched_as_nft() -> None:
    def reader(netns_path: str | None) -> FirewallSnapshot:
        ipt = parse_iptables_save(read("incompatible.iptables-save.txt"), BACKEND_NFT, 4)
        return FirewallSnapshot.build([ipt], parse_nft_json(read("incompatible.nft.json")), 0.0)

    matcher = FirewallMatcher(None, reader=reader, chain_listing=lambda chain: "", clock=lambda: 0.0)
    verdict = matcher.explain(udp("198.18.0.1", "198.18.0.2", 9), "input", "veth0", None)
    assert summary(verdict) == (
        "nftables",
        "filter",
        "input",
        "udp dport 9 counter drop # handle 2",
        2,
        "matched",
    )


def test_no_firewall_tool_is_an_environment_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matcher_module, "read_iptables", lambda netns_path: [])
    monkeypatch.setattr(matcher_module, "read_nftables", lambda netns_path: None)
    with pytest.raises(EnvironmentProblem, match="neither nft nor iptables-save"):
        FirewallMatcher(None)


def test_a_failing_front_end_is_skipped_and_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(netns_path: str | None) -> list[IptablesRuleset]:
        raise CommandFailed("iptables-nft-save failed (exit 4): boom", 4, "boom")

    monkeypatch.setattr(matcher_module, "read_iptables", failing)
    monkeypatch.setattr(
        matcher_module, "read_nftables", lambda netns_path: parse_nft_json(read("mixed.after.nft.json"))
    )
    snapshot = matcher_module.read_snapshot(None)
    assert snapshot.problems == ("iptables-nft-save failed (exit 4): boom",)
    assert [t.name for t in snapshot.nft_tables] == [
        "fw",
        "v6guard",
    ]  # iptables-looking tables still left out

    monkeypatch.setattr(matcher_module, "read_nftables", lambda netns_path: None)
    with pytest.raises(EnvironmentProblem, match="cannot read the firewall rules: iptables-nft-save failed"):
        matcher_module.read_snapshot(None)


def features_matcher() -> FirewallMatcher:
    def reader(netns_path: str | None) -> FirewallSnapshot:
        return FirewallSnapshot.build([], parse_nft_json(read("features.nft.json")), 0.0)

    def listing(chain: NftChain) -> str:
        text = read("features.nft-stateless.txt")
        table_text = re.search(rf"^table {chain.family} {chain.table} {{.*?^}}", text, re.S | re.M)
        assert table_text is not None
        return table_text.group(0)

    return FirewallMatcher(None, reader=reader, chain_listing=listing, clock=lambda: 0.0)


def test_native_chain_policy() -> None:
    # Nothing in `inet t` chain c matches a plain UDP datagram for certain, so its `policy drop` did it.
    verdict = features_matcher().explain(udp("198.18.0.9", "198.18.0.50", 7), "input", "ext0", None)
    assert verdict is not None
    assert (verdict.rule, verdict.is_policy, verdict.handle, verdict.confidence) == (
        "type filter hook input priority filter; policy drop;",
        True,
        None,
        "matched",
    )


def test_dormant_table_is_skipped_once_known() -> None:
    nft = parse_nft_json(read("features.nft.json"))
    assert ("ip", "dormant_t") in [
        (t.family, t.name) for t in FirewallSnapshot.build([], nft, 0.0).nft_tables
    ]
    known = NftRuleset(tuple(dataclasses.replace(t, dormant=t.dormant is not False) for t in nft.tables))
    assert ("ip", "dormant_t") not in [
        (t.family, t.name) for t in FirewallSnapshot.build([], known, 0.0).nft_tables
    ]


def test_netdev_ingress_without_device_information_is_possible() -> None:
    # nft 1.0.6's JSON omits the chain's device, so the chain only perhaps saw the packet.
    verdict = features_matcher().explain(udp("198.18.0.5", "198.18.0.1", 7), "ingress", "lo", None)
    assert summary(verdict) == ("nftables", "nd", "ing", "ip saddr 198.18.0.5 drop # handle 2", 2, "possible")
    assert verdict is not None and verdict.family == "netdev"


def test_bridge_family_hook() -> None:
    document = {
        "nftables": [
            {"table": {"family": "bridge", "name": "br", "handle": 1}},
            {"chain": {"family": "bridge", "table": "br", "name": "fwd", "handle": 1, "type": "filter",
                       "hook": "forward", "prio": -200, "policy": "accept"}},
            {"rule": {"family": "bridge", "table": "br", "chain": "fwd", "handle": 2, "expr": [
                {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
                           "right": "198.18.0.5"}},
                {"drop": None}]}},
        ]
    }  # fmt: skip

    def reader(netns_path: str | None) -> FirewallSnapshot:
        return FirewallSnapshot.build([], parse_nft_json(json.dumps(document)), 0.0)

    matcher = FirewallMatcher(None, reader=reader, chain_listing=lambda chain: "", clock=lambda: 0.0)
    packet = udp("198.18.0.5", "198.18.0.1", 7)
    verdict = matcher.explain(packet, "bridge-forward", "veth0", "veth1")
    assert summary(verdict) == ("nftables", "br", "fwd", "ip saddr 198.18.0.5 drop # handle 2", 2, "matched")
    assert matcher.explain(packet, "forward", "veth0", "veth1") is None  # not an IP-family chain


def test_a_failed_reading_mid_trace_falls_back_to_the_last_one() -> None:
    clock = Clock()
    healthy = Reader(clock, ("after",))
    calls = []

    def reader(netns_path: str | None) -> FirewallSnapshot:
        calls.append(clock())
        if len(calls) > 1:
            raise UsageError("network namespace /run/netns/gone does not exist")
        return healthy(netns_path)

    matcher = FirewallMatcher("/run/netns/gone", reader=reader, chain_listing=stateless_listing, clock=clock)
    verdict = matcher.explain(udp("198.18.0.9", "198.18.0.1", 9), "input", "veth0", None)
    assert verdict is not None and verdict.rule == "-A INPUT -p udp -m udp --dport 9 -j DROP"
    assert matcher.problems == ("network namespace /run/netns/gone does not exist",)
    matcher.explain(udp("198.18.0.9", "198.18.0.1", 9), "input", "veth0", None)
    assert len(calls) == 2  # the failure is not retried before max_age
