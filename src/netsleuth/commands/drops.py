"""`netsleuth drops`: stream or summarize every dropped packet with reason, location, owner and rule."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from netsleuth.commands import Command
from netsleuth.commands._runloop import add_run_arguments, run_session
from netsleuth.diagnostics.filters import add_filter_arguments
from netsleuth.diagnostics.model import ConfigInput
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError

# The heavy modules (libbpf, rich, renderers) load only when the command runs: `netsleuth --help` and every
# other command stay fast, and attach time is not spent importing what the run does not need yet.
if TYPE_CHECKING:
    from netsleuth.diagnostics.drops import DropsSummary
    from netsleuth.diagnostics.drops_enrich import DropRecord
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


class DropsView:
    noun = "drops"

    def lines(self, records: Sequence[DropRecord]) -> str:
        from netsleuth.render.drops_text import drop_line

        return "".join(drop_line(record) + "\n" for record in records)

    def finish(self, summary: DropsSummary, totals: EventTotals, show_groups: bool) -> None:
        # rich loads here, after attaching: the table is the last thing a run prints.
        from rich.console import Console

        from netsleuth.render.drops_text import print_summary, totals_line

        if show_groups:
            out = sys.stdout
            # Off a terminal rich would wrap tables at 80 columns; a log file is better read unwrapped.
            print_summary(Console(file=out, width=None if out.isatty() else 200), summary.groups, totals)
        else:
            sys.stdout.write(totals_line(totals) + "\n")

    def loss_line(self, totals: EventTotals) -> str:
        from netsleuth.render.drops_text import totals_line

        return totals_line(totals)


def run(args: argparse.Namespace) -> int:
    # Only what attaching needs is imported before the ready file; names and renderers load after it (the
    # debug vmlinux is looked for when the first drop is named, the pcapng writer only with --pcap).
    from netsleuth.diagnostics.drops import DropsDiagnostic, read_drops_config

    if args.snaplen is not None and args.pcap is None:
        raise UsageError("--snaplen only applies with --pcap FILE")
    if args.pcap:
        args.snaplen = _DEFAULT_PCAP_SNAPLEN if args.snaplen is None else args.snaplen
    # The reason names are read from the kernel's BTF only for --reason/--exclude-reason before attaching;
    # otherwise when the first drop is named (the program asks the kernel itself at load).
    config = read_drops_config(ConfigInput.from_args(args))
    vmlinux = args.vmlinux
    if vmlinux is not None and not Path(vmlinux).is_file():
        raise UsageError(f"--vmlinux {vmlinux}: no such file")
    session = DropsDiagnostic(config, vmlinux=vmlinux, find_vmlinux=vmlinux is None)
    sinks = []
    pcap: PcapngWriter | None = None
    if args.pcap:
        from netsleuth.render.pcapng import PcapngWriter

        try:
            pcap = PcapngWriter(args.pcap, snaplen=config.snaplen)
        except OSError as error:
            session.close()
            raise UsageError(f"cannot write {args.pcap}: {error.strerror}") from None
        sinks.append(lambda records: _write_pcap(pcap, records))
    try:
        return run_session(
            session,
            config.run_options,
            DropsView(),
            json_lines=args.json,
            ready_file=args.ready_file,
            sinks=sinks,
        )
    finally:
        if pcap is not None:
            pcap.close()


def _write_pcap(pcap: PcapngWriter | None, records: Sequence[DropRecord]) -> None:
    assert pcap is not None
    for record in records:
        if not record.packet_bytes:
            continue
        comments = [
            f"reason={record.reason}" + (" (inferred)" if record.reason_inferred else ""),
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
