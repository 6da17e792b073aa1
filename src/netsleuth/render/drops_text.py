"""Text rendering of drops: one readable line per drop, and the summary table."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from netsleuth.diagnostics.drops import DropTotals
from netsleuth.diagnostics.drops_enrich import DropGroup, DropRecord
from netsleuth.kernel.pods import Pod
from netsleuth.packet import PacketTuple, endpoint_text, tcp_flags_text

__all__ = ["drop_line", "endpoints", "print_summary", "totals_line"]


def endpoints(packet: PacketTuple) -> str:
    """`tcp 198.18.0.1:41234 > 198.18.0.2:80 [SYN]`, `icmp 198.18.0.1 > 198.18.0.2 type 8/0`, ..."""
    if packet.family == 0:
        return "non-IP"
    text = (
        f"{packet.proto_name} {endpoint_text(packet.saddr, packet.sport)} > "
        f"{endpoint_text(packet.daddr, packet.dport)}"
    )
    if packet.tcp_flags is not None:
        text += f" [{tcp_flags_text(packet.tcp_flags)}]"
    if packet.icmp_type is not None:
        text += f" type {packet.icmp_type}/{packet.icmp_code}"
    return text


def _owner_text(record: DropRecord) -> str:
    owner = record.owner
    if owner.pid is None:
        return "kernel"
    text = f"{owner.comm}[{owner.pid}]"
    if owner.source == "socket":
        text += " (socket owner)"
    if owner.container_name:
        text += f" container {owner.container_name} {owner.container}"
    elif owner.container:
        text += f" container {owner.container}"
    return text


def _netns_text(netns: int, name: str | None, pod: Pod | None = None) -> str:
    text = f"netns {name}" if name else f"netns {netns}"
    return f"pod {pod.ref}  {text}" if pod is not None else text


def drop_line(record: DropRecord) -> str:
    clock = datetime.datetime.fromtimestamp(record.time).strftime("%H:%M:%S.%f")
    parts = [
        clock,
        record.reason + " (inferred)" if record.reason_inferred else record.reason,
        endpoints(record.packet),
        f"len {record.packet.length}",
        f"at {record.location}",
    ]
    if record.ifname:
        parts.append(f"dev {record.ifname}")
    parts.append(_netns_text(record.netns, record.netns_name, record.pod))
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
        line += "".join(f"\n    {frame.text()}" for frame in record.source)
    if record.stack:
        line += "".join(f"\n    {frame}" for frame in record.stack)
    return line


def totals_line(totals: DropTotals) -> str:
    text = f"{totals.matched} drops"
    if totals.sampled:
        text += f", {totals.sampled} not printed (sampled under load; counts stay exact)"
    text += f", {totals.lost} lost"
    if totals.ungrouped:
        text += f", {totals.ungrouped} beyond the group table (counted in the total)"
    return text


def print_summary(console: Console, groups: Sequence[DropGroup], totals: DropTotals) -> None:
    table = Table(title="Drops by reason and location", title_justify="left", show_lines=False)
    table.add_column("count", justify="right")
    table.add_column("reason")
    table.add_column("location")
    table.add_column("netns")
    table.add_column("example")
    for group in sorted(groups, key=lambda g: g.count, reverse=True):
        example = group.example
        detail = f"{endpoints(example.packet)} {_owner_text(example)}"
        if example.netfilter and example.netfilter.get("rule"):
            detail += f"  rule: {example.netfilter['rule']}"
        table.add_row(
            str(group.count),
            group.reason + " (inferred)" if group.reason_inferred else group.reason,
            group.location,
            f"pod {group.pod.ref}" if group.pod is not None else group.netns_name or str(group.netns),
            detail,
        )
    if groups:
        console.print(table)
    console.print(totals_line(totals))
