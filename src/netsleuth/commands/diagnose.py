"""`netsleuth diagnose`: one command for the 3 a.m. page — path health, drops, resets and retransmits
watched together, ranked verdicts with evidence and fix."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from netsleuth.commands import Command
from netsleuth.diagnostics.filters import add_filter_arguments
from netsleuth.diagnostics.totals import EventTotals

if TYPE_CHECKING:
    from netsleuth.diagnose.run import DiagnoseSummary, DiagnosisSession, RankedVerdict

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


class DiagnoseView:
    """Verdicts are judged at the end of the window: nothing to print while watching but the progress."""

    noun = "drops"

    def __init__(self, session: DiagnosisSession) -> None:
        self._session = session

    def status(self) -> str:
        elapsed, drops, resets, retransmits = self._session.progress()
        duration = self._session.config.duration
        return (
            f"watching {elapsed:4.1f}/{duration:g} s: {drops} drops, {resets} resets, "
            f"{retransmits} retransmits"
        )

    def lines(self, records: Sequence[RankedVerdict]) -> str:
        return ""

    def finish(self, summary: DiagnoseSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console

        from netsleuth.render.verdicts_text import print_verdicts

        console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200)
        print_verdicts(console, list(summary.verdicts), summary.seconds, summary.watched)

    def loss_line(self, totals: EventTotals) -> str:
        return ""


def run(args: argparse.Namespace) -> int:
    from netsleuth.commands._runloop import run_session
    from netsleuth.diagnose.diagnostic import DIAGNOSTIC
    from netsleuth.diagnose.run import DiagnosisSession

    config = DIAGNOSTIC.config_from_args(args)
    session = DiagnosisSession(config)
    view = DiagnoseView(session)
    return run_session(
        session,
        config.run_options,
        view,
        json_lines=args.json,
        ready_file=args.ready_file,
        status=view.status,
    )


COMMAND = Command(
    name="diagnose",
    help="watch drops, resets, retransmits and path health together; print ranked verdicts with fixes",
    add_arguments=add_arguments,
    run=run,
)
