"""The firewall matcher against real rules: iptables-nft, iptables-legacy, ip6tables and native nftables
installed inside test namespaces only (never the machine's own), real packets dropped by them, and the
matcher asked which rule did it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.firewall import FirewallMatcher, read_snapshot, run_in_netns
from netsleuth.firewall.matcher import FirewallSnapshot
from netsleuth.firewall.ruleset_version import RulesetVersion
from netsleuth.packet import PacketTuple
from tests.netlab import Host, Lab, lab, wait_for

# Sends one UDP datagram from a fixed source port, optionally as another uid (for -m owner / meta skuid).
UDP_SEND = """
import os, socket, sys
destination, port, source_port, uid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if uid:  # before socket(): the socket keeps the uid it was created with (sk_uid)
    os.setgid(uid)
    os.setuid(uid)
family = socket.AF_INET6 if ":" in destination else socket.AF_INET
sock = socket.socket(family, socket.SOCK_DGRAM)
sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", source_port))
try:
    sock.sendto(b"netsleuth", (destination, port))
except OSError:
    pass  # EPERM when our own OUTPUT rule drops it
"""
SOURCE_PORT = 40001


@dataclass
class Hosts:
    """a = 198.18.0.1 / 2001:db8::1, b = 198.18.0.2 / 2001:db8::2, joined by veth0."""

    lab: Lab
    a: Host
    b: Host


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    with lab() as the_lab:
        a, b = the_lab.host("a"), the_lab.host("b")
        the_lab.link(a, b, ["198.18.0.1/24", "2001:db8::1/64"], ["198.18.0.2/24", "2001:db8::2/64"])
        yield Hosts(the_lab, a, b)


def send_udp(sender: Host, destination: str, port: int, uid: int = 0) -> None:
    sender.run(sys.executable, "-c", UDP_SEND, destination, str(port), str(SOURCE_PORT), str(uid))


def udp_packet(source: str, destination: str, port: int) -> PacketTuple:
    family = 6 if ":" in source else 4
    return PacketTuple(family, 17, source, destination, SOURCE_PORT, port)


def counter_of(host: Host, argv: list[str], needle: str) -> Callable[[], int]:
    """Reads the packet counter of the listed rule containing `needle` (iptables-save -c or nft list)."""

    def read() -> int:
        for line in host.run(*argv).stdout.splitlines():
            if needle in line:
                found = re.search(r"\[(\d+):\d+\]|counter packets (\d+)", line)
                if found:
                    return int(found.group(1) or found.group(2))
        return 0

    return read


def wait_dropped(read: Callable[[], int], before: int = 0) -> None:
    wait_for(lambda: read() > before, timeout=5, what="the rule's counter to count the dropped packet")


def nft_add_rule(host: Host, *rule: str) -> int:
    """Adds a rule and returns its handle, as `nft --echo --handle` prints it."""
    echoed = host.run("nft", "-e", "-a", "add", "rule", *rule).stdout
    found = re.search(r"# handle (\d+)", echoed)
    assert found, echoed
    return int(found.group(1))


def test_iptables_nft_input_rule(hosts: Hosts) -> None:
    b = hosts.b
    b.run("iptables", "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
    b.run("iptables", "-A", "INPUT", "-p", "udp", "--dport", "5301", "-s", "198.18.0.9", "-j", "DROP")
    b.run("iptables", "-A", "INPUT", "-p", "udp", "-m", "multiport", "--dports", "5300:5302", "-j", "DROP")
    matcher = FirewallMatcher(b.netns_path)
    send_udp(hosts.a, "198.18.0.2", 5301)
    wait_dropped(counter_of(b, ["iptables-save", "-c"], "--dports 5300:5302"))

    verdict = matcher.explain(udp_packet("198.18.0.1", "198.18.0.2", 5301), "input", "veth0", None)

    assert verdict is not None
    assert verdict.rule == "-A INPUT -p udp -m multiport --dports 5300:5302 -j DROP"
    assert (verdict.backend, verdict.family, verdict.table, verdict.chain) == (
        "iptables-nft",
        "ip",
        "filter",
        "INPUT",
    )
    assert (verdict.rule_number, verdict.handle, verdict.is_policy) == (3, None, False)
    assert verdict.confidence == "matched"
    assert verdict.to_json()["hook"] == "input"


def test_iptables_nft_output_reject(hosts: Hosts) -> None:
    a = hosts.a
    a.run("iptables", "-A", "OUTPUT", "-p", "tcp", "--dport", "5302", "-j", "REJECT")
    a.run("iptables", "-A", "OUTPUT", "-o", "veth+", "-p", "udp", "--dport", "5302", "-j", "REJECT")
    matcher = FirewallMatcher(a.netns_path)
    send_udp(a, "198.18.0.2", 5302)
    wait_dropped(counter_of(a, ["iptables-save", "-c"], "-o veth+"))

    verdict = matcher.explain(udp_packet("198.18.0.1", "198.18.0.2", 5302), "output", None, "veth0")

    assert verdict is not None
    assert (
        verdict.rule
        == "-A OUTPUT -o veth+ -p udp -m udp --dport 5302 -j REJECT --reject-with icmp-port-unreachable"
    )
    assert (verdict.chain, verdict.rule_number, verdict.confidence) == ("OUTPUT", 2, "matched")


def test_undecidable_match_is_settled_by_its_counter(hosts: Hosts) -> None:
    # Neither -m mark nor -m owner can be judged from the packet; only the owner rule's counter grows.
    a = hosts.a
    a.run("iptables", "-A", "OUTPUT", "-p", "udp", "-m", "mark", "--mark", "0x7", "-j", "DROP")
    a.run("iptables", "-A", "OUTPUT", "-p", "udp", "-m", "owner", "--uid-owner", "4242", "-j", "DROP")
    matcher = FirewallMatcher(a.netns_path)
    send_udp(a, "198.18.0.2", 5310, uid=4242)
    wait_dropped(counter_of(a, ["iptables-save", "-c"], "--uid-owner 4242"))

    verdict = matcher.explain(udp_packet("198.18.0.1", "198.18.0.2", 5310), "output", None, "veth0")

    assert verdict is not None
    assert verdict.rule == "-A OUTPUT -p udp -m owner --uid-owner 4242 -j DROP"
    assert (verdict.rule_number, verdict.confidence) == (2, "counters")


def test_iptables_legacy_input_and_output_rules(hosts: Hosts) -> None:
    a, b = hosts.a, hosts.b
    b.run("iptables-legacy", "-A", "INPUT", "-p", "udp", "--dport", "5303", "-j", "DROP")
    a.run("iptables-legacy", "-A", "OUTPUT", "-p", "tcp", "-j", "DROP")
    a.run("iptables-legacy", "-A", "OUTPUT", "-d", "198.18.0.2", "-p", "udp", "--dport", "5313", "-j", "DROP")
    in_matcher, out_matcher = FirewallMatcher(b.netns_path), FirewallMatcher(a.netns_path)
    send_udp(a, "198.18.0.2", 5303)
    send_udp(a, "198.18.0.2", 5313)
    wait_dropped(counter_of(b, ["iptables-legacy-save", "-c"], "--dport 5303"))
    wait_dropped(counter_of(a, ["iptables-legacy-save", "-c"], "--dport 5313"))

    dropped_in = in_matcher.explain(udp_packet("198.18.0.1", "198.18.0.2", 5303), "input", "veth0", None)
    dropped_out = out_matcher.explain(udp_packet("198.18.0.1", "198.18.0.2", 5313), "output", None, "veth0")

    assert dropped_in is not None and dropped_out is not None
    assert (dropped_in.backend, dropped_in.rule, dropped_in.rule_number) == (
        "iptables-legacy",
        "-A INPUT -p udp -m udp --dport 5303 -j DROP",
        1,
    )
    assert (dropped_out.backend, dropped_out.rule, dropped_out.rule_number) == (
        "iptables-legacy",
        "-A OUTPUT -d 198.18.0.2/32 -p udp -m udp --dport 5313 -j DROP",
        2,
    )


def test_iptables_policy_drop(hosts: Hosts) -> None:
    b = hosts.b
    b.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
    b.run("iptables", "-P", "INPUT", "DROP")
    matcher = FirewallMatcher(b.netns_path)
    send_udp(hosts.a, "198.18.0.2", 5304)
    wait_dropped(counter_of(b, ["iptables-save", "-c"], ":INPUT DROP"))

    verdict = matcher.explain(udp_packet("198.18.0.1", "198.18.0.2", 5304), "input", "veth0", None)

    assert verdict is not None
    assert (verdict.rule, verdict.is_policy, verdict.rule_number, verdict.confidence) == (
        "-P INPUT DROP",
        True,
        None,
        "matched",
    )


def test_ip6tables_input_rule(hosts: Hosts) -> None:
    b = hosts.b
    b.run("ip6tables", "-A", "INPUT", "-s", "2001:db8::1", "-p", "udp", "--dport", "5305", "-j", "DROP")
    matcher = FirewallMatcher(b.netns_path)
    send_udp(hosts.a, "2001:db8::2", 5305)
    wait_dropped(counter_of(b, ["ip6tables-save", "-c"], "--dport 5305"))

    verdict = matcher.explain(udp_packet("2001:db8::1", "2001:db8::2", 5305), "input", "veth0", None)

    assert verdict is not None
    assert (verdict.family, verdict.rule) == (
        "ip6",
        "-A INPUT -s 2001:db8::1/128 -p udp -m udp --dport 5305 -j DROP",
    )


def test_nft_inet_input_rule_next_to_iptables(hosts: Hosts) -> None:
    b = hosts.b
    # An iptables-nft table that accepts first, then a native inet table that drops: reported once, as nft.
    b.run("iptables", "-A", "INPUT", "-p", "udp", "--dport", "5306", "-j", "ACCEPT")
    b.run("nft", "add", "table", "inet", "fw")
    b.run("nft", "add chain inet fw input { type filter hook input priority 10; policy accept; }")
    b.run("nft", "add", "rule", "inet", "fw", "input", "ct", "state", "established", "accept")
    handle = nft_add_rule(
        b, "inet", "fw", "input", "iifname", "veth*", "udp", "dport", "5306", "counter", "drop"
    )
    matcher = FirewallMatcher(b.netns_path)
    send_udp(hosts.a, "198.18.0.2", 5306)
    wait_dropped(counter_of(b, ["nft", "list", "chain", "inet", "fw", "input"], "dport 5306"))

    verdict = matcher.explain(udp_packet("198.18.0.1", "198.18.0.2", 5306), "input", "veth0", None)

    # iptables-nft's `ip filter` table is nft underneath, but only the iptables view of it is walked.
    assert [(table.family, table.name) for table in read_snapshot(b.netns_path).nft_tables] == [
        ("inet", "fw")
    ]
    assert verdict is not None
    assert verdict.to_json() == {
        "hook": "input",
        "table": "fw",
        "chain": "input",
        "rule": f'iifname "veth*" udp dport 5306 counter drop # handle {handle}',
        "backend": "nftables",
        "family": "inet",
        "rule_number": None,
        "handle": handle,
        "confidence": "matched",
    }


def test_nft_inet_output_ipv6_reject(hosts: Hosts) -> None:
    a = hosts.a
    a.run("nft", "add", "table", "inet", "fw")
    a.run("nft", "add chain inet fw output { type filter hook output priority 0; policy accept; }")
    a.run("nft", "add", "rule", "inet", "fw", "output", "udp", "dport", "{", "1, 2", "}", "drop")
    handle = nft_add_rule(
        a,
        "inet",
        "fw",
        "output",
        "ip6",
        "daddr",
        "2001:db8::/64",
        "udp",
        "dport",
        "5307",
        "counter",
        "reject",
    )
    matcher = FirewallMatcher(a.netns_path)
    send_udp(a, "2001:db8::2", 5307)
    wait_dropped(counter_of(a, ["nft", "list", "chain", "inet", "fw", "output"], "dport 5307"))

    verdict = matcher.explain(udp_packet("2001:db8::1", "2001:db8::2", 5307), "output", None, "veth0")

    assert verdict is not None
    assert verdict.rule == (
        "ip6 daddr 2001:db8::/64 udp dport 5307 counter reject with icmpv6 port-unreachable"
        f" # handle {handle}"
    )
    assert (verdict.handle, verdict.family, verdict.hook, verdict.confidence) == (
        handle,
        "inet",
        "output",
        "matched",
    )


def test_nft_chain_policy_drop(hosts: Hosts) -> None:
    b = hosts.b
    b.run("nft", "add", "table", "ip", "guard")
    b.run("nft", "add chain ip guard in { type filter hook input priority 0; policy drop; }")
    b.run("nft", "add", "rule", "ip", "guard", "in", "tcp", "dport", "22", "accept")
    matcher = FirewallMatcher(b.netns_path)

    verdict = matcher.explain(udp_packet("198.18.0.1", "198.18.0.2", 5308), "input", "veth0", None)

    assert verdict is not None
    assert (verdict.is_policy, verdict.chain, verdict.handle) == (True, "in", None)
    assert verdict.rule == "type filter hook input priority filter; policy drop;"


def test_no_rule_no_verdict(hosts: Hosts) -> None:
    hosts.b.run("iptables", "-A", "INPUT", "-p", "tcp", "-j", "DROP")
    matcher = FirewallMatcher(hosts.b.netns_path)
    assert matcher.explain(udp_packet("198.18.0.1", "198.18.0.2", 5309), "input", "veth0", None) is None


def test_run_in_netns_sees_the_namespace(hosts: Hosts) -> None:
    assert "198.18.0.2/24" in run_in_netns(["ip", "-o", "addr", "show", "dev", "veth0"], hosts.b.netns_path)
    with pytest.raises(EnvironmentProblem, match="not installed"):
        run_in_netns(["netsleuth-no-such-tool"], hosts.b.netns_path)
    with pytest.raises(UsageError, match="does not exist"):
        run_in_netns(["true"], "/run/netns/netsleuth-no-such-namespace")


def test_the_rules_version_changes_with_every_rule_and_not_with_counters(hosts: Hosts) -> None:
    """netsleuth.firewall.ruleset_version in a real namespace: nf_tables's generation moves with every rule
    nft or iptables-nft commits, never with the counters drops move; legacy tables have no version."""
    b = hosts.b
    version = RulesetVersion(b.netns_path)
    try:
        start = version()
        assert start is not None
        b.run("iptables-nft", "-A", "INPUT", "-p", "udp", "--dport", "9", "-j", "DROP")
        after_iptables = version()
        assert after_iptables is not None and after_iptables != start
        for _ in range(20):  # drops move the rule's counter, not the rules
            send_udp(hosts.a, "198.18.0.2", 9)
        assert version() == after_iptables
        b.run("nft", "add", "table", "inet", "extra")
        assert version() not in (None, after_iptables)
        b.run("iptables-legacy", "-A", "INPUT", "-p", "udp", "--dport", "10", "-j", "DROP")
        assert version() is None  # legacy rules carry no version: the matcher reads them each time
    finally:
        version.close()


def test_a_storm_one_rule_decides_runs_no_tool_until_a_rule_changes(hosts: Hosts) -> None:
    """The matcher over the real tools: past max_age it asks the rules' version, not iptables-save, while
    one rule certainly decides the drops; a new rule is read within max_age."""
    b = hosts.b
    b.run("iptables-nft", "-A", "INPUT", "-p", "udp", "--dport", "9", "-j", "DROP")
    reads: list[str | None] = []
    clock = [100.0]

    def counted(path: str | None) -> FirewallSnapshot:
        reads.append(path)
        return read_snapshot(path, lambda: clock[0])

    version = RulesetVersion(b.netns_path)
    matcher = FirewallMatcher(b.netns_path, reader=counted, clock=lambda: clock[0], version=version)
    try:
        packet = udp_packet("198.18.0.1", "198.18.0.2", 9)
        first = matcher.explain(packet, "input", "veth0", None)
        assert first is not None and first.confidence == "matched"
        for _ in range(6):
            send_udp(hosts.a, "198.18.0.2", 9)
            clock[0] += 1.0
            assert matcher.explain(packet, "input", "veth0", None) == first
        assert len(reads) == 1  # the start's reading, which the drops were decided on too
        b.run("iptables-nft", "-I", "INPUT", "-p", "udp", "--dport", "9", "-j", "REJECT")
        clock[0] += 1.0
        changed = matcher.explain(packet, "input", "veth0", None)
        assert len(reads) == 2 and changed is not None and changed.rule != first.rule
    finally:
        matcher.close()
        version.close()
