"""`diagnose`'s softirq watch: the softirq programs for the diagnosis window, then the NET_RX budget verdict
from what each net_rx_action run really did.

The doctor's time-squeeze finding reads /proc/net/softnet_stat, whose `time_squeeze` counts runs that stopped
with work left without saying why, and infers from packets per NET_RX run whether netdev_budget (packets) or
netdev_budget_usecs (time) bound. Here every run's packets are summed from its napi:napi_poll events and its
duration measured between softirq_entry and softirq_exit, so each run that stopped is counted as stopped on
the packet budget or on time, per CPU. The verdict absorbs the doctor's finding (one cause, one verdict).
NET_RX runs are per CPU, not per namespace: the verdict is about the whole machine (no `netns`).

`diagnose_verdicts` is softirq's part of `diagnose` (its spec's DiagnoseWatch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from netsleuth.doctor.fixes import sysctl_fix
from netsleuth.spec.diagnose import Watched, WatchInputs, Window
from netsleuth.spec.verdict import Severity, Verdict

if TYPE_CHECKING:
    from netsleuth.diagnostics.softirq.records import SoftirqSummary
    from netsleuth.diagnostics.softirq.session import SoftirqDiagnostic

__all__ = ["MIN_STOPPED_RUNS_PER_S", "diagnose_verdicts", "net_rx_budget_verdicts", "open_watch"]

# The doctor's threshold for time_squeeze (netdata softnet.conf warns above 10/s).
MIN_STOPPED_RUNS_PER_S = 10.0


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.0f} µs"


def net_rx_budget_verdicts(summary: SoftirqSummary) -> list[Verdict]:
    """A verdict when NET_RX runs stopped on their budget at least MIN_STOPPED_RUNS_PER_S times a second."""
    total = summary.net_rx
    seconds = max(summary.seconds, 1e-6)
    if total is None:
        return []
    stopped = total.budget_runs + total.time_runs
    if stopped / seconds < MIN_STOPPED_RUNS_PER_S:
        return []
    cpus = [runs for runs in summary.net_rx_per_cpu if runs.budget_runs or runs.time_runs]
    packet_bound = total.budget_runs >= total.time_runs
    budget, budget_usecs = summary.netdev_budget, summary.netdev_budget_usecs
    if packet_bound:
        fix = sysctl_fix("net.core.netdev_budget", budget * 2)
        why = (
            f"{total.budget_runs} of {total.runs} NET_RX runs handled netdev_budget = {budget} packets and "
            f"stopped with more waiting ({total.time_runs} ran out of netdev_budget_usecs={budget_usecs} µs)"
        )
    else:
        fix = sysctl_fix("net.core.netdev_budget_usecs", budget_usecs * 2)
        why = (
            f"{total.time_runs} of {total.runs} NET_RX runs used up netdev_budget_usecs = {budget_usecs} µs "
            f"before netdev_budget = {budget} packets ({total.budget_runs} stopped on the packet budget): "
            "packets are expensive here, and raising netdev_budget would change nothing"
        )
    net_rx = summary.vector("NET_RX")
    evidence: dict[str, Any] = {
        "stopped_runs_per_s": round(stopped / seconds, 1),
        "budget_runs_by_cpu": {str(runs.cpu): runs.budget_runs for runs in cpus},
        "time_runs_by_cpu": {str(runs.cpu): runs.time_runs for runs in cpus},
        "packets_per_run": total.packets_per_run,
        "exhausted_napi_polls": total.exhausted_polls,
        "netdev_budget": budget,
        "netdev_budget_usecs": budget_usecs,
    }
    if net_rx is not None and net_rx.latency.count:
        evidence["net_rx_wait_p99"] = _us(net_rx.latency.p99_ns)
        evidence["net_rx_wait_max"] = _us(net_rx.latency.max_ns)
    busiest = [instance for instance in summary.napi if instance.exhausted_polls]
    if busiest:
        evidence["napi_full_polls"] = {
            (instance.dev or "backlog"): instance.exhausted_polls for instance in busiest[:5]
        }
    cpu_list = ",".join(str(runs.cpu) for runs in cpus)
    return [
        Verdict(
            category="net-rx-budget",
            severity=Severity.WARNING,
            cause=(
                f"the NET_RX softirq on CPU {cpu_list} stopped {stopped / seconds:.0f} times/s with packets "
                f"left: {why}; they wait for the next run or ksoftirqd (NET_RX wait p99 "
                f"{evidence.get('net_rx_wait_p99', '-')})"
            ),
            evidence=evidence,
            fix=(*fix.commands, *fix.persistent),
            events=stopped,
            absorbed_findings=("time-squeeze",),
            cause_code="net_rx_budget",
        )
    ]


def open_watch(inputs: WatchInputs) -> SoftirqDiagnostic:
    """The softirq programs for diagnose's window: NET_RX runs are per CPU, so they cover the host."""
    from netsleuth.diagnostics.softirq.records import SoftirqConfig
    from netsleuth.diagnostics.softirq.session import SoftirqDiagnostic

    return SoftirqDiagnostic(SoftirqConfig(), inputs.context)


def diagnose_verdicts(watched: Watched, window: Window) -> list[Verdict]:
    """softirq's part of `diagnose`: the NET_RX budget over the window, on every CPU (even under --netns)."""
    summary: SoftirqSummary = watched.summary
    return net_rx_budget_verdicts(summary)
