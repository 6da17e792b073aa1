"""diagnose's DNS verdicts on hand-built records: each rule fires on its evidence and names the fix."""

from __future__ import annotations

from netsleuth.diagnose.dns_rules import NXDOMAIN_STORM_MIN, dns_verdicts
from netsleuth.diagnose.verdicts import Severity
from netsleuth.diagnostics.attribution import Owner
from netsleuth.diagnostics.dns_records import DnsAnswer, DnsDrop, DnsQueryFacts, DnsTimeout
from netsleuth.diagnostics.dns_summary import DnsSummaryRow
from netsleuth.packet import PacketTuple

CLIENT = Owner(4242, "curl", "task")
KERNEL = Owner(None, "kernel", "kernel")


def facts(name: str = "api.example.com", server: str = "198.18.0.2") -> DnsQueryFacts:
    return DnsQueryFacts(
        time=1.0,
        owner=CLIENT,
        netns=4026532000,
        netns_name="cli",
        proto="udp",
        family=4,
        client="198.18.0.1",
        client_port=40000,
        server=server,
        server_port=53,
        id=7,
        name=name,
        qtype="A",
        retransmits=0,
    )


def drop(reason: str, rule: str | None = None, owner: Owner = KERNEL) -> DnsDrop:
    netfilter = None
    if rule:
        netfilter = {"backend": "iptables-nft", "table": "filter", "chain": "INPUT", "rule_number": 1}
    return DnsDrop(
        time=1.0,
        direction="answer",
        reason=reason,
        location="nft_do_chain+0x46f",
        packet=PacketTuple(4, 17, "198.18.0.2", "198.18.0.1", 53, 40000),
        id=7,
        name="api.example.com",
        owner=owner,
        netns=4026532000,
        netns_name="cli",
        rule=rule,
        hook="input" if rule else None,
        netfilter=netfilter,
    )


def answer(rcode: str, name: str = "api.example.com") -> DnsAnswer:
    return DnsAnswer(facts(name), 0.4, rcode, 0, (), False, False)


def test_timeout_with_firewall_drop_names_the_rule_and_the_delete_command() -> None:
    rule = "-A INPUT -p udp -m udp --sport 53 -j DROP"
    timeouts = [DnsTimeout(facts(), 5000.0, drop("NETFILTER_DROP", rule), None) for _ in range(3)]
    (verdict,) = dns_verdicts(timeouts, [], 10.0)
    assert verdict.category == "dns-timeout-firewall"
    assert verdict.severity is Severity.CRITICAL
    assert rule in verdict.cause and "curl[4242]" in verdict.cause and "3 DNS queries" in verdict.cause
    assert verdict.fix[0].startswith("ip netns exec cli iptables -t filter -D INPUT 1")
    assert verdict.events == 3


def test_timeout_from_a_full_receive_buffer_names_the_process() -> None:
    owner = Owner(4242, "curl", "socket")
    timeouts = [DnsTimeout(facts(), 5000.0, drop("SOCKET_RCVBUFF", owner=owner), 0.3)]
    (verdict,) = dns_verdicts(timeouts, [], 10.0)
    assert verdict.category == "dns-timeout-rcvbuf"
    assert "curl[4242]" in verdict.cause and "receive buffer" in verdict.cause
    assert any("SO_RCVBUF" in fix for fix in verdict.fix)


def test_timeout_without_a_drop_points_off_host() -> None:
    (verdict,) = dns_verdicts([DnsTimeout(facts(), 5000.0, None, None)], [], 10.0)
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


def _row(nxdomain: int, noerror: int, lookups: int, expansions: int) -> DnsSummaryRow:
    return DnsSummaryRow(
        pid=4242,
        comm="curl",
        server="198.18.0.2",
        suffix="api.svc",
        queries=lookups + expansions,
        lookups=lookups,
        expansions=expansions,
        answers={"NXDOMAIN": nxdomain, "NOERROR": noerror},
        names={"api.svc"},
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
    timeout = DnsTimeout(facts(), 5000.0, explained, None)
    rcvbuf = drop("SOCKET_RCVBUFF", owner=Owner(4242, "curl", "socket"))
    verdicts = dns_verdicts([explained, timeout, rcvbuf], [], 10.0)
    assert sorted(verdict.category for verdict in verdicts) == ["dns-drop", "dns-timeout-firewall"]
    (dropped,) = [verdict for verdict in verdicts if verdict.category == "dns-drop"]
    assert "receive buffer of curl[4242]" in dropped.cause and dropped.severity is Severity.CRITICAL
