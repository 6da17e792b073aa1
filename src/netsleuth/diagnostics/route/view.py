"""`netsleuth route` as text: a line per lookup, neighbour event or drop; the decision table at the end."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from netsleuth.diagnostics.route.records import NeighRecord, RouteDropRecord, RouteLookupRecord
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.packet import endpoint_text

if TYPE_CHECKING:
    from rich.console import Console

    from netsleuth.diagnostics.route.records import RouteGroup, RouteRecord, RouteSummary

__all__ = ["RouteView", "print_route_summary", "route_line", "route_lines", "totals_line"]


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when)) + f".{int(when * 1e6) % 1_000_000:06d}"


def _where(netns_name: str | None, netns: int) -> str:
    return f"netns {netns_name or netns}"


def lookup_text(record: RouteLookupRecord) -> str:
    """`udp 198.18.3.1:40818 > 198.18.5.9:9999  BLACKHOLE  table 100  route blackhole ...  rule ...`"""
    if record.dport:
        flow = f"{endpoint_text(record.src, record.sport)} > {endpoint_text(record.dst, record.dport)}"
    else:
        flow = f"{record.src} > {record.dst}"
    if record.proto:
        flow = f"{record.proto} {flow}"
    if record.iif and record.iif != "lo":
        flow += f" iif {record.iif}"
    if record.mark:
        flow += f" mark 0x{record.mark:x}"
    parts = [flow, record.result.upper(), f"table {record.table_name}"]
    if record.route:
        parts.append(f"route {record.route}")
    elif not record.err and (record.gateway or record.dev):
        hop = [f"via {record.gateway}"] if record.gateway else []
        hop += [f"dev {record.dev}"] if record.dev else []
        parts.append(" ".join(hop))
    if record.rule:
        parts.append(f"rule {record.rule}")
    return "  ".join(parts)


def neigh_text(record: NeighRecord) -> str:
    return f"neighbour {record.address} dev {record.dev}: {record.event.upper()} ({record.state})"


def drop_text(record: RouteDropRecord) -> str:
    return f"DROPPED {record.reason} {record.src} > {record.dst} dev {record.dev}"


def route_line(record: RouteRecord) -> str:
    if isinstance(record, NeighRecord):
        text = neigh_text(record)
    elif isinstance(record, RouteDropRecord):
        text = drop_text(record)
    else:
        owner = f"  {record.comm}[{record.pid}]" if record.pid else "  kernel"
        text = lookup_text(record) + owner
    return f"{_clock(record.time)}  {text}  {_where(record.netns_name, record.netns)}"


def route_lines(records: Sequence[RouteRecord]) -> str:
    return "".join(route_line(record) + "\n" for record in records)


def _group_text(group: RouteGroup) -> str:
    example = group.example
    if isinstance(example, NeighRecord):
        return neigh_text(example)
    if isinstance(example, RouteDropRecord):
        return drop_text(example)
    return lookup_text(example)


def print_route_summary(console: Console, summary: RouteSummary) -> None:
    from rich.table import Table

    table = Table(title="Route decisions and next hops")
    for column in ("count", "kind", "netns", "decision"):
        table.add_column(column, justify="right" if column == "count" else "left")
    for group in summary.groups:
        example = group.example
        table.add_row(
            str(group.count), group.kind, _where(example.netns_name, example.netns), _group_text(group)
        )
    console.print(table)
    console.print(totals_line(summary))


def totals_line(summary: RouteSummary) -> str:
    kinds = summary.by_kind
    return (
        f"{kinds['lookup'].total} lookups, {kinds['miss'].total} table misses, "
        f"{kinds['neigh'].total} neighbour events, {kinds['drop'].total} drops; {summary.lost} lost"
    )


class RouteView:
    """How `route` reads on a terminal (the run loop's TextView)."""

    noun = "route events"

    def lines(self, records: Sequence[RouteRecord]) -> str:
        return route_lines(records)

    def finish(self, summary: RouteSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console

        out = sys.stdout
        if show_groups:
            print_route_summary(Console(file=out, width=None if out.isatty() else 200), summary)
        else:
            out.write(totals_line(summary) + "\n")

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.sampled} route events not printed (sampled), {totals.lost} lost"
