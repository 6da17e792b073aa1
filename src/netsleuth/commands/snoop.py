"""`netsleuth snoop exec|open`: execsnoop and opensnoop from tracepoints, with the process filters, --failed,
JSON, and each process's network namespace and container."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from netsleuth.commands import Command
from netsleuth.commands._runloop import add_run_arguments, run_session
from netsleuth.diagnostics.totals import EventTotals

if TYPE_CHECKING:
    from netsleuth.diagnostics.snoop import SnoopRecord, SnoopSummary

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mode", choices=("exec", "open"), help="exec: every exec and exit; open: every open")
    add_run_arguments(parser, "count in the kernel; print by process name, path and result at the end")
    parser.add_argument(
        "--failed", action="store_true", help="only calls that failed (exec: also non-zero exits)"
    )
    group = parser.add_argument_group("filters (applied in the kernel)")
    group.add_argument("--pid", help="process id")
    group.add_argument("--comm", help="process name (for exec: before or after the exec)")
    group.add_argument("--netns", help="network namespace: inode, `ip netns` name, or /proc/PID/ns/net")
    group.add_argument("--cgroup", help="cgroup v2 path (e.g. /system.slice/nginx.service) or id")


class SnoopView:
    def __init__(self, mode: str) -> None:
        self.noun = "execs" if mode == "exec" else "opens"

    def lines(self, records: Sequence[SnoopRecord]) -> str:
        from netsleuth.render.snoop_text import snoop_lines

        return snoop_lines(records)

    def finish(self, summary: SnoopSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console

        from netsleuth.render.snoop_text import print_snoop_summary, snoop_totals_line

        out = sys.stdout
        if show_groups:
            print_snoop_summary(Console(file=out, width=None if out.isatty() else 200), summary)
        else:
            out.write(snoop_totals_line(summary) + "\n")

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.sampled} {self.noun} not printed (sampled), {totals.lost} lost"


def run(args: argparse.Namespace) -> int:
    from netsleuth.diagnostics.snoop import DIAGNOSTICS, SnoopDiagnostic

    config = DIAGNOSTICS[f"snoop.{args.mode}"].config_from_args(args)
    return run_session(
        SnoopDiagnostic(config),
        config.run_options,
        SnoopView(args.mode),
        json_lines=args.json,
        ready_file=args.ready_file,
    )


COMMAND = Command(
    name="snoop",
    help="every exec (arguments, result, exit) or file open (fd or error), with namespace and container",
    add_arguments=add_arguments,
    run=run,
)
