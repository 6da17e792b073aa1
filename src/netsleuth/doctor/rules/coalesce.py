"""Interrupt coalescing (`ethtool -c`): how long a NIC waits to batch packets into one interrupt.

With coalescing off (rx-usecs 0, rx-frames ≤ 1, no adaptive mode) a NIC under load raises one interrupt per
packet and the CPU drowns in interrupt overhead (seed 004; Documentation/networking/ethtool-netlink.rst,
COALESCE_GET). Very long delays trade latency for nothing at low rates.
"""

from __future__ import annotations

from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import coalesce_fix
from netsleuth.doctor.rules.interrupts import nic_queue_irqs
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window

__all__ = ["RULES"]

MIN_IRQ_PER_S_PER_QUEUE = 10_000.0  # netutils-linux colours per-CPU IRQ rates from 40k; 10k/queue is busy
SUGGESTED_RX_USECS = 50  # the ixgbe/i40e static default region; latency-sensitive hosts may want less
HIGH_RX_USECS = 500


def check_coalescing(window: Window) -> Verdict:
    findings: list[Finding] = []
    queue_irqs = nic_queue_irqs(window.after)
    for name, record in window.after.ethtool.items():
        coalesce = record.coalesce
        if coalesce is None:
            continue
        usecs = coalesce.get("rx_coalesce_usecs", 0)
        frames = coalesce.get("rx_max_coalesced_frames", 0)
        adaptive = coalesce.get("use_adaptive_rx_coalesce", 0)
        irqs = queue_irqs.get(name, [])
        irq_rate = window.per_second(sum(sum(window.irq_deltas(irq)) for irq in irqs))
        per_queue = irq_rate / len(irqs) if irqs else 0.0
        evidence = {"rx-usecs": usecs, "rx-frames": frames, "adaptive-rx": "on" if adaptive else "off"}
        if usecs == 0 and frames <= 1 and not adaptive and per_queue >= MIN_IRQ_PER_S_PER_QUEUE:
            fix = coalesce_fix(name, "rx_coalesce_usecs", SUGGESTED_RX_USECS)
            findings.append(
                Finding(
                    id=f"coalesce-off:{name}",
                    severity=Severity.WARNING,
                    subject=name,
                    title=f"{name}: no RX interrupt coalescing at {per_queue:.0f} interrupts/s per queue",
                    evidence={**evidence, "interrupts_per_s_per_queue": round(per_queue, 1)},
                    explanation=(
                        f"{name} raises an interrupt for every received packet; at this rate the CPUs spend "
                        "their "
                        f"time entering and leaving interrupt handlers. Waiting {SUGGESTED_RX_USECS} µs "
                        "batches "
                        f"packets per interrupt (NAPI then polls them together) at a small latency cost."
                    ),
                    fix_commands=fix.commands,
                    persistent=fix.persistent,
                    actions=fix.actions,
                )
            )
        elif usecs >= HIGH_RX_USECS and not adaptive:
            findings.append(
                Finding(
                    id=f"coalesce-high:{name}",
                    severity=Severity.INFO,
                    subject=name,
                    title=f"{name}: RX interrupts delayed by {usecs} µs",
                    evidence=evidence,
                    explanation=(
                        f"{name} holds received packets up to {usecs} µs before interrupting. That adds that "
                        "much "
                        "latency to every quiet-time packet; fine for bulk transfer, bad for "
                        "request/response."
                    ),
                )
            )
    return findings, "coalescing: no NIC takes an interrupt per packet under load"


RULES = [Rule("coalescing", check_coalescing)]
