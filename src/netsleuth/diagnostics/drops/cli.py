"""What `netsleuth drops` takes on a terminal beyond its config (the spec's CliRun): `--vmlinux PATH` for
source lines, and `--pcap FILE`, a sink that writes the dropped packets as pcapng with the findings as
comments."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from netsleuth.errors import UsageError

if TYPE_CHECKING:
    from netsleuth.diagnostics.drops.batch import DropBatch
    from netsleuth.diagnostics.drops.pcapng import PcapngWriter
    from netsleuth.diagnostics.drops.records import DropRecord, DropsConfig

__all__ = ["add_arguments", "run"]

DEFAULT_PCAP_SNAPLEN = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vmlinux", metavar="PATH", help="debug vmlinux for file:line (default: auto-found)")
    parser.add_argument(
        "--pcap", metavar="FILE", help="write dropped packets as pcapng (with reason comments)"
    )


def run(config: DropsConfig, args: argparse.Namespace) -> int:
    """Only what attaching needs is imported before the ready file; names and renderers load after it (the
    debug vmlinux is looked for when the first drop is named, the pcapng writer only with --pcap)."""
    from netsleuth.commands._runloop import run_session
    from netsleuth.diagnostics.drops.session import open_drops
    from netsleuth.diagnostics.drops.view import DropsView

    if config.snaplen and args.pcap is None:
        raise UsageError("--snaplen only applies with --pcap FILE")
    if args.pcap and config.summary:
        raise UsageError("--pcap needs individual drops: it cannot be combined with --summary")
    if args.pcap and not config.snaplen:
        config = msgspec.structs.replace(config, snaplen=DEFAULT_PCAP_SNAPLEN)
    vmlinux = args.vmlinux
    if vmlinux is not None and not Path(vmlinux).is_file():
        raise UsageError(f"--vmlinux {vmlinux}: no such file")
    session = open_drops(config, vmlinux=vmlinux, find_vmlinux=vmlinux is None)
    pcap: PcapngWriter | None = None
    if args.pcap:
        from netsleuth.diagnostics.drops.pcapng import PcapngWriter

        try:
            pcap = PcapngWriter(args.pcap, snaplen=config.snaplen)
        except OSError as error:
            session.close()
            raise UsageError(f"cannot write {args.pcap}: {error.strerror}") from None
    try:
        return run_session(
            session,
            config,
            DropsView(),
            json_lines=args.json,
            ready_file=args.ready_file,
            sinks=[lambda batch: _write_pcap(pcap, batch)] if pcap is not None else [],
        )
    finally:
        if pcap is not None:
            pcap.close()


def _comments(record: DropRecord) -> list[str]:
    comments = [
        f"reason={record.reason}" + (" (inferred)" if record.reason_inferred is True else ""),
        f"location={record.location}",
        f"netns={record.netns_name or record.netns}",
    ]
    if record.pid is not None:
        comments.append(f"process={record.comm}[{record.pid}]")
    if record.netfilter and record.netfilter.get("rule"):
        netfilter = record.netfilter
        comments.append(f"rule={netfilter.get('table')}/{netfilter.get('chain')}: {netfilter['rule']}")
    return comments


def _write_pcap(pcap: PcapngWriter | None, batch: Sequence[object]) -> None:
    assert pcap is not None
    drops: DropBatch = batch  # type: ignore[assignment]  # a drops session polls DropBatches
    for record, packet in drops.captures():
        pcap.write_packet(int(record.time * 1e9), packet, record.length, _comments(record))
