"""Where a NIC's queue interrupts land: all on one CPU, away from the NIC's NUMA node, and the NET_RX
softirq load that follows them.

RSS spreads flows over queues only to have every queue's IRQ served by one CPU when the affinity says so
(irqbalance#30/#93); the *effective* affinity is what counts (coreos/bugs#2135). A NIC DMAs into its own
node's memory, so IRQs served from another node pay cross-node traffic per packet
(Documentation/networking/scaling.rst, "Suggested Configuration").
"""

from __future__ import annotations

from netsleuth.doctor.cpuset import format_cpu_list
from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import Fix, combine, file_fix
from netsleuth.doctor.model import Snapshot
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.topology import rx_queue_irqs
from netsleuth.doctor.window import Window

__all__ = ["RULES", "nic_queue_irqs"]

MIN_NET_RX_PER_S = 1000.0  # below this the softirq load is too small for skew to matter
SKEW_FACTOR = 2.0  # one CPU doing more than twice its fair share
_IRQBALANCE_NOTE = (
    "irqbalance rewrites smp_affinity: stop it (systemctl disable --now irqbalance) or ban these IRQs "
    "(IRQBALANCE_ARGS=--banirq=N in /etc/default/irqbalance), then re-apply the affinity at boot"
)


def nic_queue_irqs(snapshot: Snapshot) -> dict[str, list[int]]:
    """Receive queue IRQs per physical device (virtual devices have none)."""
    mapping: dict[str, list[int]] = {}
    for name, device in snapshot.devices.items():
        if not device.is_physical:
            continue
        irqs = rx_queue_irqs(name, device, snapshot.ethtool.get(name), snapshot.interrupts)
        if irqs:
            mapping[name] = irqs
    return mapping


def _spread_fix(irqs: list[int], cpus: tuple[int, ...]) -> Fix:
    fixes = [
        file_fix(f"/proc/irq/{irq}/smp_affinity_list", str(cpus[position % len(cpus)]), _IRQBALANCE_NOTE)
        for position, irq in enumerate(irqs)
    ]
    merged = combine(*fixes)
    # The irqbalance note is the same for every IRQ: say it once.
    return Fix(commands=merged.commands, persistent=(_IRQBALANCE_NOTE,), actions=merged.actions)


def _candidate_cpus(snapshot: Snapshot, name: str) -> tuple[int, ...]:
    device = snapshot.devices[name]
    local = (
        tuple(cpu for cpu in device.local_cpus if cpu in snapshot.cpus)
        if snapshot.cpus
        else device.local_cpus
    )
    return local or snapshot.cpus


def _effective_cpus(snapshot: Snapshot, irqs: list[int]) -> dict[int, tuple[int, ...]]:
    return {irq: snapshot.irq_affinity[irq].effective for irq in irqs if irq in snapshot.irq_affinity}


def check_irq_pileup(window: Window) -> Verdict:
    snapshot = window.after
    findings: list[Finding] = []
    for name, irqs in nic_queue_irqs(snapshot).items():
        effective = _effective_cpus(snapshot, irqs)
        if len(effective) < 2:
            continue
        serving = {cpu for cpus in effective.values() for cpu in cpus}
        candidates = _candidate_cpus(snapshot, name)
        if len(serving) != 1 or len(candidates) < 2:
            continue
        cpu = next(iter(serving))
        counts = [window.irq_deltas(irq) for irq in irqs]
        interrupts_per_s = window.per_second(sum(sum(per_cpu) for per_cpu in counts))
        fix = _spread_fix(sorted(effective), candidates)
        findings.append(
            Finding(
                id=f"irq-pileup:{name}",
                severity=Severity.WARNING,
                subject=f"{name} IRQs {format_cpu_list(effective)} on CPU {cpu}",
                title=f"{name}: all {len(effective)} queue interrupts are served by CPU {cpu}",
                evidence={
                    "queue_irqs": sorted(effective),
                    "effective_cpu": cpu,
                    "interrupts_per_s": round(interrupts_per_s, 1),
                    "cpus_available": format_cpu_list(candidates),
                },
                explanation=(
                    f"{name} spreads flows over {len(effective)} queues (RSS), but every queue's interrupt "
                    "goes to "
                    f"CPU {cpu}, so that one CPU runs all receive processing while the others idle; it "
                    "becomes the "
                    f"bottleneck (time_squeeze, ring drops). Giving each queue its own CPU "
                    f"({format_cpu_list(candidates)}) restores the parallelism RSS was meant to give."
                ),
                fix_commands=fix.commands,
                persistent=fix.persistent,
                actions=fix.actions,
            )
        )
    return findings, "IRQ spread: no NIC has all its queue interrupts on one CPU"


def check_irq_numa(window: Window) -> Verdict:
    snapshot = window.after
    findings: list[Finding] = []
    for name, irqs in nic_queue_irqs(snapshot).items():
        device = snapshot.devices[name]
        if device.numa_node is None or not device.local_cpus:
            continue
        local = set(device.local_cpus)
        if snapshot.cpus and set(snapshot.cpus) <= local:
            continue  # a single-node machine: every CPU is local
        remote = {
            irq: cpus for irq, cpus in _effective_cpus(snapshot, irqs).items() if not set(cpus) <= local
        }
        if not remote:
            continue
        candidates = _candidate_cpus(snapshot, name)
        fix = _spread_fix(sorted(remote), candidates)
        findings.append(
            Finding(
                id=f"irq-numa:{name}",
                severity=Severity.WARNING,
                subject=f"{name} IRQs {format_cpu_list(remote)}",
                title=f"{name}: {len(remote)} queue IRQs served off the NIC's NUMA node {device.numa_node}",
                evidence={
                    "numa_node": device.numa_node,
                    "local_cpus": format_cpu_list(device.local_cpus),
                    "remote_irqs": {str(irq): format_cpu_list(cpus) for irq, cpus in remote.items()},
                },
                explanation=(
                    f"{name} sits on NUMA node {device.numa_node} (local CPUs "
                    f"{format_cpu_list(device.local_cpus)}) "
                    f"but these queue interrupts run on other nodes' CPUs, so every packet crosses the "
                    f"interconnect. Pin them to local CPUs."
                ),
                fix_commands=fix.commands,
                persistent=fix.persistent,
                actions=fix.actions,
            )
        )
    return findings, "IRQ locality: NIC queue interrupts run on their NIC's NUMA node"


def check_softirq_skew(window: Window) -> Verdict:
    deltas = window.softirq_deltas("NET_RX")
    online = [cpu for cpu in (window.after.cpus or tuple(range(len(deltas)))) if cpu < len(deltas)]
    if len(online) < 2:
        return [], ""
    total = sum(deltas[cpu] for cpu in online)
    if window.per_second(total) < MIN_NET_RX_PER_S:
        return [], "NET_RX softirq: load too light to judge its spread"
    fair = total / len(online)
    busiest = max(online, key=lambda cpu: deltas[cpu])
    if deltas[busiest] <= SKEW_FACTOR * fair:
        return [], "NET_RX softirq: spread evenly enough over CPUs"
    share = deltas[busiest] / total
    single_queue = [
        name
        for name, device in window.after.devices.items()
        if device.is_physical and len(device.rps_cpus) == 1 and window.link_rate(name, "rx_packets") > 0
    ]
    hint = (
        f"single-queue NICs {', '.join(single_queue)} can spread with RPS (see the rps finding)"
        if single_queue
        else "spread the NIC queue IRQs over CPUs (see the IRQ findings) or enable RPS"
    )
    finding = Finding(
        id=f"softirq-skew:cpu{busiest}",
        severity=Severity.WARNING,
        subject=f"CPU {busiest}",
        title=f"CPU {busiest} runs {share:.0%} of all NET_RX softirqs",
        evidence={
            "net_rx_per_s_by_cpu": {str(cpu): round(window.per_second(deltas[cpu]), 1) for cpu in online},
            "busiest_share": round(share, 3),
        },
        explanation=(
            f"Receive processing is concentrated on CPU {busiest}, which does {share:.0%} of the NET_RX work "
            "of "
            f"{len(online)} CPUs; it saturates first while the others have room. To spread it: {hint}."
        ),
    )
    return [finding], ""


RULES = [
    Rule("irq-pileup", check_irq_pileup),
    Rule("irq-numa", check_irq_numa),
    Rule("softirq-skew", check_softirq_skew),
]
