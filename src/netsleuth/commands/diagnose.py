"""`netsleuth diagnose`: one command for the 3 a.m. page — path health, drops, resets and retransmits
watched together, ranked verdicts with evidence and fix."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from netsleuth.commands import Command
from netsleuth.diagnostics.filters import add_filter_arguments, packet_filter_from_args
from netsleuth.errors import UsageError

__all__ = ["COMMAND"]

DEFAULT_DURATION = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION,
        metavar="SECONDS",
        help=f"how long to watch (default {DEFAULT_DURATION:g})",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per verdict, then a summary")
    parser.add_argument("--ready-file", metavar="PATH", help="create this file once the probes are attached")
    add_filter_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from netsleuth.commands._runloop import StopSignals
    from netsleuth.diagnose.run import DiagnoseConfig, Progress, run_diagnosis
    from netsleuth.kernel.netns import NetnsNames
    from netsleuth.render.jsonl import JsonLinesWriter
    from netsleuth.render.verdicts_text import print_verdicts

    if not 0 < args.duration <= 3600:
        raise UsageError("--duration must be between 0 and 3600 seconds")
    packet_filter = packet_filter_from_args(args)
    netns_name = None
    if packet_filter.netns is not None:
        # doctor reads devices and sysctls from inside the namespace: by its name or a process in it.
        names = NetnsNames()
        netns_name = names.name_of(packet_filter.netns) or names.path_of(packet_filter.netns)
    config = DiagnoseConfig(duration=args.duration, packet_filter=packet_filter, netns_name=netns_name)
    terminal = sys.stderr.isatty()

    def ready() -> None:
        if args.ready_file:
            Path(args.ready_file).write_text("ready\n")

    def progress(now: Progress) -> None:
        # A live line on a terminal while it watches, so ten quiet seconds never look like a hang.
        if terminal:
            sys.stderr.write(
                f"\r\x1b[Kwatching {now.elapsed:4.1f}/{now.duration:g} s: {now.drops} drops, "
                f"{now.resets} resets, "
                f"{now.retransmits} retransmits"
            )
            sys.stderr.flush()

    with StopSignals() as signals:
        diagnosis = run_diagnosis(config, ready, progress, lambda: signals.stopped)
    if terminal:
        sys.stderr.write("\r\x1b[K")
    watched = f"netns {netns_name}" if netns_name else "this host"
    if args.json:
        writer = JsonLinesWriter(sys.stdout)
        writer.write_many(verdict.to_json(rank) for rank, verdict in enumerate(diagnosis.verdicts, start=1))
        writer.write(
            {
                "type": "summary",
                "seconds": round(diagnosis.seconds, 3),
                "watched": watched,
                "verdicts": len(diagnosis.verdicts),
                "drops": diagnosis.drop_totals.to_json(),
                "all_good": list(diagnosis.report.all_good),
                "problems": list(diagnosis.problems),
            }
        )
        writer.flush()
    else:
        console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200)
        print_verdicts(console, diagnosis.verdicts, diagnosis.seconds, watched)
        for problem in diagnosis.problems:
            sys.stderr.write(f"netsleuth: {problem}\n")
    return 0


COMMAND = Command(
    name="diagnose",
    help="watch drops, resets, retransmits and path health together; print ranked verdicts with fixes",
    add_arguments=add_arguments,
    run=run,
)
