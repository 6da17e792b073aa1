"""`netsleuth route`: the kernel's route lookups with the ip rule, table and prefix that decided each, and
whether the next hop's neighbour resolved."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from netsleuth.commands import Command
from netsleuth.commands._runloop import add_run_arguments, run_session
from netsleuth.diagnostics.filters import add_filter_arguments
from netsleuth.diagnostics.totals import EventTotals

if TYPE_CHECKING:
    from netsleuth.diagnostics.route import RouteRecord, RouteSummary

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "count in the kernel; print each decision with its count at the end")
    parser.add_argument(
        "--failed",
        action="store_true",
        help="only reject routes (blackhole, unreachable, prohibit), failed/dead next hops and their drops",
    )
    parser.add_argument(
        "--misses", action="store_true", help="also the tables the rules tried that had no matching route"
    )
    add_filter_arguments(parser)


class RouteView:
    noun = "route events"

    def lines(self, records: Sequence[RouteRecord]) -> str:
        from netsleuth.render.route_text import route_lines

        return route_lines(records)

    def finish(self, summary: RouteSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console

        from netsleuth.render.route_text import print_route_summary, totals_line

        out = sys.stdout
        if show_groups:
            print_route_summary(Console(file=out, width=None if out.isatty() else 200), summary)
        else:
            out.write(totals_line(summary) + "\n")

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.sampled} route events not printed (sampled), {totals.lost} lost"


def run(args: argparse.Namespace) -> int:
    from netsleuth.diagnostics.route import DIAGNOSTIC, RouteDiagnostic

    config = DIAGNOSTIC.config_from_args(args)
    return run_session(
        RouteDiagnostic(config),
        config.run_options,
        RouteView(),
        json_lines=args.json,
        ready_file=args.ready_file,
    )


COMMAND = Command(
    name="route",
    help="the kernel's route lookups: ip rule, table, prefix, next hop and its neighbour resolution",
    add_arguments=add_arguments,
    run=run,
)
