"""`drops` as text: one readable line per drop, and the table of groups at the end (the run loop's
TextView). rich loads when the table is printed, the last thing a run does."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from msgspec import UNSET

from netsleuth.diagnostics.drops.records import DropGroup, DropRecord, DropsSummary
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.packet import endpoint_text

if TYPE_CHECKING:
    from rich.console import Console

    from netsleuth.spec.parts import PodRef

__all__ = ["DropsView", "drop_line", "endpoints", "print_summary", "totals_line"]


def endpoints(record: DropRecord) -> str:
    """`tcp 198.18.0.1:41234 > 198.18.0.2:80 [SYN]`, `icmp 198.18.0.1 > 198.18.0.2 type 8/0`, ..."""
    if record.family == 0:
        return "non-IP"
    text = (
        f"{record.proto} {endpoint_text(record.saddr, record.sport)} > "
        f"{endpoint_text(record.daddr, record.dport)}"
    )
    if record.tcp_flags is not UNSET:
        text += f" [{record.tcp_flags}]"
    if record.icmp_type is not UNSET:
        text += f" type {record.icmp_type}/{record.icmp_code}"
    return text


def _owner_text(record: DropRecord) -> str:
    if record.pid is None:
        return "kernel"
    text = f"{record.comm}[{record.pid}]"
    if record.owner == "socket":
        text += " (socket owner)"
    if record.container_name:
        text += f" container {record.container_name} {record.container}"
    elif record.container:
        text += f" container {record.container}"
    return text


def _pod_text(pod: PodRef) -> str:
    return f"{pod.namespace}/{pod.name}"


def _netns_text(netns: int, name: str | None, pod: PodRef | None) -> str:
    text = f"netns {name}" if name else f"netns {netns}"
    return f"pod {_pod_text(pod)}  {text}" if pod is not None else text


def _reason_text(reason: str, inferred: object) -> str:
    return reason + " (inferred)" if inferred is True else reason


def drop_line(record: DropRecord) -> str:
    clock = datetime.datetime.fromtimestamp(record.time).strftime("%H:%M:%S.%f")
    parts = [
        clock,
        _reason_text(record.reason, record.reason_inferred),
        endpoints(record),
        f"len {record.length}",
        f"at {record.location}",
    ]
    if record.ifname:
        parts.append(f"dev {record.ifname}")
    parts.append(_netns_text(record.netns, record.netns_name, record.pod or None))
    parts.append(_owner_text(record))
    if record.sk_state:
        parts.append(f"state {record.sk_state}")
    line = "  ".join(parts)
    if record.netfilter:
        netfilter = record.netfilter
        rule = netfilter.get("rule")
        where = "/".join(str(netfilter[key]) for key in ("table", "chain") if netfilter.get(key))
        line += f"\n    firewall: hook {netfilter.get('hook') or '?'}"
        line += f" {where}: {rule}" if rule else " (rule not identified)"
    if record.source:
        line += "".join(f"\n    {frame}" for frame in record.source)
    if record.stack:
        line += "".join(f"\n    {frame}" for frame in record.stack)
    return line


def totals_line(totals: EventTotals) -> str:
    text = f"{totals.matched} drops"
    if totals.sampled:
        text += f", {totals.sampled} not printed (sampled under load; counts stay exact)"
    text += f", {totals.lost} lost"
    if totals.ungrouped:
        text += f", {totals.ungrouped} beyond the group table (counted in the total)"
    return text


def print_summary(console: Console, groups: Sequence[DropGroup], totals: EventTotals) -> None:
    from rich.table import Table

    table = Table(title="Drops by reason and location", title_justify="left", show_lines=False)
    table.add_column("count", justify="right")
    table.add_column("reason")
    table.add_column("location")
    table.add_column("netns")
    table.add_column("example")
    for group in sorted(groups, key=lambda g: g.count, reverse=True):
        example = group.example
        detail = f"{endpoints(example)} {_owner_text(example)}"
        if example.rule:
            detail += f"  rule: {example.rule}"
        table.add_row(
            str(group.count),
            _reason_text(group.reason, group.reason_inferred),
            group.location,
            f"pod {_pod_text(group.pod)}" if group.pod else group.netns_name or str(group.netns),
            detail,
        )
    if groups:
        console.print(table)
    console.print(totals_line(totals))


class DropsView:
    """How `drops` reads on a terminal (the run loop's TextView)."""

    noun = "drops"

    def lines(self, records: Sequence[DropRecord]) -> str:
        return "".join(drop_line(record) + "\n" for record in records)

    def finish(self, summary: DropsSummary, totals: EventTotals, show_groups: bool) -> None:
        if show_groups:
            from rich.console import Console

            out = sys.stdout
            # Off a terminal rich would wrap tables at 80 columns; a log file is better read unwrapped.
            print_summary(Console(file=out, width=None if out.isatty() else 200), summary.groups, totals)
        else:
            sys.stdout.write(totals_line(totals) + "\n")

    def loss_line(self, totals: EventTotals) -> str:
        return totals_line(totals)
