"""The rules: each module checks one theme on a `Window` (two snapshots) and returns findings, or the line
for the report's "all good" list when it has nothing to say.
"""

from __future__ import annotations

from netsleuth.doctor.findings import Finding, Report
from netsleuth.doctor.fixes import placed_in
from netsleuth.doctor.rules import (
    coalesce,
    conntrack,
    drops,
    interrupts,
    mtu,
    offloads,
    queues,
    ring,
    rpfilter,
    sockets,
    softnet,
)
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window

__all__ = ["RULES", "Rule", "Verdict", "diagnose"]

RULES: list[Rule] = [
    *ring.RULES,
    *drops.RULES,
    *softnet.RULES,
    *interrupts.RULES,
    *queues.RULES,
    *coalesce.RULES,
    *offloads.RULES,
    *mtu.RULES,
    *sockets.RULES,
    *conntrack.RULES,
    *rpfilter.RULES,
]


def diagnose(window: Window, rules: list[Rule] | None = None) -> Report:
    if rules is None:
        rules = RULES
    findings: list[Finding] = []
    all_good: list[str] = []
    for rule in rules:
        rule_findings, good = rule.check(window)
        # Rules write commands as typed in the namespace measured; printed, they must carry it.
        findings.extend(placed_in(finding, window.after.netns) for finding in rule_findings)
        if not rule_findings and good:
            all_good.append(good)
    findings.sort(key=lambda finding: (finding.severity, finding.id))
    napi = window.napi
    notes: tuple[str, ...] = ()
    if napi is not None:
        notes = (f"NET_RX runs and NAPI polls measured with BPF ({napi.attach}) over {napi.seconds:.1f} s",)
    elif window.napi_problem:
        notes = (f"NET_RX budget inferred from softnet_stat, not measured: {window.napi_problem}",)
    return Report(
        interval=window.seconds,
        findings=tuple(findings),
        all_good=tuple(all_good),
        notes=notes,
        napi_measurement=napi.to_json() if napi is not None else None,
        napi_not_measured=window.napi_problem if napi is None else None,
    )
