"""Text rendering of the tcp family: resets, the `tcp` subcommands and `conn` timelines."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence

from rich.console import Console
from rich.table import Table

from netsleuth.diagnostics.conn import ConnReport
from netsleuth.diagnostics.drops_enrich import Owner
from netsleuth.diagnostics.resets import AbortRecord, ResetGroup, ResetRecord
from netsleuth.diagnostics.tcp_context import endpoint_text
from netsleuth.diagnostics.tcp_session import KindTotals
from netsleuth.packet import tcp_flags_text

__all__ = [
    "abort_line",
    "clock_text",
    "conn_block",
    "kind_totals_line",
    "owner_label",
    "print_reset_summary",
    "reset_line",
]


def clock_text(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime("%H:%M:%S.%f")


def owner_label(owner: Owner) -> str:
    if owner.pid is None:
        return "kernel"
    text = f"{owner.comm}[{owner.pid}]"
    if owner.container:
        text += f" container {owner.container}"
    return text


def _netns(netns: int, name: str | None) -> str:
    return f"netns {name}" if name else f"netns {netns}"


def reset_line(record: ResetRecord) -> str:
    arrow = "->" if record.direction == "sent" else "<-"
    what = "RST sent" if record.direction == "sent" else "RST received"
    if record.by_firewall:
        what = "RST sent by firewall"
    parts = [
        clock_text(record.time),
        what,
        f"{record.local} {arrow} {record.remote}",
        f"state {record.state or 'no socket'}",
    ]
    if record.reason is not None:
        parts.append(f"reason {record.reason}")
    if record.trigger is not None:
        trigger = record.trigger
        inferred = " (inferred)" if record.trigger_inferred else ""
        parts.append(
            f"after [{tcp_flags_text(trigger.flags)}] seq {trigger.seq} ack {trigger.ack} len "
            f"{trigger.length}"
            f"{inferred}"
        )
    parts.append(_netns(record.netns, record.netns_name))
    parts.append(owner_label(record.owner))
    line = "  ".join(parts)
    line += f"\n    cause: {record.cause.text}"
    if record.peer_cause:
        line += f"\n    peer's side: {record.peer_cause}"
    line += f"\n    check: {record.cause.check}"
    if record.stack:
        line += "".join(f"\n    {frame}" for frame in record.stack)
    return line


def abort_line(record: AbortRecord) -> str:
    parts = [
        clock_text(record.time),
        "aborted without RST",
        f"{record.local} -> {record.remote}",
        f"state {record.state or '?'}",
        _netns(record.netns, record.netns_name),
        owner_label(record.owner),
    ]
    return "  ".join(parts) + f"\n    cause: {record.cause.text}\n    check: {record.cause.check}"


def kind_totals_line(label: str, totals: KindTotals, singular: str | None = None) -> str:
    """`3 resets received`; `singular` is the label for a count of exactly one."""
    text = f"{totals.matched} {singular if totals.matched == 1 and singular else label}"
    if totals.sampled:
        text += f", {totals.sampled} not printed (sampled under load; counts stay exact)"
    if totals.lost:
        text += f", {totals.lost} lost"
    if totals.ungrouped:
        text += f", {totals.ungrouped} beyond the group table (counted in the total)"
    return text


def print_reset_summary(
    console: Console, groups: Sequence[ResetGroup], totals: Mapping[str, KindTotals]
) -> None:
    table = Table(title="Resets by direction, state, reason and local end", title_justify="left")
    for column, justify in (
        ("count", "right"),
        ("direction", "left"),
        ("state", "left"),
        ("reason", "left"),
        ("local", "left"),
        ("netns", "left"),
        ("cause (example)", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for group in sorted(groups, key=lambda g: g.count, reverse=True):
        example = group.example
        if isinstance(example, ResetRecord):
            direction = "firewall" if example.by_firewall else example.direction
            reason = example.reason or "-"
        else:
            direction, reason = "abort", example.cause.code
        table.add_row(
            str(group.count),
            direction,
            example.state or "no socket",
            reason,
            example.local,
            example.netns_name or str(example.netns),
            example.cause.text,
        )
    if groups:
        console.print(table)
    for label, kind_totals in totals.items():
        console.print(kind_totals_line(label, kind_totals, label.replace("resets", "reset", 1)))


def conn_block(report: ConnReport, netns_name: Callable[[int], str | None], timeline: bool = True) -> str:
    """A connection's timeline, oldest first, then its verdict."""
    conn = report.connection

    def netns(inode: int) -> str:
        return f"netns {netns_name(inode) or inode}"

    sides = [f"client {netns(conn.client_netns)}"] if conn.client_netns else []
    if conn.server_netns:
        sides.append(f"server {netns(conn.server_netns)}")
    head = f"connection {endpoint_text(*conn.client)} → {endpoint_text(*conn.server)}"
    if sides:
        head += f" ({', '.join(sides)})"
    lines = [head]
    if timeline:
        for entry in sorted(conn.entries, key=lambda e: e.time):
            lines.append(f"  {clock_text(entry.time)}  {entry.netns:<12}  {entry.event:<17}  {entry.text}")
    lines.append(f"  verdict: {report.verdict}")
    return "\n".join(lines)
