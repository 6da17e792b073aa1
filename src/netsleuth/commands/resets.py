"""`netsleuth resets`: every TCP reset sent or received, with the socket state, the segment that triggered it,
the kernel's reason, the owner, and a plain-words cause with the check to run next."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from rich.console import Console

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
from netsleuth.diagnostics.filters import PacketFilter, add_filter_arguments, packet_filter_from_args
from netsleuth.diagnostics.resets import (
    RESET_KINDS,
    AbortRecord,
    ResetEnricher,
    ResetGroup,
    ResetRecord,
    resets_session_config,
)
from netsleuth.diagnostics.tcp_abi import EventKind
from netsleuth.diagnostics.tcp_context import TcpContext
from netsleuth.diagnostics.tcp_session import KindTotals, RawTcpEvent, TcpSession
from netsleuth.errors import UsageError
from netsleuth.render.jsonl import JsonLinesWriter
from netsleuth.render.tcp_text import abort_line, kind_totals_line, print_reset_summary, reset_line

__all__ = ["COMMAND", "tcp_only_filter"]

_LABELS = {
    EventKind.RESET_SENT: ("sent", "resets sent by the TCP stack"),
    EventKind.RESET_RECEIVED: ("received", "resets received"),
    EventKind.RESET_FIREWALL: ("firewall", "resets sent by firewall REJECT rules"),
}


def _singular(label: str) -> str:
    return label.replace("resets", "reset", 1)


def tcp_only_filter(args: argparse.Namespace) -> PacketFilter:
    """The shared filters, minus the ones that cannot apply to TCP sockets."""
    packet_filter = packet_filter_from_args(args)
    if packet_filter.proto not in (None, 6):
        raise UsageError("this command traces TCP: --proto can only be tcp")
    if packet_filter.dev is not None:
        raise UsageError("--dev does not apply here: TCP events belong to sockets, not interfaces")
    return packet_filter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "count in the kernel; print groups at the end")
    parser.add_argument("--stack", action="store_true", help="print the kernel stack of each reset")
    add_filter_arguments(parser)


def _summary_json(
    totals: dict[EventKind, KindTotals], groups: list[ResetGroup], attach: str, interrupted: bool
) -> dict[str, Any]:
    data: dict[str, Any] = {"type": "summary", "attach": attach, "interrupted": interrupted}
    for kind, (key, _) in _LABELS.items():
        data[key] = totals.get(kind, KindTotals()).to_json()
    data["total"] = sum(totals.get(kind, KindTotals()).matched for kind in RESET_KINDS)
    data["aborts"] = sum(group.count for group in groups if isinstance(group.example, AbortRecord))
    data["groups"] = [group.to_json() for group in sorted(groups, key=lambda g: -g.count)]
    return data


def run(args: argparse.Namespace) -> int:
    check_run_arguments(args)
    if args.summary and args.stack:
        raise UsageError("--stack needs individual resets: it cannot be combined with --summary")
    packet_filter = tcp_only_filter(args)
    session_config = resets_session_config(packet_filter, args.summary, args.stack, args.sample)
    out = sys.stdout
    console = Console(file=out, width=None if out.isatty() else 200)
    writer = JsonLinesWriter(out) if args.json else None
    progress = Progress(sys.stderr, "resets")
    context = TcpContext()
    enricher = ResetEnricher(context, want_stack=args.stack)
    with contextlib.ExitStack() as stack:
        stack.callback(enricher.close)
        session = stack.enter_context(TcpSession(session_config))
        session.start()
        context.prepare()
        enricher.prepare(packet_filter.netns)
        write_ready_file(args.ready_file, session.attach_kind)

        def emit(raws: list[RawTcpEvent]) -> None:
            records = enricher.enrich_many(raws)
            if not records:
                return
            progress.clear()
            if writer is not None:
                writer.write_many(record.to_json() for record in records)
            else:
                out.write(
                    "".join(
                        (reset_line(record) if isinstance(record, ResetRecord) else abort_line(record)) + "\n"
                        for record in records
                    )
                )
            out.flush()

        def step(timeout_ms: int) -> None:
            emit(session.poll(timeout_ms))
            totals = session.totals()
            reset_totals = [totals.get(kind, KindTotals()) for kind in RESET_KINDS]
            progress.update(
                sum(t.matched for t in reset_totals),
                sum(t.emitted for t in reset_totals),
                sum(t.sampled for t in reset_totals),
                sum(t.lost for t in reset_totals),
            )

        with StopSignals() as signals:
            run_until_stopped(step, args.duration, signals, POLL_MS)
            emit(session.drain())
            progress.clear()
            totals = session.totals()
            groups = [
                group
                for raw in session.groups(RESET_KINDS | {EventKind.ERROR})
                if (group := enricher.enrich_group(raw)) is not None
            ]
            interrupted = signals.stopped
        if writer is not None:
            writer.write(_summary_json(totals, groups, session.attach_kind, interrupted))
            writer.flush()
        else:
            labelled = {label: totals.get(kind, KindTotals()) for kind, (_, label) in _LABELS.items()}
            if args.summary or interrupted or args.duration:
                print_reset_summary(console, groups, labelled)
            else:
                for label, kind_totals in labelled.items():
                    out.write(kind_totals_line(label, kind_totals, _singular(label)) + "\n")
        if not session.has_reset_reason:
            sys.stderr.write(
                "netsleuth: this kernel gives no reset reasons (Linux 6.10+); causes are inferred\n"
            )
        lossy = [t for kind, t in totals.items() if kind in RESET_KINDS and (t.lost or t.sampled)]
        if not args.summary and lossy:
            sys.stderr.write(
                f"netsleuth: {sum(t.sampled for t in lossy)} resets not printed (sampled), "
                f"{sum(t.lost for t in lossy)} lost\n"
            )
    return 0


COMMAND = Command(
    name="resets",
    help="every TCP reset sent or received: state, trigger, kernel reason, owner, and why in plain words",
    add_arguments=add_arguments,
    run=run,
)
