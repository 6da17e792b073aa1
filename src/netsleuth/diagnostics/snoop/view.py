"""`netsleuth snoop` as text: execsnoop/opensnoop-style lines, and the groups table at the end."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from netsleuth.diagnostics.snoop.records import ExecRecord, ExitRecord, OpenRecord
from netsleuth.diagnostics.totals import EventTotals

if TYPE_CHECKING:
    from rich.console import Console

    from netsleuth.diagnostics.snoop.records import SnoopGroup, SnoopRecord, SnoopSummary

__all__ = ["SnoopView", "print_snoop_summary", "snoop_line", "snoop_lines", "snoop_totals_line"]


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when)) + f".{int(when * 1e6) % 1_000_000:06d}"


def _where(record: SnoopRecord) -> str:
    parts = [f"netns {record.netns_name or record.netns}"]
    if record.container:
        parts.append(f"container {record.container}")
    return "  ".join(parts)


def _body(record: SnoopRecord) -> str:
    if isinstance(record, ExecRecord):
        command = shlex.join(record.args) + (" ..." if record.args_truncated else "")
        result = record.error or "ok"
        who = f"{record.comm}[{record.pid}] ppid {record.ppid} uid {record.uid}"
        return f"EXEC {result:<7} {who}  {record.path}  {command}"
    if isinstance(record, ExitRecord):
        how = f"signal {record.signal}" if record.signal else f"code {record.exit_code}"
        return f"EXIT {how:<7} {record.comm}[{record.pid}] after {record.runtime_ms:.1f} ms"
    assert isinstance(record, OpenRecord)
    result = record.error or f"fd {record.fd}"
    return f"OPEN {result:<7} {record.comm}[{record.pid}]  {record.path}  {record.flags}"


def snoop_line(record: SnoopRecord) -> str:
    return f"{_clock(record.time)}  {_body(record)}  {_where(record)}"


def snoop_lines(records: Sequence[SnoopRecord]) -> str:
    return "".join(snoop_line(record) + "\n" for record in records)


def _group_row(group: SnoopGroup) -> tuple[str, str, str, str, str]:
    example = group.example
    if isinstance(example, ExitRecord):
        result = f"signal {example.signal}" if example.signal else f"exit {example.exit_code}"
        what = ""
    elif isinstance(example, ExecRecord):
        result, what = example.error or "ok", example.path
    else:
        result, what = example.error or "ok", example.path
    return str(group.count), group.kind, example.comm, result, what


def print_snoop_summary(console: Console, summary: SnoopSummary) -> None:
    from rich.table import Table

    mode = summary.diagnostic.removeprefix("snoop.")
    table = Table(title=f"snoop {mode}: by process name, path and result")
    for column in ("count", "kind", "comm", "result", "path"):
        table.add_column(column, justify="right" if column == "count" else "left")
    for group in summary.groups:
        table.add_row(*_group_row(group))
    console.print(table)
    console.print(snoop_totals_line(summary))


def snoop_totals_line(summary: SnoopSummary) -> str:
    parts = [f"{totals.total} {kind}s" for kind, totals in summary.by_kind.items()]
    return f"{', '.join(parts)}; {summary.lost} lost"


class SnoopView:
    """How `snoop` reads on a terminal (the run loop's TextView)."""

    def __init__(self, mode: str) -> None:
        self.noun = "execs" if mode == "exec" else "opens"

    def lines(self, records: Sequence[SnoopRecord]) -> str:
        return snoop_lines(records)

    def finish(self, summary: SnoopSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console

        out = sys.stdout
        if show_groups:
            print_snoop_summary(Console(file=out, width=None if out.isatty() else 200), summary)
        else:
            out.write(snoop_totals_line(summary) + "\n")

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.sampled} {self.noun} not printed (sampled), {totals.lost} lost"
