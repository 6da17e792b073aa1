"""`conn` as text: each connection's timeline and its verdict, then how many connections ended how."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from netsleuth.diagnostics.conn.records import ConnRecord, ConnSummary
from netsleuth.diagnostics.tcp.view import clock_text
from netsleuth.diagnostics.totals import EventTotals

__all__ = ["ConnView", "conn_block"]


def conn_block(record: ConnRecord, timeline: bool = True) -> str:
    """A connection's timeline, oldest first, then its verdict."""
    sides = [f"client netns {record.client_netns}"] if record.client_netns else []
    if record.server_netns:
        sides.append(f"server netns {record.server_netns}")
    head = f"connection {record.client} → {record.server}"
    if sides:
        head += f" ({', '.join(sides)})"
    lines = [head]
    if timeline:
        for entry in record.timeline:
            lines.append(f"  {clock_text(entry.time)}  {entry.netns:<12}  {entry.event:<17}  {entry.text}")
    lines.append(f"  verdict: {record.verdict}")
    return "\n".join(lines)


class ConnView:
    noun = "events"

    def __init__(self, timeline: bool) -> None:
        self._timeline = timeline

    def lines(self, records: Sequence[Any]) -> str:
        return "".join(
            conn_block(record, timeline=self._timeline) + "\n"
            for record in records
            if isinstance(record, ConnRecord)
        )

    def finish(self, summary: ConnSummary, totals: EventTotals, show_groups: bool) -> None:
        outcomes = sorted(summary.outcomes.items(), key=lambda item: -item[1])
        text = ", ".join(f"{count} {outcome}" for outcome, count in outcomes)
        total = sum(summary.outcomes.values())
        sys.stdout.write(
            f"{total} connection{'s' if total != 1 else ''}" + (f": {text}" if text else "") + "\n"
        )

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.lost} events lost and {totals.sampled} sampled away: timelines may be incomplete"
