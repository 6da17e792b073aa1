"""One fault, one verdict: what two diagnostics (or a diagnostic and doctor) saw of the same cause, told once.

Each contribution's rules judge only what their own diagnostic saw (netsleuth.spec.diagnose); here, on the
typed records of the window and the typed verdicts, diagnose joins what belongs together:

- before the rules, facts one diagnostic's verdicts quote from another's records: the resets TCP sent for a
  flow (the no-listener verdict says how many), and the NEIGH_* drops a failed next hop explains (route's
  verdict names them; drops' does not count them again);
- after them, a verdict that explains another: a doctor finding of the same cause (CPU_BACKLOG drops and
  softnet's rising `dropped` on the same window; the NET_RX budget's time-squeeze) is absorbed into the
  verdict naming it in `absorbed_findings`, its evidence merged; a firewall rule that dropped only the DNS
  packets a DNS verdict names is that verdict's cause, not a verdict of its own; a full listener already
  named by a listen-overflow drop verdict is not named again.

The findings left over become verdicts of their own (`finding_verdict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from netsleuth.spec.verdict import Verdict

if TYPE_CHECKING:
    from netsleuth.doctor.findings import Finding
    from netsleuth.spec.diagnose import Watched

__all__ = [
    "PATH_CAUSE_CODES",
    "absorb_dns_firewall",
    "finding_verdict",
    "merge_findings",
    "resets_by_flow",
    "without_explained_drops",
]


def _rule_of(finding: Finding) -> str:
    return finding.id.split(":", 1)[0]


# The catalogue's code of each doctor rule, for the findings that carry none themselves (the NIC, queue,
# interrupt and MTU rules): a path verdict names its cause in the one vocabulary like every other verdict.
PATH_CAUSE_CODES = {
    "backlog-drops": "cpu_backlog",
    "listen-overflow": "listen_overflow",
    "syn-queue-full": "syn_queue_full",
    "tcp-receive-drops": "tcp_receive_full",
    "udp-rcvbuf-errors": "rcvbuf",
    "udp-sndbuf-errors": "sndbuf",
    "conntrack-full": "conntrack_full",
    "conntrack-invalid": "conntrack_invalid",
    "rp-filter-drops": "rp_filter",
    "rx-drops": "device_drops",
    "tx-drops": "device_drops",
    "rx-errors": "device_errors",
    "tx-errors": "device_errors",
    "rx-nohandler": "rx_nohandler",
    "ring-exhaustion": "ring_exhaustion",
    "irq-pileup": "irq_pileup",
    "irq-numa": "irq_numa",
    "softirq-skew": "softirq_skew",
    "time-squeeze": "net_rx_budget",
    "queues-vs-cpus": "queues_vs_cpus",
    "rps-single-queue": "rps_single_queue",
    "rps-on-multiqueue": "rps_on_multiqueue",
    "xps-off": "xps_off",
    "coalesce-off": "coalesce_off",
    "coalesce-high": "coalesce_high",
    "gro-off": "gro_off",
    "lro-forwarding": "lro_forwarding",
    "tunnel-tso": "tunnel_tso",
    "bond-slave-offload": "bond_slave_offload",
    "tunnel-mtu": "tunnel_mtu",
    "veth-mtu": "veth_mtu",
}


# -- before the rules ------------------------------------------------------------------------------------


def resets_by_flow(results: Mapping[str, Watched]) -> dict[tuple[str | None, int | None], int]:
    """RSTs this host sent in the window, per (address, port) they answered for (the tcp watch's groups)."""
    from netsleuth.diagnostics.tcp.rules import TcpWindow, resets_sent_by_flow

    tcp = results.get("resets")
    if tcp is None or not isinstance(tcp.summary, TcpWindow):
        return {}
    return resets_sent_by_flow(tcp.summary.resets)


def without_explained_drops(results: Mapping[str, Watched]) -> dict[str, Watched]:
    """The results with the NEIGH_* drop groups a failed next hop explains taken out of drops' (route's
    next-hop verdict counts them: not twice)."""
    from netsleuth.diagnostics.route.records import RouteSummary
    from netsleuth.diagnostics.route.rules import is_neighbour_drop, neighbour_drops_explained
    from netsleuth.spec.diagnose import Watched

    route, drops = results.get("route"), results.get("drops")
    if route is None or drops is None or not isinstance(route.summary, RouteSummary):
        return dict(results)
    if not neighbour_drops_explained(route.summary):
        return dict(results)
    groups = tuple(group for group in drops.summary.groups if not is_neighbour_drop(group))
    summary = _replaced(drops.summary, groups=groups)
    return {**results, "drops": Watched(drops.records, summary)}


def _replaced(summary: object, **changes: object) -> object:
    import dataclasses

    if isinstance(summary, msgspec.Struct):
        return msgspec.structs.replace(summary, **changes)
    return dataclasses.replace(summary, **changes)  # type: ignore[type-var]


# -- after them ------------------------------------------------------------------------------------------


def finding_verdict(finding: Finding, netns: int | None) -> Verdict:
    """A doctor finding as a verdict: its title and explanation are the cause, its commands the fix; it is
    about the namespace doctor read (`netns`)."""
    return Verdict(
        category=f"path:{_rule_of(finding)}",
        severity=finding.severity,
        cause=f"{finding.title}: {finding.explanation}",
        evidence={"finding": finding.id, "subject": finding.subject, **finding.evidence},
        fix=(
            *finding.fix_commands,
            *finding.persistent,
            *(
                (f"{finding.apply_command}   # applies it, with a rollback file",)
                if finding.apply_command
                else ()
            ),
        ),
        absorbed_findings=(finding.id,),
        cause_code=finding.cause_code or PATH_CAUSE_CODES[_rule_of(finding)],
        netns=netns,
    )


def merge_findings(
    verdicts: list[Verdict], findings: tuple[Finding, ...], netns: int | None = None
) -> list[Verdict]:
    """Each verdict with the doctor findings of the rules it names in `absorbed_findings` (their ids, then),
    and a verdict of each finding no verdict explains (read in `netns`)."""
    merged: list[Verdict] = []
    claimed: set[str] = set()
    for verdict in verdicts:
        explained = [finding for finding in findings if _rule_of(finding) in verdict.absorbed_findings]
        if explained:
            claimed.update(finding.id for finding in explained)
            verdict = msgspec.structs.replace(
                verdict,
                evidence={**verdict.evidence, "path_health": [finding.to_json() for finding in explained]},
                severity=min(verdict.severity, *(finding.severity for finding in explained)),
                absorbed_findings=tuple(finding.id for finding in explained),
            )
        elif verdict.absorbed_findings:
            verdict = msgspec.structs.replace(verdict, absorbed_findings=())
        merged.append(verdict)
    merged.extend(finding_verdict(finding, netns) for finding in findings if finding.id not in claimed)
    return merged


def absorb_dns_firewall(verdicts: list[Verdict], results: Mapping[str, Watched]) -> list[Verdict]:
    """drops' `firewall` verdict of a rule that dropped only DNS packets (its count no more than the DNS
    packets that rule dropped in that namespace, as the dns watch saw them) is the same fault as the DNS
    verdict naming that rule: its facts join the DNS verdict (`firewall`), and it is no verdict of its own."""
    dns = results.get("dns")
    if dns is None:
        return verdicts
    from netsleuth.diagnostics.dns.rules import dropped_by_rule

    dns_drops = dropped_by_rule(dns.records)
    merged = list(verdicts)
    owners: dict[tuple[str | None, int | None], int] = {}
    for index, verdict in enumerate(merged):
        if verdict.category.startswith("dns-") and verdict.cause_code == "firewall_drop":
            owners.setdefault((verdict.firewall_rule, verdict.netns), index)
    absorbed: set[int] = set()
    for index, verdict in enumerate(merged):
        if verdict.category != "firewall" or verdict.firewall_rule is None or verdict.netns is None:
            continue
        key = (verdict.firewall_rule, verdict.netns)
        owner = owners.get(key)
        if owner is None or verdict.events > dns_drops.get((verdict.firewall_rule, verdict.netns), 0):
            continue
        host = merged[owner]
        firewall = {
            "drops": verdict.events,
            "location": verdict.evidence.get("location"),
            "netfilter": verdict.evidence.get("netfilter"),
        }
        merged[owner] = msgspec.structs.replace(
            host,
            severity=min(host.severity, verdict.severity),
            evidence={**host.evidence, "firewall": firewall},
        )
        absorbed.add(index)
    return [verdict for index, verdict in enumerate(merged) if index not in absorbed]
