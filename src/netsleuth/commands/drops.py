"""`netsleuth drops`: stream or summarize every dropped packet with reason, location, owner and rule."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from netsleuth.commands import Command
from netsleuth.diagnostics.filters import add_filter_arguments, packet_filter_from_args
from netsleuth.errors import UsageError

# The heavy modules (libbpf, rich, renderers) load only when the command runs: `netsleuth --help` and every
# other command stay fast, and attach time is not spent importing what the run does not need yet.
if TYPE_CHECKING:
    from netsleuth.diagnostics.drops import DropsConfig, DropTotals
    from netsleuth.diagnostics.drops_enrich import DropRecord
    from netsleuth.kernel.reasons import DropReasons
    from netsleuth.render.pcapng import PcapngWriter

__all__ = ["COMMAND"]

_POLL_MS = 100
_PROGRESS_S = 0.5
_DEFAULT_PCAP_SNAPLEN = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--summary", action="store_true", help="count in the kernel; print groups at the end")
    parser.add_argument("--json", action="store_true", help="JSON Lines output")
    parser.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long")
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
    parser.add_argument(
        "--sample", type=int, default=1, metavar="N", help="print one drop in N (totals stay exact)"
    )
    parser.add_argument("--ready-file", metavar="PATH", help="create this file once the probes are attached")
    add_filter_arguments(parser)


def _config(args: argparse.Namespace) -> tuple[DropsConfig, DropReasons]:
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be a positive number of seconds")
    if args.snaplen is not None and args.pcap is None:
        raise UsageError("--snaplen only applies with --pcap FILE")
    if args.pcap and args.summary:
        raise UsageError("--pcap needs individual drops: it cannot be combined with --summary")
    from netsleuth.diagnostics.drops import DropsConfig
    from netsleuth.kernel.reasons import load_drop_reasons

    reasons = load_drop_reasons()
    snaplen = 0
    if args.pcap:
        snaplen = _DEFAULT_PCAP_SNAPLEN if args.snaplen is None else args.snaplen
    config = DropsConfig(
        packet_filter=packet_filter_from_args(args),
        reasons=frozenset(reasons.parse(args.reason)),
        exclude_reasons=frozenset(reasons.parse(args.exclude_reason)),
        stack=args.stack,
        snaplen=snaplen,
        summary_only=args.summary,
        sample_every=args.sample,
    )
    return config, reasons


class _Progress:
    """A status line on a terminal's stderr: events/s, lost and sampled, so a long run never looks hung."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.enabled = stream.isatty()
        self._last = time.monotonic()
        self._last_matched = 0
        self._shown = False

    def clear(self) -> None:
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._shown = False

    def update(self, totals: DropTotals) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < _PROGRESS_S:
            return
        rate = (totals.matched - self._last_matched) / (now - self._last)
        self._last, self._last_matched = now, totals.matched
        self._stream.write(
            f"\r\x1b[K{totals.matched} drops ({rate:,.0f}/s), {totals.emitted} shown, "
            f"{totals.sampled} sampled, {totals.lost} lost"
        )
        self._stream.flush()
        self._shown = True


class _StopSignals:
    """SIGINT and SIGTERM end a run by setting a flag the loop checks, never by raising in the middle of a
    batch: an exception between reading records and printing them would lose them."""

    def __init__(self) -> None:
        self.stopped = False
        self._previous: dict[int, object] = {}

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        self.stopped = True

    def __enter__(self) -> _StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def run(args: argparse.Namespace) -> int:
    # Only what attaching needs is imported before the ready file; names and renderers load after it.
    from netsleuth.diagnostics.drops import DropsSession
    from netsleuth.render.pcapng import PcapngWriter

    config, reasons = _config(args)
    vmlinux = args.vmlinux
    if vmlinux is not None and not Path(vmlinux).is_file():
        raise UsageError(f"--vmlinux {vmlinux}: no such file")
    out = sys.stdout
    progress = _Progress(sys.stderr)
    pcap: PcapngWriter | None = None
    with contextlib.ExitStack() as stack:
        # Installed before anything attaches: a Ctrl-C at any point ends the run the same orderly way.
        signals = stack.enter_context(_StopSignals())
        session = stack.enter_context(DropsSession(config, reasons))
        if args.pcap:
            try:
                pcap = stack.enter_context(PcapngWriter(args.pcap, snaplen=config.snaplen))
            except OSError as error:
                raise UsageError(f"cannot write {args.pcap}: {error.strerror}") from None
        session.start()
        if args.ready_file:
            Path(args.ready_file).write_text(f"{session.attach_kind}\n")

        # Drops are already being counted and queued; names are read once, before the first is printed.
        from rich.console import Console

        from netsleuth.diagnostics.drops_enrich import DropEnricher
        from netsleuth.kernel.symbolizer import find_debug_vmlinux
        from netsleuth.render.drops_text import drop_line, print_summary, totals_line
        from netsleuth.render.jsonl import JsonLinesWriter

        enricher = DropEnricher(reasons, want_stack=args.stack, vmlinux=vmlinux or find_debug_vmlinux())
        stack.callback(enricher.close)
        enricher.prepare()
        # Off a terminal rich would wrap tables at 80 columns; a log file is better read unwrapped.
        console = Console(file=out, width=None if out.isatty() else 200)
        writer = JsonLinesWriter(out) if args.json else None
        deadline = time.monotonic() + args.duration if args.duration else None

        def emit(records: list[DropRecord]) -> None:
            if not records:
                return
            progress.clear()
            if writer is not None:
                writer.write_many(record.to_json() for record in records)
            else:
                out.write("".join(drop_line(record) + "\n" for record in records))
            out.flush()
            if pcap is not None:
                for record in records:
                    _write_pcap(pcap, record)

        while not signals.stopped and (deadline is None or time.monotonic() < deadline):
            remaining_ms = _POLL_MS if deadline is None else int((deadline - time.monotonic()) * 1000)
            emit([enricher.enrich(raw) for raw in session.poll(max(0, min(_POLL_MS, remaining_ms)))])
            progress.update(session.totals())
        emit([enricher.enrich(raw) for raw in session.drain()])
        progress.clear()
        totals = session.totals()
        groups = [enricher.enrich_group(group) for group in session.groups()]
        interrupted = signals.stopped
        if writer is not None:
            writer.write(
                {
                    "type": "summary",
                    **totals.to_json(),
                    "attach": session.attach_kind,
                    "interrupted": interrupted,
                    "groups": [group.to_json() for group in sorted(groups, key=lambda g: -g.count)],
                }
            )
            writer.flush()
        else:
            if config.summary_only or interrupted or args.duration:
                print_summary(console, groups, totals)
            else:
                out.write(totals_line(totals) + "\n")
        if not config.summary_only and (totals.lost or totals.sampled):
            sys.stderr.write(f"netsleuth: {totals_line(totals)}\n")
    return 0


def _write_pcap(pcap: PcapngWriter, record: DropRecord) -> None:
    if not record.packet_bytes:
        return
    comments = [
        f"reason={record.reason}",
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
