"""`netsleuth dns`: every DNS query and its answer, timeouts and the drops behind them; `--summary` per
(process, server, name suffix)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from netsleuth.commands import Command
from netsleuth.commands._runloop import add_run_arguments, run_session
from netsleuth.diagnostics.filters import add_filter_arguments
from netsleuth.diagnostics.model import ConfigInput
from netsleuth.diagnostics.totals import EventTotals

if TYPE_CHECKING:
    from netsleuth.diagnostics.dns import DnsRecord, DnsSummary

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(
        parser, summary_help="count in the kernel; print per process, server and name at the end"
    )
    parser.add_argument(
        "--name", action="append", default=[], help="only this name or names under it (repeatable)"
    )
    parser.add_argument(
        "--rcode",
        action="append",
        default=[],
        help="only answers with this response code (NOERROR, NXDOMAIN, SERVFAIL, ...; TIMEOUT keeps "
        "timeouts; repeatable)",
    )
    parser.add_argument("--slow", metavar="MS", help="only answers that took at least MS milliseconds")
    parser.add_argument(
        "--timeout", metavar="SECONDS", help="a query with no answer after this long is a timeout (default 5)"
    )
    parser.add_argument("--dns-port", metavar="PORT", help="the servers' DNS port (default 53)")
    add_filter_arguments(parser)


class DnsView:
    noun = "DNS answers"

    def lines(self, records: Sequence[DnsRecord]) -> str:
        from netsleuth.render.dns_text import dns_lines

        return dns_lines(records)

    def finish(self, summary: DnsSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console

        from netsleuth.render.dns_text import dns_totals_line, print_dns_summary

        out = sys.stdout
        if show_groups:
            print_dns_summary(Console(file=out, width=None if out.isatty() else 200), summary)
        else:
            out.write(dns_totals_line(summary) + "\n")

    def loss_line(self, totals: EventTotals) -> str:
        from netsleuth.render.dns_text import events_line

        return events_line(totals)


def run(args: argparse.Namespace) -> int:
    from netsleuth.diagnostics.dns import DnsDiagnostic, read_dns_config

    config = read_dns_config(ConfigInput.from_args(args))
    return run_session(
        DnsDiagnostic(config),
        config.run_options(),
        DnsView(),
        json_lines=args.json,
        ready_file=args.ready_file,
    )


COMMAND = Command(
    name="dns",
    help="every DNS query and its answer: which process asked, which server, how long, what came back, "
    "and what never came back",
    add_arguments=add_arguments,
    run=run,
)
