"""`netsleuth softirq`: how long softirqs wait for the CPU and how long they run, per CPU and vector, and
what NAPI polling did against its budget - counted in the kernel, printed at the end (or on Ctrl-C)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from netsleuth.commands import Command
from netsleuth.commands._runloop import run_session
from netsleuth.diagnostics.totals import EventTotals

if TYPE_CHECKING:
    from netsleuth.diagnostics.softirq import SoftirqSummary

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--ready-file", metavar="PATH", help="create this file once the probes are attached")
    parser.add_argument(
        "--vector", action="append", default=[], help="show only this vector (NET_RX, TIMER...; repeatable)"
    )
    parser.add_argument("--netns", help="NAPI instances of devices in this network namespace only")
    parser.add_argument("--dev", help="NAPI instances of this device only")


class SoftirqView:
    noun = "softirq runs"

    def lines(self, records: Sequence[Any]) -> str:
        return ""

    def finish(self, summary: SoftirqSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console

        from netsleuth.render.softirq_text import print_softirq_summary

        out = sys.stdout
        print_softirq_summary(Console(file=out, width=None if out.isatty() else 160), summary)

    def loss_line(self, totals: EventTotals) -> str:
        return ""


def run(args: argparse.Namespace) -> int:
    from netsleuth.diagnostics.softirq import DIAGNOSTIC, SoftirqDiagnostic

    config = DIAGNOSTIC.config_from_args(args)
    return run_session(
        SoftirqDiagnostic(config),
        config.run_options,
        SoftirqView(),
        json_lines=args.json,
        ready_file=args.ready_file,
    )


COMMAND = Command(
    name="softirq",
    help="softirq wait and run time per CPU and vector; NAPI polls and packets against budget",
    add_arguments=add_arguments,
    run=run,
)
