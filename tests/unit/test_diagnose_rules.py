"""Verdict rules on hand-built drop groups and doctor findings (no kernel)."""

from __future__ import annotations

from netsleuth.diagnose.correlate import merge_findings
from netsleuth.diagnose.verdicts import Severity, rank
from netsleuth.diagnostics.attribution import Owner
from netsleuth.diagnostics.drops.enrich import drop_record
from netsleuth.diagnostics.drops.records import DropGroup
from netsleuth.diagnostics.drops.rules import drop_verdicts
from netsleuth.doctor.findings import Finding
from netsleuth.doctor.findings import Severity as FindingSeverity
from netsleuth.packet import PacketTuple
from netsleuth.spec.diagnose import Window

CONTEXT = Window(seconds=10.0, sysctls={"net.core.netdev_max_backlog": "1000"})


def group(reason: str, count: int, *, cpu: int = 1, netfilter: dict[str, object] | None = None) -> DropGroup:
    example = drop_record(
        time=0.0,
        reason=reason,
        reason_code=0,
        location="enqueue_to_backlog+0x1a0",
        packet=PacketTuple(4, 17, "198.18.0.1", "198.18.0.2", 40000, 53, length=60),
        owner=Owner(None, "kernel", "kernel"),
        netns=4026531840,
        netns_name=None,
        ifname="eth1",
        ifindex=3,
        cpu=cpu,
        sk_state=None,
        stack=None,
        source=None,
        netfilter=netfilter,
    )
    return DropGroup(
        reason=reason,
        location=example.location,
        netns=example.netns,
        netns_name=None,
        count=count,
        bytes=count * 60,
        example=example,
    )


def backlog_finding() -> Finding:
    return Finding(
        id="backlog-drops",
        severity=FindingSeverity.CRITICAL,
        subject="cpu1",
        title="softnet backlog drops",
        evidence={"dropped_per_s": {"1": 120.0}},
        explanation="the per-CPU backlog overflowed",
        fix_commands=("sysctl -w net.core.netdev_max_backlog=2000",),
    )


def test_cpu_backlog_drops_and_softnet_counters_are_one_verdict() -> None:
    verdicts = merge_findings(drop_verdicts([group("CPU_BACKLOG", 1200)], CONTEXT), (backlog_finding(),))
    assert len(verdicts) == 1
    [verdict] = verdicts
    assert verdict.category == "cpu-backlog" and verdict.severity == Severity.CRITICAL
    assert verdict.absorbed_findings == ("backlog-drops",)
    assert verdict.evidence["path_health"][0]["id"] == "backlog-drops"
    assert "netdev_max_backlog=1000" in verdict.cause


def test_unrelated_findings_stay_their_own_verdicts() -> None:
    verdicts = merge_findings(drop_verdicts([group("NO_SOCKET", 3)], CONTEXT), (backlog_finding(),))
    assert sorted(verdict.category for verdict in verdicts) == ["no-listener", "path:backlog-drops"]


def test_ranking_puts_losses_before_background() -> None:
    verdicts = rank(drop_verdicts([group("NOT_SPECIFIED", 500), group("SOCKET_RCVBUFF", 5)], CONTEXT))
    assert [verdict.category for verdict in verdicts] == ["udp-rcvbuf", "drop:NOT_SPECIFIED"]
    assert verdicts[1].severity == Severity.WARNING  # 50/s of unclassified drops is more than chatter


def test_firewall_fix_names_the_rule_to_delete() -> None:
    netfilter = {
        "hook": "input",
        "table": "filter",
        "chain": "INPUT",
        "rule": "-A INPUT -j DROP",
        "backend": "iptables-legacy",
        "family": "ip",
        "rule_number": 4,
    }
    [verdict] = drop_verdicts([group("NETFILTER_DROP", 2, netfilter=netfilter)], CONTEXT)
    assert verdict.fix[0].startswith("iptables-legacy -t filter -D INPUT 4")
    [ranked] = rank([verdict])
    assert ranked.to_json()["type"] == "verdict" and ranked.to_json()["rank"] == 1
