"""`netsleuth drops`: stream or summarize every dropped packet with reason, location, owner and rule."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from netsleuth.commands import Command
from netsleuth.commands._runloop import (
    Progress,
    StopSignals,
    add_run_arguments,
    check_run_arguments,
    run_until_stopped,
    write_ready_file,
)
from netsleuth.diagnostics.filters import add_filter_arguments, packet_filter_from_args
from netsleuth.errors import UsageError

# The heavy modules (libbpf, rich, renderers) load only when the command runs: `netsleuth --help` and every
# other command stay fast, and attach time is not spent importing what the run does not need yet.
if TYPE_CHECKING:
    from netsleuth.diagnostics.drops import DropsConfig
    from netsleuth.diagnostics.drops_enrich import DropRecord
    from netsleuth.kernel.reasons import DropReasons
    from netsleuth.render.pcapng import PcapngWriter

__all__ = ["COMMAND"]

_DEFAULT_PCAP_SNAPLEN = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, summary_help="count in the kernel; print groups at the end")
    parser.add_argument("--reason", action="append", default=[], help="only this drop reason (repeatable)")
    parser.add_argument(
        "--exclude-reason", action="append", default=[], help="not this drop reason (repeatable)"
    )
    parser.add_argument("--stack", action="store_true", help="print the kernel stack of each drop")
    parser.add_argument("--vmlinux", metavar="PATH", help="debug vmlinux for file:line (default: auto-found)")
    parser.add_argument(
        "--pcap", metavar="FILE", help="write dropped packets as pcapng (with reason comments)"
    )
    parser.add_argument(
        "--snaplen", type=int, help=f"packet bytes kept for --pcap (default {_DEFAULT_PCAP_SNAPLEN})"
    )
    add_filter_arguments(parser)


def _config(args: argparse.Namespace) -> tuple[DropsConfig, DropReasons]:
    check_run_arguments(args)
    if args.snaplen is not None and args.pcap is None:
        raise UsageError("--snaplen only applies with --pcap FILE")
    if args.pcap and args.summary:
        raise UsageError("--pcap needs individual drops: it cannot be combined with --summary")
    from netsleuth.diagnostics.drops import DropsConfig
    from netsleuth.kernel.reasons import load_drop_reasons

    reasons = load_drop_reasons()
    snaplen = 0
    if args.pcap:
        snaplen = _DEFAULT_PCAP_SNAPLEN if args.snaplen is None else args.snaplen
    config = DropsConfig(
        packet_filter=packet_filter_from_args(args),
        reasons=frozenset(reasons.parse(args.reason)),
        exclude_reasons=frozenset(reasons.parse(args.exclude_reason)),
        stack=args.stack,
        snaplen=snaplen,
        summary_only=args.summary,
        sample_every=args.sample,
    )
    return config, reasons


def run(args: argparse.Namespace) -> int:
    # Only what attaching needs is imported before the ready file; names and renderers load after it.
    from netsleuth.diagnostics.drops import DropsSession
    from netsleuth.render.pcapng import PcapngWriter

    config, reasons = _config(args)
    vmlinux = args.vmlinux
    if vmlinux is not None and not Path(vmlinux).is_file():
        raise UsageError(f"--vmlinux {vmlinux}: no such file")
    out = sys.stdout
    progress = Progress(sys.stderr, "drops")
    pcap: PcapngWriter | None = None
    with contextlib.ExitStack() as stack:
        # Installed before anything attaches: a Ctrl-C at any point ends the run the same orderly way.
        signals = stack.enter_context(StopSignals())
        session = stack.enter_context(DropsSession(config, reasons))
        if args.pcap:
            try:
                pcap = stack.enter_context(PcapngWriter(args.pcap, snaplen=config.snaplen))
            except OSError as error:
                raise UsageError(f"cannot write {args.pcap}: {error.strerror}") from None
        session.start()
        write_ready_file(args.ready_file, session.attach_kind)

        # Drops are already being counted and queued; names are read once, before the first is printed.
        from rich.console import Console

        from netsleuth.diagnostics.drops_enrich import DropEnricher
        from netsleuth.kernel.symbolizer import find_debug_vmlinux
        from netsleuth.render.drops_text import drop_line, print_summary, totals_line
        from netsleuth.render.jsonl import JsonLinesWriter

        enricher = DropEnricher(reasons, want_stack=args.stack, vmlinux=vmlinux or find_debug_vmlinux())
        stack.callback(enricher.close)
        enricher.prepare(config.packet_filter.netns)
        # Off a terminal rich would wrap tables at 80 columns; a log file is better read unwrapped.
        console = Console(file=out, width=None if out.isatty() else 200)
        writer = JsonLinesWriter(out) if args.json else None

        def emit(records: list[DropRecord]) -> None:
            if not records:
                return
            progress.clear()
            if writer is not None:
                writer.write_many(record.to_json() for record in records)
            else:
                out.write("".join(drop_line(record) + "\n" for record in records))
            out.flush()
            if pcap is not None:
                for record in records:
                    _write_pcap(pcap, record)

        def step(timeout_ms: int) -> None:
            emit([enricher.enrich(raw) for raw in session.poll(timeout_ms)])
            totals = session.totals()
            progress.update(totals.matched, totals.emitted, totals.sampled, totals.lost)

        run_until_stopped(step, args.duration, signals)
        emit([enricher.enrich(raw) for raw in session.drain()])
        progress.clear()
        totals = session.totals()
        groups = [enricher.enrich_group(group) for group in session.groups()]
        interrupted = signals.stopped
        if writer is not None:
            writer.write(
                {
                    "type": "summary",
                    **totals.to_json(),
                    "attach": session.attach_kind,
                    "interrupted": interrupted,
                    "groups": [group.to_json() for group in sorted(groups, key=lambda g: -g.count)],
                }
            )
            writer.flush()
        else:
            if config.summary_only or interrupted or args.duration:
                print_summary(console, groups, totals)
            else:
                out.write(totals_line(totals) + "\n")
        if not config.summary_only and (totals.lost or totals.sampled):
            sys.stderr.write(f"netsleuth: {totals_line(totals)}\n")
    return 0


def _write_pcap(pcap: PcapngWriter, record: DropRecord) -> None:
    if not record.packet_bytes:
        return
    comments = [
        f"reason={record.reason}",
        f"location={record.location}",
        f"netns={record.netns_name or record.netns}",
    ]
    if record.owner.pid is not None:
        comments.append(f"process={record.owner.comm}[{record.owner.pid}]")
    if record.netfilter and record.netfilter.get("rule"):
        nf = record.netfilter
        comments.append(f"rule={nf.get('table')}/{nf.get('chain')}: {nf['rule']}")
    pcap.write_packet(int(record.time * 1e9), record.packet_bytes, record.packet.length, comments)


COMMAND = Command(
    name="drops",
    help="every dropped packet: why (kernel drop reason), where, whose, and which firewall rule",
    add_arguments=add_arguments,
    run=run,
)
