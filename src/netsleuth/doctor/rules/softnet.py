"""The per-CPU receive backlog and the NET_RX budget, from /proc/net/softnet_stat.

Column 2 (dropped) counts packets refused because the CPU's input_pkt_queue held netdev_max_backlog packets
(enqueue_to_backlog, net/core/dev.c). Column 3 (time_squeeze) counts net_rx_action runs that stopped with
work left because either netdev_budget packets or netdev_budget_usecs microseconds were used up
(Documentation/admin-guide/sysctl/net.rst). Raising netdev_budget does nothing when the time limit is the
one that binds (netdata#1076, #4624), so the rule says which one does.

When doctor could measure the window with BPF (napi_measure.py), the time-squeeze rule judges what
net_rx_action really did (net_rx_measured.py): which budget each stopped run ran out of, per CPU, and
which devices' polls were full. Otherwise (no root or BTF, --no-bpf, a recorded root) it infers from
softnet_stat as below and says so.
"""

from __future__ import annotations

from netsleuth.diagnostics.causes import cause
from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import sysctl_fix
from netsleuth.doctor.rules.net_rx_measured import check_measured
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window

__all__ = ["RULES"]

MIN_BACKLOG_DROPS = 5
# netdata softnet.conf warns above 10 squeezes/s; the RH tuning guide: "small increments are normal".
MIN_SQUEEZES_PER_S = 10.0
DEFAULT_BACKLOG = 1000
DEFAULT_BUDGET = 300
DEFAULT_BUDGET_USECS = 2000


def check_backlog_drops(window: Window) -> Verdict:
    deltas = [row for row in window.softnet_deltas() if row.dropped > 0]
    total = sum(row.dropped for row in deltas)
    if total < MIN_BACKLOG_DROPS:
        return [], "softnet backlog: no CPU dropped packets from a full input queue"
    backlog = window.after.sysctl_int("net.core.netdev_max_backlog") or DEFAULT_BACKLOG
    target = backlog * 2
    fix = sysctl_fix("net.core.netdev_max_backlog", target)
    finding = Finding(
        id="backlog-drops",
        severity=Severity.CRITICAL,
        subject="CPU " + ",".join(str(row.cpu) for row in deltas),
        title=f"per-CPU backlog full: {window.per_second(total):.1f} packets/s dropped",
        evidence={
            "dropped_per_s_by_cpu": {
                str(row.cpu): round(window.per_second(row.dropped), 1) for row in deltas
            },
            "netdev_max_backlog": backlog,
            "flow_limit_per_s": round(window.per_second(sum(row.flow_limit_count for row in deltas)), 1),
        },
        explanation=cause("cpu_backlog").explain(backlog=backlog),
        fix_commands=fix.commands,
        persistent=fix.persistent,
        actions=fix.actions,
        cause_code="cpu_backlog",
    )
    return [finding], ""


def _packets_per_run(window: Window, cpus: list[int], processed: int) -> float | None:
    net_rx = window.softirq_deltas("NET_RX")
    runs = sum(net_rx[cpu] for cpu in cpus if cpu < len(net_rx))
    return processed / runs if runs else None


def _not_measured(window: Window) -> str:
    if window.napi_problem:
        return f"BPF not used: {window.napi_problem}"
    return "not measured in this window"


def check_time_squeeze(window: Window) -> Verdict:
    if window.napi is not None:
        return check_measured(window, window.napi, MIN_SQUEEZES_PER_S)
    return check_inferred(window)


def check_inferred(window: Window) -> Verdict:
    deltas = [row for row in window.softnet_deltas() if row.time_squeeze > 0]
    total = sum(row.time_squeeze for row in deltas)
    rate = window.per_second(total)
    if rate < MIN_SQUEEZES_PER_S:
        return [], "NET_RX budget: softirq processing finished its work (time_squeeze flat)"
    budget = window.after.sysctl_int("net.core.netdev_budget") or DEFAULT_BUDGET
    budget_usecs = window.after.sysctl_int("net.core.netdev_budget_usecs") or DEFAULT_BUDGET_USECS
    processed = sum(row.processed for row in deltas)
    per_run = _packets_per_run(window, [row.cpu for row in deltas], processed)
    # A run that stops on the packet budget has handled about `budget` packets; one that stops on time has
    # handled fewer. Averaged over all runs of the squeezing CPUs this is a lower bound, hence the half.
    packet_budget_binds = per_run is None or per_run >= budget / 2
    evidence: dict[str, object] = {
        "method": "inferred",
        "time_squeeze_per_s_by_cpu": {
            str(row.cpu): round(window.per_second(row.time_squeeze), 1) for row in deltas
        },
        "netdev_budget": budget,
        "netdev_budget_usecs": budget_usecs,
        "packets_per_s": round(window.per_second(processed), 1),
    }
    if per_run is not None:
        evidence["packets_per_net_rx_run"] = round(per_run, 1)
    if packet_budget_binds:
        fix = sysctl_fix("net.core.netdev_budget", budget * 2)
        limit = (
            f"The packet budget binds: runs handle about {per_run:.0f} packets against netdev_budget = "
            f"{budget}."
            if per_run is not None
            else f"netdev_budget = {budget} is the likely limit."
        )
        advice = "Doubling netdev_budget lets each run drain more before yielding the CPU."
    else:
        fix = sysctl_fix("net.core.netdev_budget_usecs", budget_usecs * 2)
        limit = (
            f"The time limit binds: runs stop after only ~{per_run:.0f} packets, far below netdev_budget = "
            f"{budget}, "
            f"so they ran out of netdev_budget_usecs = {budget_usecs} µs. Raising netdev_budget would change "
            "nothing."
        )
        advice = (
            "Packets are expensive here (firewall rules, XDP, tunnels): more time per run, or less work "
            "per packet."
        )
    finding = Finding(
        id="time-squeeze",
        severity=Severity.WARNING,
        subject="CPU " + ",".join(str(row.cpu) for row in deltas),
        title=f"NET_RX softirq out of budget {rate:.1f} times/s (inferred from time_squeeze)",
        evidence=evidence,
        explanation=(
            "net_rx_action stopped with packets still waiting (time_squeeze); they wait for the next "
            "softirq run "
            f"or ksoftirqd, which adds latency and leads to ring and backlog drops under load. {limit} "
            f"{advice} Inferred from /proc/net/softnet_stat, whose time_squeeze does not say which budget "
            f"ran out ({_not_measured(window)}; as root on a kernel with BTF doctor measures it)."
        ),
        fix_commands=fix.commands,
        persistent=fix.persistent,
        actions=fix.actions,
    )
    return [finding], ""


RULES = [Rule("backlog-drops", check_backlog_drops), Rule("time-squeeze", check_time_squeeze)]
