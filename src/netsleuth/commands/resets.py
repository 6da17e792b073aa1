"""`netsleuth resets`: every TCP reset sent or received, with the socket state, the segment that triggered it,
the kernel's reason, the owner, and a plain-words cause with the check to run next."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from netsleuth.commands import Command
from netsleuth.commands._runloop import add_run_arguments, run_session
from netsleuth.diagnostics.filters import add_filter_arguments
from netsleuth.diagnostics.resets import AbortRecord, ResetRecord
from netsleuth.diagnostics.tcp_diagnostics import DIAGNOSTICS, ResetsDiagnostic, ResetsSummary
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.render.tcp_text import abort_line, kind_totals_line, print_reset_summary, reset_line

__all__ = ["COMMAND"]

SPEC = DIAGNOSTICS["resets"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "count in the kernel; print groups at the end")
    parser.add_argument("--stack", action="store_true", help="print the kernel stack of each reset")
    add_filter_arguments(parser)


class ResetsView:
    noun = "resets"

    def __init__(self) -> None:
        out = sys.stdout
        self._console = Console(file=out, width=None if out.isatty() else 200)

    def lines(self, records: Sequence[ResetRecord | AbortRecord]) -> str:
        return "".join(
            (reset_line(record) if isinstance(record, ResetRecord) else abort_line(record)) + "\n"
            for record in records
        )

    def finish(self, summary: ResetsSummary, totals: EventTotals, show_groups: bool) -> None:
        labelled = summary.labelled_totals()
        if show_groups:
            print_reset_summary(self._console, summary.groups, labelled)
            return
        for label, kind_totals in labelled.items():
            singular = label.replace("resets", "reset", 1)
            sys.stdout.write(kind_totals_line(label, kind_totals, singular) + "\n")

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.sampled} resets not printed (sampled), {totals.lost} lost"


def run(args: argparse.Namespace) -> int:
    config = SPEC.config_from_args(args)
    session = ResetsDiagnostic(config)
    return run_session(
        session, config.run_options, ResetsView(), json_lines=args.json, ready_file=args.ready_file
    )


COMMAND = Command(name="resets", help=SPEC.help, add_arguments=add_arguments, run=run)
