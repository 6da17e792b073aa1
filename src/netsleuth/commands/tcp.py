"""`netsleuth tcp life | states | retrans | connlat | queues`: TCP's own events, live or summarized, with the
socket's owner and namespace. One BPF object (bpf/tcp.bpf.c) serves them all; each subcommand loads only the
programs its events need."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from netsleuth.commands import Command
from netsleuth.commands._runloop import (
    POLL_MS,
    Progress,
    StopSignals,
    add_run_arguments,
    check_run_arguments,
    run_until_stopped,
    write_ready_file,
)
from netsleuth.commands.resets import tcp_only_filter
from netsleuth.diagnostics.filters import add_filter_arguments
from netsleuth.diagnostics.tcp_context import TcpContext, endpoint_text, owner_text
from netsleuth.diagnostics.tcp_events import (
    SUBCOMMAND_KINDS,
    NetstatReader,
    TcpEventEnricher,
    TcpGroupRecord,
    describe,
)
from netsleuth.diagnostics.tcp_session import KindTotals, RawTcpEvent, TcpSession, TcpSessionConfig
from netsleuth.kernel.reasons import load_drop_reasons
from netsleuth.render.jsonl import JsonLinesWriter
from netsleuth.render.tcp_text import clock_text, kind_totals_line

__all__ = ["COMMAND"]

_HELP = {
    "life": "each connection's life when it closes: process, endpoints, duration, bytes (like tcplife)",
    "states": "every TCP state change with the time spent in the previous state (like tcpstates)",
    "retrans": "retransmits: SYN, SYN-ACK, tail loss probe, timeout, fast; per-flow counts (like tcpretrans)",
    "connlat": "connect latency per process and destination, and failed connects with errno (like "
    "tcpconnlat)",
    "queues": "accept-queue overflows, receive-buffer and memory drops, SYN-queue counters, with owners",
}
_NOUNS = {
    "life": ("connection", "connections"),
    "states": ("state change", "state changes"),
    "retrans": ("retransmit", "retransmits"),
    "connlat": ("connect", "connects"),
    "queues": ("queue drop", "queue drops"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subparsers = parser.add_subparsers(dest="tcp_command", metavar="SUBCOMMAND", parser_class=type(parser))
    subparsers.required = True
    for name, text in _HELP.items():
        sub = subparsers.add_parser(name, help=text, description=text)
        add_run_arguments(sub, "count in the kernel; print a table at the end")
        add_filter_arguments(sub)


def _group_row(name: str, group: TcpGroupRecord) -> list[str]:
    example = group.example
    raw = example.raw
    local, remote = endpoint_text(raw.laddr, raw.lport), endpoint_text(raw.raddr, raw.rport)
    who = owner_text(example.owner)
    netns = example.netns_name or str(raw.netns)
    data = group.to_json()
    if name == "life":
        where = local if raw.side == "server" else remote
        return [
            str(group.count),
            who,
            where,
            netns,
            f"{data['mean_duration_s']:.3g}",
            str(data["bytes_acked"]),
            str(data["bytes_received"]),
        ]
    if name == "states":
        state_record = example.to_json()
        return [
            str(group.count),
            f"{state_record['old_state']} -> {state_record['new_state']}",
            netns,
            # A socket's first state has no measured predecessor (the sum stays 0): nothing to average.
            f"{data['mean_previous_state_s']:.3g}" if group.sum1 else "-",
        ]
    if name == "connlat":
        json = example.to_json()
        result = json["errno"] or "ok"
        return [
            str(group.count),
            who,
            remote,
            netns,
            result,
            f"{data['mean_latency_ms']:.3g}",
            f"{data['max_latency_ms']:.3g}",
        ]
    if name == "retrans":
        json = example.to_json()
        return [str(group.count), json["kind"], str(json["state"]), f"{local} -> {remote}", netns, who]
    json = example.to_json()
    return [str(group.count), json["what"], json["reason"] or "-", local, netns, who]


_COLUMNS = {
    "life": ["count", "process", "peer or service", "netns", "mean s", "bytes_acked", "bytes_received"],
    "states": ["count", "transition", "netns", "mean s in previous"],
    "connlat": ["count", "process", "destination", "netns", "result", "mean ms", "max ms"],
    "retrans": ["count", "kind", "state", "flow", "netns", "owner"],
    "queues": ["count", "what", "reason", "socket", "netns", "owner"],
}


def _print_table(console: Console, name: str, groups: list[TcpGroupRecord]) -> None:
    table = Table(title=f"tcp {name}", title_justify="left")
    for column in _COLUMNS[name]:
        table.add_column(
            column, justify="right" if column in ("count", "mean s", "max ms", "mean ms") else "left"
        )
    for group in sorted(groups, key=lambda g: g.count, reverse=True):
        table.add_row(*_group_row(name, group))
    console.print(table)


def run(args: argparse.Namespace) -> int:
    check_run_arguments(args)
    name = args.tcp_command
    packet_filter = tcp_only_filter(args)
    kinds = SUBCOMMAND_KINDS[name]
    out = sys.stdout
    console = Console(file=out, width=None if out.isatty() else 200)
    writer = JsonLinesWriter(out) if args.json else None
    progress = Progress(sys.stderr, _NOUNS[name][1])
    context = TcpContext()
    reasons = load_drop_reasons() if name == "queues" else None
    enricher = TcpEventEnricher(context, reasons)
    session_config = TcpSessionConfig(
        packet_filter,
        emit=frozenset() if args.summary else kinds,
        group=kinds,
        sample_every=args.sample,
        group_flows=name == "retrans",
    )
    netstat = NetstatReader(None)
    with contextlib.ExitStack() as stack:
        session = stack.enter_context(TcpSession(session_config, reasons))
        session.start()
        context.prepare()
        if name == "queues":
            netstat = NetstatReader(
                context.netns_names.path_of(packet_filter.netns) if packet_filter.netns else None
            )
            netstat.start()
        write_ready_file(args.ready_file, session.attach_kind)

        def emit(raws: list[RawTcpEvent]) -> None:
            records = [record for raw in raws if (record := enricher.enrich(raw)) is not None]
            if not records:
                return
            progress.clear()
            if writer is not None:
                writer.write_many(record.to_json() for record in records)
            else:
                out.write("".join(f"{clock_text(record.time)}  {describe(record)}\n" for record in records))
            out.flush()

        def step(timeout_ms: int) -> None:
            emit(session.poll(timeout_ms))
            totals = [session.totals().get(kind, KindTotals()) for kind in kinds]
            progress.update(
                sum(t.matched for t in totals),
                sum(t.emitted for t in totals),
                sum(t.sampled for t in totals),
                sum(t.lost for t in totals),
            )

        with StopSignals() as signals:
            run_until_stopped(step, args.duration, signals, POLL_MS)
            emit(session.drain())
            progress.clear()
            interrupted = signals.stopped
        all_totals = session.totals()
        totals = sum((all_totals.get(kind, KindTotals()) for kind in kinds), KindTotals())
        groups = [group for raw in session.groups(kinds) if (group := enricher.enrich_group(raw)) is not None]
        counters = netstat.growth() if name == "queues" else {}
        if writer is not None:
            summary: dict[str, Any] = {
                "type": "summary",
                "subcommand": name,
                **totals.to_json(),
                "attach": session.attach_kind,
                "interrupted": interrupted,
                "groups": [group.to_json() for group in sorted(groups, key=lambda g: -g.count)],
            }
            if name == "queues":
                summary["netstat"] = counters
            writer.write(summary)
            writer.flush()
        else:
            if groups and (args.summary or interrupted or args.duration):
                _print_table(console, name, groups)
            if counters:
                grown = {key: value for key, value in counters.items() if value}
                console.print(
                    "TcpExt counters during the trace: "
                    + (", ".join(f"{key} +{value}" for key, value in grown.items()) or "no change")
                )
            singular, plural = _NOUNS[name]
            out.write(kind_totals_line(plural, totals, singular) + "\n")
        if not args.summary and (totals.lost or totals.sampled):
            sys.stderr.write(f"netsleuth: {totals.sampled} not printed (sampled), {totals.lost} lost\n")
    return 0


COMMAND = Command(
    name="tcp",
    help="TCP's own events: life, states, retrans, connlat, queues",
    add_arguments=add_arguments,
    run=run,
)
