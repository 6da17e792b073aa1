"""`netsleuth dns` text lines: each record says what a person needs at a glance."""

from __future__ import annotations

from typing import Any

from netsleuth.diagnostics.dns.records import DnsAnswer, dns_drop, timeout_record
from netsleuth.diagnostics.dns.view import dns_line
from netsleuth.spec.records import WallTime

FACTS: dict[str, Any] = {
    "time": WallTime(1_700_000_000.25),
    "pid": 4242,
    "comm": "dig",
    "owner": "task",
    "container": None,
    "netns": 4026532000,
    "netns_name": "cli",
    "proto": "udp",
    "family": 6,
    "client": "2001:db8::1",
    "client_port": 40000,
    "server": "2001:db8::2",
    "server_port": 53,
    "id": 7,
    "name": "www.ok.test",
    "qtype": "AAAA",
    "retransmits": 1,
}


def test_answer_line() -> None:
    answer = DnsAnswer(
        **FACTS,
        latency_ms=1.5,
        rcode="NOERROR",
        answer_count=1,
        answers=("AAAA 2001:db8::2",),
        truncated=True,
        tcp_retry=False,
    )
    line = dns_line(answer)
    assert "NOERROR" in line and "1.500 ms" in line and "www.ok.test AAAA" in line
    assert "udp [2001:db8::2]:53" in line and "dig[4242] netns cli" in line
    assert "[AAAA 2001:db8::2]" in line and "TRUNCATED" in line and "1 retransmit(s)" in line


def test_timeout_line_carries_the_cause() -> None:
    drop = dns_drop(
        time=WallTime(1.0),
        direction="answer",
        reason="NETFILTER_DROP",
        location="nft_do_chain+0x3e8",
        proto="udp",
        saddr="2001:db8::2",
        daddr="2001:db8::1",
        sport=53,
        dport=40000,
        id=7,
        name="www.ok.test",
        pid=None,
        comm="kernel",
        owner="kernel",
        netns=4026532000,
        netns_name="cli",
        rule="-A INPUT -p udp -m udp --sport 53 -j DROP",
        hook="input",
        netfilter=None,
    )
    text = dns_line(timeout_record(FACTS, 5000.0, drop, None))
    first, cause = text.split("\n")
    assert "TIMEOUT" in first and "5000 ms" in first
    assert cause.strip().startswith('cause: answer dropped by firewall rule "-A INPUT')
    assert "DROP" in dns_line(drop) and "id 7" in dns_line(drop)
