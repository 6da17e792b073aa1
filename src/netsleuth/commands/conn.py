"""`netsleuth conn`: one timeline per selected connection (state changes, retransmits, drops with their reason
and firewall rule, resets), ending in a one-line verdict of what happened to it."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from typing import Any

from netsleuth._generated.tcp_abi import EventKind
from netsleuth.commands import Command
from netsleuth.commands._runloop import (
    POLL_MS,
    StopSignals,
    add_run_arguments,
    check_run_arguments,
    run_until_stopped,
    write_ready_file,
)
from netsleuth.commands.resets import tcp_only_filter
from netsleuth.diagnostics.conn import ConnReport, ConnSelector, ConnTracker
from netsleuth.diagnostics.drops import DropsConfig, DropsSession
from netsleuth.diagnostics.drops_enrich import DropEnricher
from netsleuth.diagnostics.filters import PacketFilter, add_filter_arguments, parse_port
from netsleuth.diagnostics.resets import RESET_KINDS, ResetEnricher
from netsleuth.diagnostics.tcp_context import TcpContext
from netsleuth.diagnostics.tcp_session import TcpSession, TcpSessionConfig
from netsleuth.errors import UsageError
from netsleuth.kernel.reasons import load_drop_reasons
from netsleuth.render.jsonl import JsonLinesWriter
from netsleuth.render.tcp_text import conn_block

__all__ = ["COMMAND", "split_endpoint"]

_TCP = 6
_KINDS = RESET_KINDS | {EventKind.STATE, EventKind.RETRANS, EventKind.SYNACK_RETRANS, EventKind.ERROR}


def split_endpoint(text: str) -> tuple[str, int | None]:
    """`198.18.0.2:80` / `[2001:db8::2]:80` -> (address, port); a bare address or prefix has no port."""
    if text.startswith("["):
        address, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise UsageError(f"--dst {text!r}: write an IPv6 endpoint as [ADDR]:PORT")
        return address, parse_port(rest[1:], "--dst port") if rest else None
    if text.count(":") == 1:
        address, _, port = text.partition(":")
        return address, parse_port(port, "--dst port")
    return text, None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "print only each connection's verdict, not its timeline")
    add_filter_arguments(parser)
    parser.epilog = (
        "Here --dst names the server end and also takes a port: --dst 198.18.0.2:80, --dst "
        "[2001:db8::2]:443. "
        "--src and --sport name the client end."
    )


def _selection(args: argparse.Namespace) -> tuple[ConnSelector, PacketFilter, PacketFilter]:
    """The exact selector (userspace) and the broader kernel filters for the tcp and drops programs."""
    destinations, ports = [], set()
    for text in args.dst:
        address, port = split_endpoint(text)
        destinations.append(address)
        if port is not None:
            ports.add(port)
    if len(ports) > 1:
        raise UsageError("give one server port: --dst endpoints with different ports cannot be combined")
    args.dst = destinations
    packet_filter = tcp_only_filter(args)
    server_port = next(iter(ports), None)
    if server_port is not None and packet_filter.dport is not None and packet_filter.dport != server_port:
        raise UsageError("--dport and the port in --dst disagree")
    server_port = server_port or packet_filter.dport
    selector = ConnSelector(
        servers=packet_filter.destinations,
        server_port=server_port,
        clients=packet_filter.sources,
        client_port=packet_filter.sport,
        hosts=packet_filter.hosts,
        port=packet_filter.port,
    )
    # In the kernel, only "either end" filters: a server's socket has the server end as its local one.
    hosts = packet_filter.hosts + packet_filter.sources + packet_filter.destinations
    either_port = packet_filter.port or server_port or packet_filter.sport
    if packet_filter.hosts and (packet_filter.sources or packet_filter.destinations):
        hosts = packet_filter.hosts  # both must hold; the selector checks the rest
    tcp_filter = PacketFilter(
        hosts=hosts,
        port=either_port,
        pid=packet_filter.pid,
        comm=packet_filter.comm,
        netns=packet_filter.netns,
        family=packet_filter.family,
    )
    # Drops anywhere on the host: the one that kills a connection is often in another namespace.
    drops_filter = PacketFilter(proto=_TCP, hosts=hosts, port=either_port, family=packet_filter.family)
    return selector, tcp_filter, drops_filter


def run(args: argparse.Namespace) -> int:
    check_run_arguments(args)
    selector, tcp_filter, drops_filter = _selection(args)
    out = sys.stdout
    writer = JsonLinesWriter(out) if args.json else None
    context = TcpContext()
    reasons = load_drop_reasons()
    resets = ResetEnricher(context)
    drop_enricher = DropEnricher(reasons)
    tracker = ConnTracker(selector, context)
    outcomes: Counter[str] = Counter()
    with contextlib.ExitStack() as stack:
        stack.callback(resets.close)
        stack.callback(drop_enricher.close)
        tcp = stack.enter_context(
            TcpSession(TcpSessionConfig(tcp_filter, emit=_KINDS, sample_every=args.sample))
        )
        drops = stack.enter_context(DropsSession(DropsConfig(packet_filter=drops_filter), reasons))
        tcp.start()
        drops.start()
        context.prepare()
        drop_enricher.prepare()
        resets.prepare(tcp_filter.netns)
        write_ready_file(args.ready_file, f"{tcp.attach_kind} {drops.attach_kind}")

        def emit(reports: list[ConnReport]) -> None:
            if not reports:
                return
            for report in reports:
                outcomes[report.outcome] += 1
            if writer is not None:
                writer.write_many(report.to_json(context.netns_name) for report in reports)
            else:
                out.write(
                    "".join(
                        conn_block(report, context.netns_name, timeline=not args.summary) + "\n"
                        for report in reports
                    )
                )
            out.flush()

        def feed(tcp_raws: list[Any], drop_raws: list[Any]) -> None:
            for raw, record in resets.enrich_pairs(tcp_raws):
                tracker.add_tcp(raw, record)
            for raw_drop in drop_raws:
                tracker.add_drop(drop_enricher.enrich(raw_drop))

        def step(timeout_ms: int) -> None:
            feed(tcp.poll(timeout_ms), drops.poll(0))
            emit(tracker.ready())

        with StopSignals() as signals:
            run_until_stopped(step, args.duration, signals, POLL_MS)
            feed(tcp.drain(), drops.drain())
            emit(tracker.ready())
            emit(tracker.flush())
            interrupted = signals.stopped
        tcp_totals = tcp.totals()
        drop_totals = drops.totals()
        if writer is not None:
            writer.write(
                {
                    "type": "summary",
                    "connections": sum(outcomes.values()),
                    "outcomes": dict(outcomes),
                    "events": {kind.name.lower(): tcp_totals[kind].to_json() for kind in sorted(_KINDS)},
                    "drops": drop_totals.to_json(),
                    "attach": f"{tcp.attach_kind} {drops.attach_kind}",
                    "interrupted": interrupted,
                }
            )
            writer.flush()
        else:
            summary = ", ".join(f"{count} {outcome}" for outcome, count in outcomes.most_common())
            total = sum(outcomes.values())
            out.write(
                f"{total} connection{'s' if total != 1 else ''}" + (f": {summary}" if summary else "") + "\n"
            )
        lost = sum(totals.lost for totals in tcp_totals.values()) + drop_totals.lost
        sampled = sum(totals.sampled for totals in tcp_totals.values()) + drop_totals.sampled
        if lost or sampled:
            sys.stderr.write(
                f"netsleuth: {lost} events lost and {sampled} sampled away: timelines may be incomplete\n"
            )
    return 0


COMMAND = Command(
    name="conn",
    help="one timeline per connection (states, retransmits, drops, resets) ending in a verdict",
    add_arguments=add_arguments,
    run=run,
)
