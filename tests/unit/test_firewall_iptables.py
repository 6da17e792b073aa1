"""iptables-save parsing and rule evaluation, on output recorded from the real tools (see
tests/fixtures/firewall/record.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsleuth.firewall.hooks import PacketAtHook, Truth
from netsleuth.firewall.iptables import (
    BACKEND_LEGACY,
    BACKEND_NFT,
    IptablesRule,
    chain_priority,
    hook_chain_name,
    parse_iptables_save,
)
from netsleuth.packet import PacketTuple

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "firewall"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def one_rule(rule: str, family: int = 4) -> IptablesRule:
    """Parse a single `-A INPUT ...` line as iptables-save would print it."""
    text = f"*filter\n:INPUT ACCEPT [0:0]\n:BLOCK - [0:0]\n[3:180] {rule}\nCOMMIT\n"
    return parse_iptables_save(text, BACKEND_NFT, family).tables["filter"].chains["INPUT"].rules[0]


def seen(packet: PacketTuple, in_ifname: str | None = "veth0", out_ifname: str | None = "") -> PacketAtHook:
    return PacketAtHook(packet, "input", in_ifname, out_ifname)


UDP = PacketTuple(4, 17, "198.18.0.1", "198.18.0.2", 40001, 5000)
TCP_SYN = PacketTuple(4, 6, "198.18.0.1", "198.18.0.2", 40001, 1500, tcp_flags=0x02)
TCP_SYNACK = PacketTuple(4, 6, "198.18.0.1", "198.18.0.2", 40001, 1500, tcp_flags=0x12)
PING = PacketTuple(4, 1, "198.18.0.1", "198.18.0.2", icmp_type=8, icmp_code=0)
UNREACHABLE = PacketTuple(4, 1, "198.18.0.1", "198.18.0.2", icmp_type=3, icmp_code=1)
FOREIGN = PacketTuple(4, 17, "203.0.113.9", "198.18.0.2", 40001, 9)


def test_tables_chains_policies_and_counters() -> None:
    ruleset = parse_iptables_save(fixture("mixed.after.iptables-save.txt"), BACKEND_NFT, 4)
    assert set(ruleset.tables) == {"mangle", "raw", "filter", "nat"}
    filter_table = ruleset.tables["filter"]
    assert list(filter_table.chains) == ["INPUT", "FORWARD", "OUTPUT", "BLOCK", "LOGDROP"]
    output = filter_table.chains["OUTPUT"]
    assert (output.policy, output.packets, output.bytes) == ("ACCEPT", 3, 115)
    assert filter_table.chains["FORWARD"].policy == "DROP"
    assert filter_table.chains["BLOCK"].policy is None
    rule = filter_table.chains["INPUT"].rules[6]
    assert (rule.number, rule.text, rule.packets, rule.bytes) == (
        7,
        "-A INPUT -p udp -m udp --dport 9 -j DROP",
        1,
        29,
    )
    assert ruleset.nft_family == "ip"


def test_rule_text_is_kept_exactly_with_its_quoting() -> None:
    rules = parse_iptables_save(fixture("mixed.after.iptables-save.txt"), BACKEND_NFT, 4).tables["filter"]
    comment_rule = rules.chains["INPUT"].rules[2]
    assert comment_rule.text == (
        '-A INPUT -p icmp -m icmp --icmp-type 8 -m comment --comment "allow \\"ping\\"" -j ACCEPT'
    )
    assert comment_rule.evaluate(seen(PING)) is True  # the comment does not constrain


def test_targets_become_verdict_kinds() -> None:
    chains = (
        parse_iptables_save(fixture("mixed.after.iptables-save.txt"), BACKEND_NFT, 4).tables["filter"].chains
    )
    kinds = {
        (rule.chain, rule.number): (rule.kind, rule.target)
        for chain in chains.values()
        for rule in chain.rules
    }
    assert kinds[("INPUT", 4)] == ("jump", "BLOCK")
    assert kinds[("OUTPUT", 2)] == ("goto", "BLOCK")
    assert kinds[("BLOCK", 3)] == ("return", "RETURN")
    assert kinds[("LOGDROP", 1)] == ("continue", "LOG")
    assert kinds[("INPUT", 6)] == ("drop", "REJECT")
    assert kinds[("INPUT", 1)] == ("accept", "ACCEPT")


def test_nat_targets_accept() -> None:
    nat = parse_iptables_save(fixture("mixed.after.iptables-save.txt"), BACKEND_NFT, 4).tables["nat"]
    assert nat.chains["PREROUTING"].rules[0].kind == "accept"


def test_legacy_and_ipv6() -> None:
    legacy = parse_iptables_save(fixture("mixed.after.iptables-legacy-save.txt"), BACKEND_LEGACY, 4)
    assert legacy.tables["filter"].chains["INPUT"].rules[0].text == (
        "-A INPUT -s 198.18.5.0/24 -p tcp -m tcp --dport 80 -j DROP"
    )
    v6 = parse_iptables_save(fixture("mixed.after.ip6tables-save.txt"), BACKEND_NFT, 6)
    assert v6.nft_family == "ip6"
    drop = v6.tables["filter"].chains["INPUT"].rules[1]
    packet = PacketTuple(6, 17, "2001:db8::7", "2001:db8::1", 40001, 9)
    assert drop.evaluate(seen(packet)) is True
    assert drop.evaluate(seen(PacketTuple(6, 17, "2001:db9::7", "2001:db8::1", 40001, 9))) is False
    icmp6 = v6.tables["filter"].chains["INPUT"].rules[0]
    assert icmp6.evaluate(seen(PacketTuple(6, 58, "2001:db8::7", "2001:db8::1", icmp_type=128))) is True


def test_incompatible_table_is_left_to_the_nftables_reader() -> None:
    # iptables-nft prints an empty stand-in `*filter` for a native table it cannot show.
    ruleset = parse_iptables_save(fixture("incompatible.iptables-save.txt"), BACKEND_NFT, 4)
    assert ruleset.tables == {}


@pytest.mark.parametrize(
    ("rule", "packet", "in_ifname", "expected"),
    [
        ("-A INPUT ! -s 198.18.0.0/15 -i veth+ -j REJECT", FOREIGN, "veth3", True),
        ("-A INPUT ! -s 198.18.0.0/15 -i veth+ -j REJECT", UDP, "veth3", False),
        ("-A INPUT ! -s 198.18.0.0/15 -i veth+ -j REJECT", FOREIGN, "eth0", False),
        ("-A INPUT ! -s 198.18.0.0/15 -i veth+ -j REJECT", FOREIGN, None, None),
        (
            "-A INPUT -s 198.18.0.7/255.255.0.255 -j DROP",
            PacketTuple(4, 17, "198.18.9.7", "198.18.0.2"),
            "x",
            True,
        ),
        (
            "-A INPUT -s 198.18.0.7/255.255.0.255 -j DROP",
            PacketTuple(4, 17, "198.18.9.8", "198.18.0.2"),
            "x",
            False,
        ),
        ("-A INPUT -d 198.18.0.2/32 -p udp -j DROP", UDP, "x", True),
        ("-A INPUT ! -p tcp -j DROP", UDP, "x", True),
        ("-A INPUT -p all -j DROP", UDP, "x", True),
        ("-A INPUT -p 17 -j DROP", UDP, "x", True),
        ("-A INPUT -p udp -m udp --dport 4000:6000 -j DROP", UDP, "x", True),
        ("-A INPUT -p udp -m udp --dport 5001: -j DROP", UDP, "x", False),
        ("-A INPUT -p udp -m udp ! --sport 40001 -j DROP", UDP, "x", False),
        ("-A INPUT -p udp -m multiport --dports 53,123,4990:5010 -j DROP", UDP, "x", True),
        ("-A INPUT -p udp -m multiport --ports 40001 -j DROP", UDP, "x", True),
        ("-A INPUT -p udp -m multiport ! --sports 1:1024 -j DROP", UDP, "x", True),
        ("-A INPUT -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN -j DROP", TCP_SYN, "x", True),
        ("-A INPUT -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN -j DROP", TCP_SYNACK, "x", False),
        ("-A INPUT -p tcp -m tcp ! --tcp-flags FIN,SYN,RST,ACK SYN -j DROP", TCP_SYNACK, "x", True),
        ("-A INPUT -p tcp -m tcp --tcp-flags ALL NONE -j DROP", TCP_SYN, "x", False),
        (
            "-A INPUT -p tcp -m tcp --syn -j DROP",
            PacketTuple(4, 6, "198.18.0.1", "198.18.0.2", 1, 2),
            "x",
            None,
        ),
        ("-A INPUT -p icmp -m icmp --icmp-type 8 -j DROP", PING, "x", True),
        ("-A INPUT -p icmp -m icmp --icmp-type 3/1 -j DROP", UNREACHABLE, "x", True),
        ("-A INPUT -p icmp -m icmp --icmp-type 3/2 -j DROP", UNREACHABLE, "x", False),
        ("-A INPUT -p icmp -m icmp --icmp-type any -j DROP", UNREACHABLE, "x", True),
        ("-A INPUT -m conntrack --ctstate INVALID -j DROP", UDP, "x", None),
        ("-A INPUT -p udp -m conntrack --ctstate INVALID -j DROP", PING, "x", False),
        ("-A INPUT -m set --match-set blocked src -j DROP", UDP, "x", None),
        ('-A INPUT -m limit --limit 5/sec -m comment --comment "-x" -j DROP', UDP, "x", None),
        ("-A INPUT -j DROP", UDP, "x", True),
    ],
)
def test_rule_evaluation(rule: str, packet: PacketTuple, in_ifname: str | None, expected: Truth) -> None:
    assert one_rule(rule).evaluate(seen(packet, in_ifname)) is expected


def test_unbalanced_quotes_make_a_maybe_rule() -> None:
    rule = one_rule('-A INPUT -m comment --comment "broken -j DROP')
    assert rule.evaluate(seen(UDP)) is None
    assert rule.kind == "continue"


def test_builtin_chains_and_priorities() -> None:
    assert hook_chain_name("input") == "INPUT"
    assert hook_chain_name("ingress") is None
    assert chain_priority("raw", "PREROUTING") == -300
    assert chain_priority("nat", "PREROUTING") == -100
    assert chain_priority("nat", "POSTROUTING") == 100
    assert chain_priority("security", "INPUT") == 50
