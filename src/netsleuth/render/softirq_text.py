"""`netsleuth softirq` as text: latency and duration per vector (and per CPU for NET_RX/NET_TX), NET_RX runs
against the budget, and NAPI instances."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from netsleuth.diagnostics.softirq import SoftirqSummary, VectorStats

__all__ = ["duration_text", "print_softirq_summary"]

_PER_CPU_VECTORS = ("NET_RX", "NET_TX")


def duration_text(ns: int | None) -> str:
    if ns is None:
        return "-"
    if ns < 1_000:
        return f"{ns} ns"
    if ns < 1_000_000:
        return f"{ns / 1_000:.1f} µs"
    return f"{ns / 1_000_000:.2f} ms"


def _row(stats: VectorStats) -> tuple[str, ...]:
    latency, duration = stats.latency, stats.duration
    return (
        stats.name,
        "all" if stats.cpu is None else str(stats.cpu),
        str(stats.runs),
        duration_text(latency.percentile(0.5)),
        duration_text(latency.percentile(0.99)),
        duration_text(stats.latency_max_ns if latency.count else None),
        duration_text(duration.percentile(0.5)),
        duration_text(duration.percentile(0.99)),
        duration_text(stats.duration_max_ns if duration.count else None),
    )


def print_softirq_summary(console: Console, summary: SoftirqSummary) -> None:
    table = Table(title=f"Softirqs over {summary.seconds:.1f} s (percentiles: upper edge of a log2 bucket)")
    for column in (
        "vector",
        "cpu",
        "runs",
        "wait p50",
        "wait p99",
        "wait max",
        "run p50",
        "run p99",
        "run max",
    ):
        table.add_column(column, justify="left" if column == "vector" else "right")
    names = list(dict.fromkeys(stats.name for stats in summary.vectors))
    for name in names:
        if summary.shown and name not in summary.shown:
            continue
        total = summary.vector_total(name)
        if total is None or not total.runs:
            continue
        table.add_row(*_row(total))
        if name in _PER_CPU_VECTORS or summary.shown:
            for stats in summary.vectors:
                if stats.name == name and stats.runs:
                    table.add_row(*_row(stats))
    console.print(table)
    net_rx = summary.net_rx_total
    if net_rx is not None and net_rx.runs:
        console.print(
            f"NET_RX: {net_rx.runs} runs, {net_rx.polls} NAPI polls, {net_rx.work} packets "
            f"({net_rx.work / net_rx.runs:.1f}/run); {net_rx.budget_runs} runs stopped on netdev_budget="
            f"{summary.netdev_budget} packets, {net_rx.time_runs} on netdev_budget_usecs="
            f"{summary.netdev_budget_usecs}; {net_rx.exhausted_polls} polls used their whole NAPI budget"
        )
    if summary.napi:
        napi = Table(title="NAPI polls (napi:napi_poll)")
        for column in (
            "dev",
            "netns",
            "napi id",
            "polls",
            "packets",
            "per poll",
            "budget",
            "full",
            "idle",
            "cpus",
        ):
            napi.add_column(column, justify="left" if column in ("dev", "netns", "cpus") else "right")
        for instance in summary.napi:
            cpus = ", ".join(f"{cpu}:{polls}" for cpu, polls in sorted(instance.polls_by_cpu.items()))
            napi.add_row(
                instance.dev or "(backlog)",
                instance.netns_name or (str(instance.netns) if instance.netns else "-"),
                str(instance.napi_id),
                str(instance.polls),
                str(instance.work),
                f"{instance.work / instance.polls:.1f}" if instance.polls else "-",
                str(instance.budget),
                str(instance.exhausted),
                str(instance.idle),
                cpus,
            )
        console.print(napi)
