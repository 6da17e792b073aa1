"""Queue count against CPUs, and RPS/XPS where the hardware cannot spread load itself.

Documentation/networking/scaling.rst: RSS needs as many queues as CPUs that should take interrupts; on a
single-queue NIC RPS does the spreading in software ("RPS ... for single queue devices"), but on a NIC
with a queue per CPU it only adds inter-processor interrupts. XPS maps each TX queue to the CPUs that use
it, so a CPU sends on "its" queue without lock contention.
"""

from __future__ import annotations

from netsleuth.doctor.cpuset import format_cpu_list, format_cpu_mask
from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import channels_fix, combine, file_fix
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window

__all__ = ["RULES"]

MIN_RX_PPS_FOR_RPS = 1000.0  # RPS is worth its IPIs only with real receive load
_RPS_PERSIST = "write the mask from a udev rule or the unit that brings {dev} up (sysfs does not persist)"


def check_queue_count(window: Window) -> Verdict:
    findings: list[Finding] = []
    cpu_count = len(window.after.cpus)
    for name, record in window.after.ethtool.items():
        device = window.after.devices.get(name)
        channels = record.channels
        if device is None or not device.is_physical or channels is None or cpu_count < 2:
            continue
        current, maximum = channels.rx_queues, channels.max_rx_queues
        wanted = min(maximum, cpu_count)
        if current >= wanted or maximum <= 1:
            continue
        setting = "combined_count" if channels.max_combined else "rx_count"
        fix = channels_fix(name, setting, wanted)
        findings.append(
            Finding(
                id=f"queues-vs-cpus:{name}",
                severity=Severity.WARNING if current == 1 else Severity.INFO,
                subject=name,
                title=f"{name}: {current} RX queue(s) for {cpu_count} CPUs (hardware allows {maximum})",
                evidence={"rx_queues": current, "max_rx_queues": maximum, "online_cpus": cpu_count},
                explanation=(
                    f"Each RX queue has its own interrupt and can be served by its own CPU. {name} uses "
                    f"{current} "
                    f"of {maximum} possible queues on a {cpu_count}-CPU host, so at most {current} CPU(s) "
                    "share "
                    f"receive work in hardware. Changing channels briefly resets the link on most drivers."
                ),
                fix_commands=fix.commands,
                persistent=fix.persistent,
                actions=fix.actions,
            )
        )
    return findings, "queue count: every multi-queue NIC uses as many queues as it can use CPUs"


def check_rps(window: Window) -> Verdict:
    findings: list[Finding] = []
    snapshot = window.after
    cpu_count = len(snapshot.cpus)
    for name, device in snapshot.devices.items():
        if not device.is_physical or not device.rps_cpus or cpu_count < 2:
            continue
        rx_queues = len(device.rps_cpus)
        any_rps = {queue: cpus for queue, cpus in device.rps_cpus.items() if cpus}
        rx_pps = window.link_rate(name, "rx_packets")
        if rx_queues == 1 and not any_rps and rx_pps >= MIN_RX_PPS_FOR_RPS:
            cpus = tuple(cpu for cpu in device.local_cpus if cpu in snapshot.cpus) or snapshot.cpus
            mask = format_cpu_mask(cpus)
            path = f"/sys/class/net/{name}/queues/rx-0/rps_cpus"
            fix = file_fix(path, mask, _RPS_PERSIST.format(dev=name))
            findings.append(
                Finding(
                    id=f"rps-single-queue:{name}",
                    severity=Severity.WARNING,
                    subject=name,
                    title=f"{name}: single RX queue at {rx_pps:.0f} packets/s and RPS off",
                    evidence={"rx_queues": 1, "rx_packets_per_s": round(rx_pps, 1), "rps_cpus": "0"},
                    explanation=(
                        f"{name} has one RX queue, so one CPU takes its interrupt and, without RPS, all its "
                        f"protocol processing. RPS hashes flows to CPUs {format_cpu_list(cpus)} in software "
                        f"(Documentation/networking/scaling.rst), spreading that load."
                    ),
                    fix_commands=fix.commands,
                    persistent=fix.persistent,
                    actions=fix.actions,
                )
            )
        elif rx_queues >= cpu_count and any_rps:
            fixes = [
                file_fix(f"/sys/class/net/{name}/queues/{queue}/rps_cpus", "0", _RPS_PERSIST.format(dev=name))
                for queue in sorted(any_rps)
            ]
            fix = combine(*fixes)
            findings.append(
                Finding(
                    id=f"rps-on-multiqueue:{name}",
                    severity=Severity.INFO,
                    subject=name,
                    title=f"{name}: RPS enabled although it has a queue per CPU",
                    evidence={
                        "rx_queues": rx_queues,
                        "online_cpus": cpu_count,
                        "queues_with_rps": sorted(any_rps),
                    },
                    explanation=(
                        f"{name} already spreads flows over {rx_queues} hardware queues; RPS on top "
                        "re-steers "
                        f"packets to other CPUs with an inter-processor interrupt each, for no gain."
                    ),
                    fix_commands=fix.commands,
                    persistent=fix.persistent[:1],
                    actions=fix.actions,
                )
            )
    return findings, "RPS: used where it helps (single-queue NICs under load), absent where it does not"


def check_xps(window: Window) -> Verdict:
    findings: list[Finding] = []
    snapshot = window.after
    for name, device in snapshot.devices.items():
        tx_queues = sorted(device.xps_cpus, key=lambda queue: int(queue.split("-")[1]))
        if not device.is_physical or len(tx_queues) < 2 or len(snapshot.cpus) < 2:
            continue
        if any(device.xps_cpus[queue] for queue in tx_queues):
            continue
        cpus = snapshot.cpus
        fixes = [
            file_fix(
                f"/sys/class/net/{name}/queues/{queue}/xps_cpus",
                format_cpu_mask(cpus[position :: len(tx_queues)] or (cpus[position % len(cpus)],)),
                _RPS_PERSIST.format(dev=name),
            )
            for position, queue in enumerate(tx_queues)
        ]
        fix = combine(*fixes)
        findings.append(
            Finding(
                id=f"xps-off:{name}",
                severity=Severity.INFO,
                subject=name,
                title=f"{name}: {len(tx_queues)} TX queues and no XPS map",
                evidence={"tx_queues": len(tx_queues)},
                explanation=(
                    f"Without XPS the kernel picks {name}'s TX queue by flow hash, so CPUs contend for the "
                    "same "
                    f"queue locks and completions land on other CPUs' caches. Mapping each queue to its CPUs "
                    f"keeps transmit work local (scaling.rst, 'XPS')."
                ),
                fix_commands=fix.commands,
                persistent=fix.persistent[:1],
                actions=fix.actions,
            )
        )
    return findings, "XPS: multi-queue NICs have a transmit queue map"


RULES = [Rule("queues", check_queue_count), Rule("rps", check_rps), Rule("xps", check_xps)]
