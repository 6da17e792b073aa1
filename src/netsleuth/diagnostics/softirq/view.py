"""`netsleuth softirq` as text: latency and duration per vector (and per CPU for NET_RX/NET_TX), NET_RX runs
against the budget, and NAPI instances - printed at the end (or on Ctrl-C)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from netsleuth.diagnostics.totals import EventTotals

if TYPE_CHECKING:
    from rich.console import Console

    from netsleuth.diagnostics.softirq.records import SoftirqSummary, VectorPart

__all__ = ["SoftirqView", "duration_text", "print_softirq_summary"]

_PER_CPU_VECTORS = ("NET_RX", "NET_TX")


def duration_text(ns: int | None) -> str:
    if ns is None:
        return "-"
    if ns < 1_000:
        return f"{ns} ns"
    if ns < 1_000_000:
        return f"{ns / 1_000:.1f} µs"
    return f"{ns / 1_000_000:.2f} ms"


def _row(stats: VectorPart) -> tuple[str, ...]:
    latency, duration = stats.latency, stats.duration
    return (
        stats.vector,
        "all" if stats.cpu is None else str(stats.cpu),
        str(stats.runs),
        duration_text(latency.p50_ns),
        duration_text(latency.p99_ns),
        duration_text(latency.max_ns),
        duration_text(duration.p50_ns),
        duration_text(duration.p99_ns),
        duration_text(duration.max_ns),
    )


def print_softirq_summary(console: Console, summary: SoftirqSummary, per_cpu: bool = False) -> None:
    """`per_cpu`: every shown vector per CPU too (--vector), not only NET_RX and NET_TX."""
    from rich.table import Table

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
    for total in summary.vectors:
        if not total.runs:
            continue
        table.add_row(*_row(total))
        if total.vector in _PER_CPU_VECTORS or per_cpu:
            for stats in summary.per_cpu:
                if stats.vector == total.vector and stats.runs:
                    table.add_row(*_row(stats))
    console.print(table)
    net_rx = summary.net_rx
    if net_rx is not None and net_rx.runs:
        console.print(
            f"NET_RX: {net_rx.runs} runs, {net_rx.polls} NAPI polls, {net_rx.packets} packets "
            f"({net_rx.packets / net_rx.runs:.1f}/run); {net_rx.budget_runs} runs stopped on netdev_budget="
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
            cpus = ", ".join(f"{cpu}:{polls}" for cpu, polls in instance.polls_by_cpu.items())
            napi.add_row(
                instance.dev or "(backlog)",
                instance.netns_name or (str(instance.netns) if instance.netns else "-"),
                str(instance.napi_id),
                str(instance.polls),
                str(instance.packets),
                f"{instance.packets / instance.polls:.1f}" if instance.polls else "-",
                str(instance.budget),
                str(instance.exhausted_polls),
                str(instance.idle_polls),
                cpus,
            )
        console.print(napi)


class SoftirqView:
    """How `softirq` reads on a terminal (the run loop's TextView): nothing while it counts, the tables at
    the end."""

    noun = "softirq runs"

    def __init__(self, per_cpu: bool) -> None:
        self._per_cpu = per_cpu

    def lines(self, records: Sequence[Any]) -> str:
        return ""

    def finish(self, summary: SoftirqSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console

        out = sys.stdout
        print_softirq_summary(Console(file=out, width=None if out.isatty() else 160), summary, self._per_cpu)

    def loss_line(self, totals: EventTotals) -> str:
        return ""
