"""`netsleuth conn`: one timeline per selected connection (state changes, retransmits, drops with their reason
and firewall rule, resets), ending in a one-line verdict of what happened to it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from netsleuth.commands import Command
from netsleuth.commands._runloop import add_run_arguments, run_session
from netsleuth.diagnostics.conn_diagnostic import DIAGNOSTIC, ConnDiagnostic, ConnRecord, ConnSummary
from netsleuth.diagnostics.filters import add_filter_arguments
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.render.conn_text import conn_block

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "print only each connection's verdict, not its timeline")
    add_filter_arguments(parser)
    parser.epilog = (
        "Here --dst names the server end and also takes a port: --dst 198.18.0.2:80, --dst "
        "[2001:db8::2]:443. "
        "--src and --sport name the client end."
    )


class ConnView:
    noun = "events"

    def __init__(self, timeline: bool) -> None:
        self._timeline = timeline

    def lines(self, records: Sequence[ConnRecord]) -> str:
        return "".join(
            conn_block(record.report, record.netns_name, timeline=self._timeline) + "\n" for record in records
        )

    def finish(self, summary: ConnSummary, totals: EventTotals, show_groups: bool) -> None:
        outcomes = sorted(summary.outcomes.items(), key=lambda item: -item[1])
        text = ", ".join(f"{count} {outcome}" for outcome, count in outcomes)
        total = sum(summary.outcomes.values())
        sys.stdout.write(
            f"{total} connection{'s' if total != 1 else ''}" + (f": {text}" if text else "") + "\n"
        )

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.lost} events lost and {totals.sampled} sampled away: timelines may be incomplete"


def run(args: argparse.Namespace) -> int:
    config = DIAGNOSTIC.config_from_args(args)
    return run_session(
        ConnDiagnostic(config),
        config.run_options,
        ConnView(timeline=not config.run.summary),
        json_lines=args.json,
        ready_file=args.ready_file,
    )


COMMAND = Command(name="conn", help=DIAGNOSTIC.help, add_arguments=add_arguments, run=run)
