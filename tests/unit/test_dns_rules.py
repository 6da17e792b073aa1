"""diagnose's DNS verdicts on hand-built records: each rule fires on its evidence and names the fix."""

from __future__ import annotations

import random
from typing import Any

import msgspec

from netsleuth.diagnose.correlate import absorb_dns_firewall
from netsleuth.diagnose.verdicts import Severity, Verdict, rank
from netsleuth.diagnostics.attribution import Owner
from netsleuth.diagnostics.causes import CATALOGUE
from netsleuth.diagnostics.dns.records import (
    DnsAnswer,
    DnsDrop,
    DnsRecord,
    DnsRow,
    dns_drop,
    timeout_record,
)
from netsleuth.diagnostics.dns.rules import NXDOMAIN_STORM_MIN, dns_verdicts
from netsleuth.spec.diagnose import Watched
from netsleuth.spec.records import WallTime

CLIENT = Owner(4242, "curl", "task")
KERNEL = Owner(None, "kernel", "kernel")


def facts(name: str = "api.example.com", server: str = "198.18.0.2", owner: Owner = CLIENT) -> dict[str, Any]:
    """A query's keys (DnsQuery)."""
    return {
        "time": WallTime(1.0),
        "pid": owner.pid,
        "comm": owner.comm,
        "owner": owner.source,
        "container": None,
        "netns": 4026532000,
        "netns_name": "cli",
        "proto": "udp",
        "family": 4,
        "client": "198.18.0.1",
        "client_port": 40000,
        "server": server,
        "server_port": 53,
        "id": 7,
        "name": name,
        "qtype": "A",
        "retransmits": 0,
    }


def drop(reason: str, rule: str | None = None, owner: Owner = KERNEL, time: float = 1.0) -> DnsDrop:
    netfilter = None
    if rule:
        netfilter = {"backend": "iptables-nft", "table": "filter", "chain": "INPUT", "rule_number": 1}
    return dns_drop(
        time=WallTime(time),
        direction="answer",
        reason=reason,
        location="nft_do_chain+0x46f",
        proto="udp",
        saddr="198.18.0.2",
        daddr="198.18.0.1",
        sport=53,
        dport=40000,
        id=7,
        name="api.example.com",
        pid=owner.pid,
        comm=owner.comm,
        owner=owner.source,
        netns=4026532000,
        netns_name="cli",
        rule=rule,
        hook="input" if rule else None,
        netfilter=netfilter,
    )


def answer(rcode: str, name: str = "api.example.com") -> DnsAnswer:
    return DnsAnswer(
        **facts(name),
        latency_ms=0.4,
        rcode=rcode,
        answer_count=0,
        answers=(),
        truncated=False,
        tcp_retry=False,
    )


def test_timeout_with_firewall_drop_names_the_rule_and_the_delete_command() -> None:
    rule = "-A INPUT -p udp -m udp --sport 53 -j DROP"
    timeouts = [timeout_record(facts(), 5000.0, drop("NETFILTER_DROP", rule), None) for _ in range(3)]
    (verdict,) = dns_verdicts(timeouts, [], 10.0)
    assert verdict.category == "dns-timeout-firewall"
    assert verdict.severity is Severity.CRITICAL
    assert rule in verdict.cause and "curl[4242]" in verdict.cause and "3 DNS queries" in verdict.cause
    assert verdict.fix[0].startswith("ip netns exec cli iptables -t filter -D INPUT 1")
    assert verdict.events == 3


def test_timeout_from_a_full_receive_buffer_names_the_process() -> None:
    owner = Owner(4242, "curl", "socket")
    timeouts = [timeout_record(facts(), 5000.0, drop("SOCKET_RCVBUFF", owner=owner), 0.3)]
    (verdict,) = dns_verdicts(timeouts, [], 10.0)
    assert verdict.category == "dns-timeout-rcvbuf"
    assert "curl[4242]" in verdict.cause and "receive buffer" in verdict.cause
    assert any("SO_RCVBUF" in fix for fix in verdict.fix)


def test_timeout_without_a_drop_points_off_host() -> None:
    (verdict,) = dns_verdicts([timeout_record(facts(), 5000.0, None, None)], [], 10.0)
    assert verdict.category == "dns-timeout"
    assert verdict.severity is Severity.WARNING
    assert "nothing on this host dropped" in verdict.cause
    assert verdict.fix[0].startswith("dig @198.18.0.2 api.example.com A")


def test_servfail_and_refused_by_server() -> None:
    records = [answer("SERVFAIL")] * 4 + [answer("REFUSED", "x.test")] * 2 + [answer("NOERROR")] * 9
    verdicts = {verdict.category: verdict for verdict in dns_verdicts(records, [], 10.0)}
    assert set(verdicts) == {"dns-servfail", "dns-refused"}
    assert verdicts["dns-servfail"].events == 4
    assert "SERVFAIL to 4" in verdicts["dns-servfail"].cause
    assert verdicts["dns-refused"].events == 2


def _row(
    nxdomain: int,
    noerror: int,
    lookups: int,
    expansions: int,
    pid: int = 4242,
    comm: str = "curl",
    domains: tuple[str, ...] = ("a.test", "b.test", "c.test"),
) -> DnsRow:
    return DnsRow(
        pid=pid,
        comm=comm,
        server="198.18.0.2",
        suffix="api.svc",
        queries=lookups + expansions,
        answers={"NXDOMAIN": nxdomain, "NOERROR": noerror},
        timeouts=0,
        truncated=0,
        retransmits=0,
        tcp_queries=0,
        p50_ms=None,
        p99_ms=None,
        lookups=lookups,
        search_expansions=expansions,
        amplification=(lookups + expansions) / lookups if lookups else None,
        names=("api.svc",),
        search_domains=tuple(sorted(domains)),
    )


def test_search_list_amplification_with_the_three_fixes() -> None:
    (verdict,) = dns_verdicts([], [_row(nxdomain=6, noerror=2, lookups=2, expansions=6)], 10.0)
    assert verdict.category == "dns-search-amplification"
    assert "becomes 4.0 DNS queries" in verdict.cause
    assert verdict.fix[0].endswith("api.svc.")
    assert "ndots" in verdict.fix[1]


def test_nxdomain_storm_counts_only_the_names_asked_for() -> None:
    storm = _row(nxdomain=NXDOMAIN_STORM_MIN + 5, noerror=1, lookups=NXDOMAIN_STORM_MIN + 6, expansions=0)
    (verdict,) = dns_verdicts([], [storm], 5.0)
    assert verdict.category == "dns-nxdomain-storm"
    assert verdict.events == NXDOMAIN_STORM_MIN + 5
    # The same NXDOMAINs as search-list expansions are amplification, not a storm.
    folded = _row(nxdomain=30, noerror=10, lookups=10, expansions=30)
    assert [v.category for v in dns_verdicts([], [folded], 5.0)] == ["dns-search-amplification"]


def test_drops_no_timeout_explains_get_their_own_verdict() -> None:
    rule = "-A INPUT -p udp -m udp --sport 53 -j DROP"
    explained = drop("NETFILTER_DROP", rule)
    timeout = timeout_record(facts(), 5000.0, explained, None)
    rcvbuf = drop("SOCKET_RCVBUFF", owner=Owner(4242, "curl", "socket"))
    verdicts = dns_verdicts([explained, timeout, rcvbuf], [], 10.0)
    assert sorted(verdict.category for verdict in verdicts) == ["dns-drop", "dns-timeout-firewall"]
    (dropped,) = [verdict for verdict in verdicts if verdict.category == "dns-drop"]
    assert "receive buffer of curl[4242]" in dropped.cause and dropped.severity is Severity.CRITICAL


RULE = "-A INPUT -p udp -m udp --sport 53 -j DROP"
GETENT = [Owner(pid, "getent", "task") for pid in (9001, 9002, 9003)]


def test_search_list_fix_suggests_only_names_the_real_search_list_makes() -> None:
    (plain,) = dns_verdicts([], [_row(nxdomain=6, noerror=2, lookups=2, expansions=6)], 10.0)
    assert "api.svc.a.test, api.svc.b.test, api.svc.c.test answered NXDOMAIN" in plain.cause
    assert plain.evidence["search_domains"] == ["a.test", "b.test", "c.test"]
    assert not any("svc.cluster.local" in fix or "Kubernetes" in fix for fix in plain.fix), plain.fix
    kubernetes = ("default.svc.cluster.local", "svc.cluster.local", "cluster.local")
    (pod,) = dns_verdicts(
        [], [_row(nxdomain=6, noerror=2, lookups=2, expansions=6, domains=kubernetes)], 10.0
    )
    assert any("Kubernetes, the pod's dnsConfig.options ndots" in fix for fix in pod.fix)
    assert not any("<name>" in fix or "<namespace>" in fix for fix in pod.fix)


def test_the_same_program_and_name_is_one_verdict_however_many_processes() -> None:
    rows = [
        _row(nxdomain=3, noerror=1, lookups=1, expansions=3, pid=owner.pid or 0, comm="getent")
        for owner in GETENT
    ]
    (verdict,) = dns_verdicts([], rows, 10.0)
    assert "by getent (3 processes) becomes 4.0 DNS queries" in verdict.cause
    assert verdict.evidence["lookups"] == 3 and verdict.evidence["expansions"] == 9
    assert [process["pid"] for process in verdict.evidence["processes"]] == [9001, 9002, 9003]
    timeouts = [
        timeout_record(facts(owner=owner), 5000.0, drop("NETFILTER_DROP", RULE, owner), None)
        for owner in GETENT
    ]
    (timed_out,) = dns_verdicts(timeouts, [], 10.0)
    assert "3 DNS queries of getent (3 processes) to 198.18.0.2:53/udp timed out" in timed_out.cause


def test_dropped_retries_of_a_query_that_timed_out_are_evidence_not_another_verdict() -> None:
    """glibc retries on the same socket with the same id: each answer is dropped by the rule, and the one
    timeout carries the last drop. Both drops belong to the timeout verdict."""
    owner = Owner(4242, "getent", "socket")
    first, retry = (
        drop("NETFILTER_DROP", RULE, owner, time=1.0),
        drop("NETFILTER_DROP", RULE, owner, time=2.0),
    )
    timeout = timeout_record(facts(owner=owner), 2000.0, retry, None)
    (verdict,) = dns_verdicts([first, retry, timeout], [], 6.0)
    assert verdict.category == "dns-timeout-firewall" and verdict.cause_code == "firewall_drop"
    assert verdict.evidence["dns_drops"] == 2 and "2 packets in all" in verdict.cause


def firewall_verdict(count: int, rule: str = RULE) -> Verdict:
    netfilter = {"rule": rule, "table": "filter", "chain": "INPUT", "hook": "input"}
    return Verdict(
        category="firewall",
        severity=Severity.WARNING,
        cause=f'firewall rule "{rule}" dropped {count} packet(s)',
        evidence={"drops": count, "location": "nft_do_chain+0x46f", "netfilter": netfilter},
        fix=("ip netns exec cli iptables -t filter -D INPUT 1   # if this traffic should pass",),
        events=count,
        cause_code="firewall_drop",
        netns=4026532000,
        firewall_rule=rule,
    )


def _absorbed(records: list[DnsRecord], firewall: Verdict) -> tuple[list[Verdict], list[Verdict]]:
    """(the DNS verdicts, the others) once diagnose has joined the firewall verdict of the same fault."""
    found = dns_verdicts(records, [], 6.0)
    joined = absorb_dns_firewall([*found, firewall], {"dns": Watched(records, None)})
    dns = [verdict for verdict in joined if verdict.category.startswith("dns-")]
    return dns, [verdict for verdict in joined if not verdict.category.startswith("dns-")]


def test_the_firewall_verdict_of_the_same_drops_joins_the_dns_verdict() -> None:
    owner = Owner(4242, "getent", "socket")
    drops = [drop("NETFILTER_DROP", RULE, owner, time=t) for t in (1.0, 2.0)]
    records: list[DnsRecord] = [*drops, timeout_record(facts(owner=owner), 2000.0, drops[-1], None)]
    merged, kept = _absorbed(records, firewall_verdict(2))
    assert kept == []
    (verdict,) = merged
    assert verdict.evidence["firewall"]["drops"] == 2 and verdict.severity is Severity.CRITICAL
    assert verdict.firewall_rule == RULE and verdict.netns == 4026532000
    # A rule that dropped more than these DNS packets stays a verdict of its own.
    merged, kept = _absorbed(records, firewall_verdict(7))
    assert [v.category for v in kept] == ["firewall"] and "firewall" not in merged[0].evidence
    # Another rule is another fault.
    _, kept = _absorbed(records, firewall_verdict(2, "-A INPUT -j DROP"))
    assert len(kept) == 1


def test_every_dns_verdict_carries_a_catalogued_code() -> None:
    owner = Owner(4242, "curl", "socket")
    records: list[DnsRecord] = [
        timeout_record(facts(), 5000.0, drop("NETFILTER_DROP", RULE), None),
        timeout_record(facts(server="198.18.0.3"), 5000.0, drop("SOCKET_RCVBUFF", owner=owner), None),
        timeout_record(facts(server="198.18.0.4"), 5000.0, drop("IP_INNOROUTES"), None),
        timeout_record(facts(server="198.18.0.5"), 5000.0, None, None),
        drop("NETFILTER_DROP", "-A INPUT -j DROP", time=3.0),
        answer("SERVFAIL"),
        answer("REFUSED"),
    ]
    rows = [
        _row(nxdomain=6, noerror=2, lookups=2, expansions=6),
        _row(
            nxdomain=NXDOMAIN_STORM_MIN + 5,
            noerror=1,
            lookups=NXDOMAIN_STORM_MIN + 6,
            expansions=0,
            comm="app",
        ),
    ]
    verdicts = dns_verdicts(records, rows, 10.0)
    codes = {verdict.category: verdict.cause_code for verdict in verdicts}
    assert codes == {
        "dns-timeout-firewall": "firewall_drop",
        "dns-timeout-rcvbuf": "rcvbuf",
        "dns-timeout-drop": "kernel_drop",
        "dns-timeout": "dns_no_answer",
        "dns-drop": "firewall_drop",
        "dns-servfail": "dns_servfail",
        "dns-refused": "dns_refused",
        "dns-search-amplification": "dns_search_amplification",
        "dns-nxdomain-storm": "dns_nxdomain",
    }
    assert set(codes.values()) <= set(CATALOGUE)


def test_ranking_is_the_same_whatever_order_the_verdicts_come_in() -> None:
    equal = [
        msgspec.structs.replace(firewall_verdict(3), cause=f'firewall rule "{rule}" dropped 3 packet(s)')
        for rule in ("-A INPUT -p tcp -j DROP", "-A INPUT -p udp -j DROP", "-A OUTPUT -j DROP")
    ]
    others = dns_verdicts([answer("SERVFAIL")] * 3 + [answer("REFUSED")] * 3, [], 10.0)
    verdicts = [*equal, *others]
    expected = rank(verdicts)
    for seed in range(20):
        shuffled = list(verdicts)
        random.Random(seed).shuffle(shuffled)
        assert rank(shuffled) == expected
