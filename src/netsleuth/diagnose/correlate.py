"""Doctor's findings and the kernel's drop verdicts on one timeline: one cause, one verdict.

A drop verdict names the doctor findings it explains (`Verdict.absorbed`): CPU_BACKLOG drops and softnet's
rising `dropped` on the same window are one problem, not two. Their evidence is merged into the drop
verdict; the findings left over become verdicts of their own.
"""

from __future__ import annotations

import dataclasses

from netsleuth.diagnose.verdicts import Verdict
from netsleuth.doctor.findings import Finding

__all__ = ["PATH_CAUSE_CODES", "finding_verdict", "merge_findings"]


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


def finding_verdict(finding: Finding) -> Verdict:
    """A doctor finding as a verdict: its title and explanation are the cause, its commands the fix."""
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
        absorbed=(finding.id,),
        cause_code=finding.cause_code or PATH_CAUSE_CODES[_rule_of(finding)],
    )


def merge_findings(drop_verdicts: list[Verdict], findings: tuple[Finding, ...]) -> list[Verdict]:
    merged: list[Verdict] = []
    claimed: set[str] = set()
    for verdict in drop_verdicts:
        explained = [finding for finding in findings if _rule_of(finding) in verdict.absorbed]
        if explained:
            claimed.update(finding.id for finding in explained)
            verdict = dataclasses.replace(
                verdict,
                evidence={**verdict.evidence, "path_health": [finding.to_json() for finding in explained]},
                severity=min(verdict.severity, *(finding.severity for finding in explained)),
                absorbed=tuple(finding.id for finding in explained),
            )
        else:
            verdict = dataclasses.replace(verdict, absorbed=())
        merged.append(verdict)
    merged.extend(finding_verdict(finding) for finding in findings if finding.id not in claimed)
    return merged
