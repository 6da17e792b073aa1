"""`netsleuth tcp life | states | retrans | connlat | queues`: TCP's own events, live or summarized, with the
socket's owner and namespace. One BPF object (bpf/tcp.bpf.c) serves them all; each subcommand loads only the
programs its events need."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from netsleuth.commands import Command
from netsleuth.commands._runloop import add_run_arguments, run_session
from netsleuth.diagnostics.attribution import owner_text
from netsleuth.diagnostics.filters import add_filter_arguments
from netsleuth.diagnostics.tcp_context import endpoint_text
from netsleuth.diagnostics.tcp_diagnostics import (
    DIAGNOSTICS,
    TCP_HELP,
    TcpEventsDiagnostic,
    TcpEventsSummary,
)
from netsleuth.diagnostics.tcp_events import (
    ConnectRecord,
    LifeRecord,
    QueueRecord,
    RetransRecord,
    StateRecord,
    TcpGroupRecord,
    TcpRecord,
    describe,
)
from netsleuth.diagnostics.tcp_names import errno_name
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.render.tcp_text import clock_text, kind_totals_line

__all__ = ["COMMAND"]

_NOUNS = {
    "life": ("connection", "connections"),
    "states": ("state change", "state changes"),
    "retrans": ("retransmit", "retransmits"),
    "connlat": ("connect", "connects"),
    "queues": ("queue drop", "queue drops"),
}
_COLUMNS = {
    "life": ["count", "process", "peer or service", "netns", "mean s", "bytes_acked", "bytes_received"],
    "states": ["count", "transition", "netns", "mean s in previous"],
    "connlat": ["count", "process", "destination", "netns", "result", "mean ms", "max ms"],
    "retrans": ["count", "segments", "kind", "state", "flow", "netns", "owner"],
    "queues": ["count", "what", "reason", "socket", "netns", "owner"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subparsers = parser.add_subparsers(dest="tcp_command", metavar="SUBCOMMAND", parser_class=type(parser))
    subparsers.required = True
    for name, text in TCP_HELP.items():
        sub = subparsers.add_parser(name, help=text, description=text)
        add_run_arguments(sub, "count in the kernel; print a table at the end")
        add_filter_arguments(sub)


def _group_row(group: TcpGroupRecord) -> list[str]:
    example = group.example
    raw = example.raw
    local, remote = endpoint_text(raw.laddr, raw.lport), endpoint_text(raw.raddr, raw.rport)
    who = owner_text(example.owner)
    netns = example.netns_name or str(raw.netns)
    count = str(group.count)
    if isinstance(example, LifeRecord):
        where = local if raw.side == "server" else remote
        return [
            count,
            who,
            where,
            netns,
            f"{group.mean_duration_s:.3g}",
            str(group.bytes_acked),
            str(group.bytes_received),
        ]
    if isinstance(example, StateRecord):
        # A socket's first state has no measured predecessor (the sum stays 0): nothing to average.
        mean = f"{group.mean_previous_state_s:.3g}" if group.sum1 else "-"
        return [count, f"{example.old_state} -> {example.new_state}", netns, mean]
    if isinstance(example, ConnectRecord):
        result = (errno_name(example.error) if example.error else None) or "ok"
        mean, top = f"{group.mean_latency_ms:.3g}", f"{group.max_latency_ms:.3g}"
        return [count, who, remote, netns, result, mean, top]
    if isinstance(example, RetransRecord):
        return [count, str(group.segs), example.kind, str(example.state), f"{local} -> {remote}", netns, who]
    assert isinstance(example, QueueRecord)
    return [count, example.what, example.reason or "-", local, netns, who]


class TcpView:
    def __init__(self, subcommand: str) -> None:
        out = sys.stdout
        self._console = Console(file=out, width=None if out.isatty() else 200)
        self._name = subcommand
        self._singular, self.noun = _NOUNS[subcommand]

    def lines(self, records: Sequence[TcpRecord]) -> str:
        return "".join(f"{clock_text(record.time)}  {describe(record)}\n" for record in records)

    def finish(self, summary: TcpEventsSummary, totals: EventTotals, show_groups: bool) -> None:
        if summary.groups and show_groups:
            table = Table(title=f"tcp {self._name}", title_justify="left")
            for column in _COLUMNS[self._name]:
                right = column in ("count", "segments", "mean s", "max ms", "mean ms")
                table.add_column(column, justify="right" if right else "left")
            for group in summary.groups:
                table.add_row(*_group_row(group))
            self._console.print(table)
        if summary.netstat:
            grown = {key: value for key, value in summary.netstat.items() if value}
            self._console.print(
                "TcpExt counters during the trace: "
                + (", ".join(f"{key} +{value}" for key, value in grown.items()) or "no change")
            )
        sys.stdout.write(kind_totals_line(self.noun, totals, self._singular) + "\n")
        if self._name == "retrans" and show_groups:
            sys.stdout.write(f"{summary.segments} retransmitted segments (TcpRetransSegs counts segments)\n")

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.sampled} not printed (sampled), {totals.lost} lost"


def run(args: argparse.Namespace) -> int:
    name = args.tcp_command
    config = DIAGNOSTICS[f"tcp.{name}"].config_from_args(args)
    session = TcpEventsDiagnostic(config)
    return run_session(
        session, config.run_options, TcpView(name), json_lines=args.json, ready_file=args.ready_file
    )


COMMAND = Command(
    name="tcp",
    help="TCP's own events: life, states, retrans, connlat, queues",
    add_arguments=add_arguments,
    run=run,
)
