"""`netsleuth dns` text lines: each record says what a person needs at a glance."""

from __future__ import annotations

from netsleuth.diagnostics.attribution import Owner
from netsleuth.diagnostics.dns_records import DnsAnswer, DnsDrop, DnsQueryFacts, DnsTimeout
from netsleuth.packet import PacketTuple
from netsleuth.render.dns_text import dns_line

FACTS = DnsQueryFacts(
    time=1_700_000_000.25,
    owner=Owner(4242, "dig", "task"),
    netns=4026532000,
    netns_name="cli",
    proto="udp",
    family=6,
    client="2001:db8::1",
    client_port=40000,
    server="2001:db8::2",
    server_port=53,
    id=7,
    name="www.ok.test",
    qtype="AAAA",
    retransmits=1,
)


def test_answer_line() -> None:
    line = dns_line(DnsAnswer(FACTS, 1.5, "NOERROR", 1, ("AAAA 2001:db8::2",), True, False))
    assert "NOERROR" in line and "1.500 ms" in line and "www.ok.test AAAA" in line
    assert "udp [2001:db8::2]:53" in line and "dig[4242] netns cli" in line
    assert "[AAAA 2001:db8::2]" in line and "TRUNCATED" in line and "1 retransmit(s)" in line


def test_timeout_line_carries_the_cause() -> None:
    drop = DnsDrop(
        time=1.0,
        direction="answer",
        reason="NETFILTER_DROP",
        location="nft_do_chain+0x3e8",
        packet=PacketTuple(6, 17, "2001:db8::2", "2001:db8::1", 53, 40000),
        id=7,
        name="www.ok.test",
        owner=Owner(None, "kernel", "kernel"),
        netns=4026532000,
        netns_name="cli",
        rule="-A INPUT -p udp -m udp --sport 53 -j DROP",
        hook="input",
    )
    text = dns_line(DnsTimeout(FACTS, 5000.0, drop, None))
    first, cause = text.split("\n")
    assert "TIMEOUT" in first and "5000 ms" in first
    assert cause.strip().startswith('cause: answer dropped by firewall rule "-A INPUT')
    assert "DROP" in dns_line(drop) and "id 7" in dns_line(drop)
