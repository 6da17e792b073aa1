"""The NET_RX budget judged from what net_rx_action did in the window, measured in the kernel
(napi_measure.py): each run that stopped is counted as stopped on netdev_budget (it handled that many
packets) or on netdev_budget_usecs (it ran that long), per CPU, and each device's NAPI polls that used
their whole weight are counted. So the fix follows from the budget that really ran out, where the
softnet_stat rule (softnet.py) can only infer it from packets per run.

When one CPU does (nearly) all the stopped runs, a bigger budget only makes that CPU work longer per run:
the explanation then says how to spread the device's receive work (RPS, more queues), with the command in
the device's namespace.
"""

from __future__ import annotations

from typing import Any

from netsleuth.doctor.cpuset import format_cpu_mask
from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import sysctl_fix
from netsleuth.doctor.napi_measure import BACKLOG, DeviceNapi, NapiMeasurement
from netsleuth.doctor.rules.rule import Verdict
from netsleuth.doctor.window import Window
from netsleuth.netns_command import in_netns

__all__ = ["ONE_CPU_SHARE", "check_measured"]

# One CPU with this share of the stopped runs "does it all": spreading helps more than a bigger budget.
ONE_CPU_SHARE = 0.9
_SHOWN_DEVICES = 5


def _placement(device: DeviceNapi, window: Window) -> tuple[bool, str | None]:
    """(a command can be printed, the namespace it must run in) for a command about `device`."""
    if device.in_measured_netns:
        return True, window.after.netns
    if device.in_own_netns:
        return True, None
    return device.netns_name is not None, device.netns_name


def _spread_advice(device: DeviceNapi, cpu: int, window: Window) -> str:
    """How to move `device`'s receive work off `cpu`: more hardware queues, or RPS on its one queue."""
    placeable, netns = _placement(device, window)
    sysfs = window.after.devices.get(device.dev) if device.in_measured_netns else None
    channels = window.after.ethtool.get(device.dev)
    channels_record = channels.channels if channels is not None and device.in_measured_netns else None
    cpus = window.after.cpus
    if channels_record is not None and channels_record.max_rx_queues > channels_record.rx_queues:
        wanted = min(channels_record.max_rx_queues, len(cpus))
        setting = "combined" if channels_record.max_combined else "rx"
        command = in_netns(f"ethtool -L {device.dev} {setting} {wanted}", netns)
        return f"give {device.label} more RX queues ({command}) so its interrupts and polls spread over CPUs"
    if sysfs is not None and sysfs.rps_cpus and any(sysfs.rps_cpus.values()):
        return (
            f"RPS is on for {device.label}, yet CPU {cpu} runs its polls: the poll itself (driver, GRO) is "
            "the cost; spread it with more queues where the device has them"
        )
    if not placeable:
        return (
            f"spread {device.label}'s protocol work with RPS (its namespace has no `ip netns` name to print "
            "the command with)"
        )
    mask = format_cpu_mask(cpus) if cpus else "f"
    command = in_netns(f"echo {mask} > /sys/class/net/{device.dev}/queues/rx-0/rps_cpus", netns)
    return (
        f"spread {device.label}'s protocol work over the other CPUs with RPS ({command}; "
        "Documentation/networking/scaling.rst)"
    )


def _device_sentence(devices: list[DeviceNapi]) -> str:
    if not devices:
        return "No NAPI poll used its whole weight: the runs stopped on the total, not on one device."
    parts = [
        f"{device.label} {device.exhausted_polls} of {device.polls} polls (weight {device.weight})"
        for device in devices[:_SHOWN_DEVICES]
    ]
    return "Polls that used their whole weight, so the device had more waiting: " + "; ".join(parts) + "."


def _one_cpu(napi: NapiMeasurement, window: Window) -> int | None:
    """The CPU that does (nearly) all the stopped runs, when spreading is possible (two or more CPUs)."""
    stopped = napi.stopped
    if len(window.after.cpus) < 2 or not stopped:
        return None
    busiest = max(napi.cpus, key=lambda cpu: cpu.stopped)
    return busiest.cpu if busiest.stopped / stopped >= ONE_CPU_SHARE else None


def check_measured(window: Window, napi: NapiMeasurement, min_per_s: float) -> Verdict:
    seconds = max(napi.seconds, 1e-6)
    rate = napi.stopped / seconds
    method = f"measured with BPF over {napi.seconds:.1f} s (irq:softirq_entry/exit, napi:napi_poll)"
    if rate < min_per_s:
        return [], (
            f"NET_RX budget: {napi.runs} NET_RX runs, {napi.budget_runs} stopped on netdev_budget and "
            f"{napi.time_runs} on netdev_budget_usecs ({method})"
        )
    budget, budget_usecs = napi.netdev_budget, napi.netdev_budget_usecs
    cpus = [cpu for cpu in napi.cpus if cpu.stopped]
    cpu_list = ",".join(str(cpu.cpu) for cpu in cpus)
    runs = sum(cpu.runs for cpu in cpus)
    packets = sum(cpu.packets for cpu in cpus)
    full = [device for device in napi.devices if device.exhausted_polls]
    packet_bound = napi.budget_runs >= napi.time_runs
    evidence: dict[str, Any] = {
        "method": "measured",
        "measured_seconds": round(napi.seconds, 2),
        "budget_ran_out": "packets" if packet_bound else "time",
        "stopped_runs_per_s": round(rate, 1),
        "net_rx_runs_by_cpu": {str(cpu.cpu): cpu.runs for cpu in cpus},
        "budget_runs_by_cpu": {str(cpu.cpu): cpu.budget_runs for cpu in cpus},
        "time_runs_by_cpu": {str(cpu.cpu): cpu.time_runs for cpu in cpus},
        "packets_per_net_rx_run": round(packets / runs, 1) if runs else None,
        "exhausted_polls_by_device": {device.label: device.exhausted_polls for device in full},
        "polls_by_device": {
            device.label: device.polls for device in napi.devices[:_SHOWN_DEVICES] if device.polls
        },
        "netdev_budget": budget,
        "netdev_budget_usecs": budget_usecs,
        # The kernel's own count of stopped runs (softnet_stat), read at the same moments: it must match
        # budget_runs + time_runs, which is what makes the split above trustworthy.
        "kernel_time_squeeze_by_cpu": {str(cpu.cpu): cpu.time_squeeze for cpu in cpus},
    }
    if packet_bound:
        fix = sysctl_fix("net.core.netdev_budget", budget * 2)
        limit = (
            f"on CPU {cpu_list}, {napi.budget_runs} of {runs} NET_RX runs stopped after handling "
            f"netdev_budget = {budget} packets ({napi.time_runs} ran out of netdev_budget_usecs = "
            f"{budget_usecs} µs first). The packet budget ran out: doubling netdev_budget lets each run "
            "drain more before yielding the CPU."
        )
    else:
        fix = sysctl_fix("net.core.netdev_budget_usecs", budget_usecs * 2)
        limit = (
            f"on CPU {cpu_list}, {napi.time_runs} of {runs} NET_RX runs used up netdev_budget_usecs = "
            f"{budget_usecs} µs before netdev_budget = {budget} packets ({napi.budget_runs} stopped on the "
            "packet budget). The time limit ran out, so raising netdev_budget would change nothing: packets "
            "are expensive here (firewall rules, XDP, tunnels); give each run more time, or make packets "
            "cheaper."
        )
    spread = ""
    hot = _one_cpu(napi, window)
    if hot is not None:
        hot_devices = [
            device
            for device in (full or list(napi.devices))
            if device.dev != BACKLOG and device.busiest_cpu_share()[0] == hot and device.packets
        ]
        evidence["one_cpu"] = hot
        advice = "; ".join(_spread_advice(device, hot, window) for device in hot_devices[:2])
        spread = (
            f" CPU {hot} does {max(cpu.stopped for cpu in napi.cpus)} of the {napi.stopped} stopped runs: a "
            "bigger budget only keeps that one CPU busy longer" + (f"; {advice}." if advice else ".")
        )
    finding = Finding(
        id="time-squeeze",
        severity=Severity.WARNING,
        subject=f"CPU {cpu_list}",
        title=f"NET_RX softirq out of budget {rate:.1f} times/s (measured over {napi.seconds:.1f} s)",
        evidence=evidence,
        explanation=(
            f"Measured with BPF over {napi.seconds:.1f} s (irq:softirq_entry/exit, napi:napi_poll), not "
            f"inferred: {limit} Packets left over wait for the next softirq run or "
            f"ksoftirqd, which adds latency and leads to ring and backlog drops under load. "
            f"{_device_sentence(full)}{spread}"
        ),
        fix_commands=fix.commands,
        persistent=fix.persistent,
        actions=fix.actions,
    )
    return [finding], ""
