"""`conn` as a registered diagnostic: the tcp object's state, retransmit and reset events of the selected
connections, joined with every TCP drop on the host (the drop that kills a connection is often in another
namespace) and with conntrack's NAT translations, into one timeline and verdict per connection."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from netsleuth.diagnostics.filters import FILTER_KEYS, PacketFilter, parse_port, read_tcp_filter
from netsleuth.diagnostics.model import ConfigInput, DiagnosticSpec, Record, RunOptions
from netsleuth.diagnostics.schema import SCHEMA_VERSIONS
from netsleuth.diagnostics.tcp.program import RESET_KINDS
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError

if TYPE_CHECKING:
    from netsleuth._generated.tcp_abi import EventKind
    from netsleuth.diagnostics.conn import ConnReport, ConnSelector, ConnTracker
    from netsleuth.diagnostics.drops.session import DropsDiagnostic
    from netsleuth.diagnostics.tcp.program import KindTotals, TcpSession
    from netsleuth.diagnostics.tcp.resets import ResetEnricher
    from netsleuth.kernel.conntrack import ConntrackReader
    from netsleuth.kernel.context import KernelClock, KernelContext

__all__ = ["DIAGNOSTIC", "ConnConfig", "ConnDiagnostic", "ConnRecord", "ConnSummary", "split_endpoint"]

_TCP = 6


def split_endpoint(text: str) -> tuple[str, int | None]:
    """`198.18.0.2:80` / `[2001:db8::2]:80` -> (address, port); a bare address or prefix has no port."""
    if text.startswith("["):
        address, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise UsageError(f"--dst {text!r}: write an IPv6 endpoint as [ADDR]:PORT")
        return address, parse_port(rest[1:], "--dst port", "dst") if rest else None
    if text.count(":") == 1:
        address, _, port = text.partition(":")
        return address, parse_port(port, "--dst port", "dst")
    return text, None


@dataclass(frozen=True)
class ConnConfig:
    selector: ConnSelector
    tcp_filter: PacketFilter
    drops_filter: PacketFilter
    run: RunOptions = field(default_factory=RunOptions)
    # The namespaces whose conntrack the NAT join reads (names or namespace files); None: every one.
    conntrack_namespaces: tuple[str, ...] | None = None
    # Also emit, as their own drop/reset records, those no connection here claimed: where the connection's
    # socket is on another host, a fleet joins them with that host's report (fleet/diagnostic_source.py).
    report_unclaimed: bool = False
    # The drops program's fallbacks NETSLEUTH_DROPS_FALLBACK forces (DropsProgramConfig fields), as for
    # `drops`.
    drops_fallbacks: tuple[tuple[str, bool], ...] = ()

    @property
    def run_options(self) -> RunOptions:
        # conn's --summary prints verdicts without timelines: the kernel still has to send every event.
        return RunOptions(summary=False, sample=self.run.sample, duration=self.run.duration)


def read_conn_config(values: ConfigInput) -> ConnConfig:
    """The exact selector (userspace) and the broader kernel filters for the tcp and drops programs. Here
    --dst names the server end and may carry its port."""
    from netsleuth.diagnostics.conn import ConnSelector

    destinations, ports = [], set()
    for text in values.texts("dst"):
        address, port = split_endpoint(text)
        destinations.append(address)
        if port is not None:
            ports.add(port)
    if len(ports) > 1:
        raise UsageError("give one server port: --dst endpoints with different ports cannot be combined")
    run = RunOptions.read(values)
    packet_filter = read_tcp_filter(values.replace(dst=destinations))
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
    # Drops anywhere on the host: the one that kills a connection is often in another namespace, and after a
    # DNAT its packets no longer carry the server end, so only the client end narrows them in the kernel
    # (docs/conn.md "Through NAT"); the selector and the NAT join pick the connection's own.
    drops_filter = PacketFilter(
        proto=_TCP, hosts=packet_filter.sources, port=packet_filter.sport, family=packet_filter.family
    )
    from netsleuth.diagnostics.drops.program import forced_fallbacks

    fallbacks = tuple(sorted(forced_fallbacks().items()))
    return ConnConfig(selector, tcp_filter, drops_filter, run, drops_fallbacks=fallbacks)


@dataclass(frozen=True)
class ConnRecord:
    """One finished (or still running, at the end) connection with its timeline and verdict."""

    report: ConnReport
    netns_name: Callable[[int], str | None]

    def to_json(self) -> dict[str, Any]:
        return {**self.report.to_json(self.netns_name), "v": SCHEMA_VERSIONS["conn"]}


@dataclass(frozen=True)
class ConnSummary:
    outcomes: dict[str, int]
    events: dict[str, EventTotals]
    drops: EventTotals
    attach: str
    interrupted: bool
    clock: KernelClock

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "summary",
            "v": SCHEMA_VERSIONS["summary"],
            "diagnostic": "conn",
            "connections": sum(self.outcomes.values()),
            "outcomes": self.outcomes,
            "events": {kind: totals.to_json() for kind, totals in self.events.items()},
            "drops": self.drops.to_json(),
            "attach": self.attach,
            "interrupted": self.interrupted,
            "clock": self.clock.to_json(),
        }


class ConnDiagnostic:
    def __init__(self, config: ConnConfig, context: KernelContext | None = None) -> None:
        from netsleuth._generated.tcp_abi import EventKind
        from netsleuth.diagnostics.drops.program import DropsProgramConfig
        from netsleuth.diagnostics.drops.session import DropsDiagnostic
        from netsleuth.diagnostics.tcp.program import TcpSession, TcpSessionConfig
        from netsleuth.kernel.context import KernelContext

        self.config = config
        self._kinds = RESET_KINDS | {
            EventKind.STATE,
            EventKind.RETRANS,
            EventKind.SYNACK_RETRANS,
            EventKind.ERROR,
        }
        self._context = context or KernelContext()
        self._own_context = context is None
        self._tcp: TcpSession = TcpSession(
            TcpSessionConfig(config.tcp_filter, emit=self._kinds, sample_every=config.run.sample)
        )
        fallbacks: dict[str, Any] = dict(config.drops_fallbacks)
        self._drops: DropsDiagnostic = DropsDiagnostic(
            DropsProgramConfig(packet_filter=config.drops_filter, **fallbacks), self._context
        )
        self._resets: ResetEnricher | None = None
        self._conntrack: ConntrackReader | None = None
        self._tracker: ConnTracker | None = None
        self._outcomes: Counter[str] = Counter()

    @property
    def attach_kind(self) -> str:
        return f"{self._tcp.attach_kind} {self._drops.attach_kind}"

    def start(self) -> None:
        from netsleuth.diagnostics.conn import ConnTracker
        from netsleuth.diagnostics.tcp.resets import ResetEnricher
        from netsleuth.kernel.conntrack import ConntrackReader

        self._tcp.start()
        self._drops.start()
        self._context.prepare()
        self._resets = ResetEnricher(self._context)
        self._resets.prepare(self.config.tcp_filter.netns)
        # Joins packets rewritten by a NAT on this host (docs/conn.md).
        self._conntrack = ConntrackReader(namespaces=self.config.conntrack_namespaces)
        self._tracker = ConnTracker(self.config.selector, self._context, conntrack=self._conntrack)
        self._tracker.keep_unclaimed = self.config.report_unclaimed

    def _feed(self, tcp_raws: list[Any], drops: Sequence[Any]) -> list[ConnRecord]:
        assert self._resets is not None and self._tracker is not None
        for raw, record in self._resets.enrich_pairs(tcp_raws):
            self._tracker.add_tcp(raw, record)
        for drop in drops:
            self._tracker.add_drop(drop)
        return self._records(self._tracker.ready())

    def _records(self, reports: list[ConnReport]) -> list[ConnRecord]:
        for report in reports:
            self._outcomes[report.outcome] += 1
        return [ConnRecord(report, self._context.netns_name) for report in reports]

    def _unclaimed(self) -> list[Record]:
        assert self._tracker is not None
        return list(self._tracker.take_unclaimed())

    def poll(self, timeout_ms: int) -> list[Record]:
        return [*self._feed(self._tcp.poll(timeout_ms), self._drops.poll(0)), *self._unclaimed()]

    def drain(self) -> list[Record]:
        assert self._tracker is not None
        records = self._feed(self._tcp.drain(), self._drops.drain())
        return [*records, *self._records(self._tracker.flush()), *self._unclaimed()]

    def _kind_totals(self) -> dict[EventKind, KindTotals]:
        totals = self._tcp.totals()
        return {kind: totals[kind] for kind in sorted(self._kinds) if kind in totals}

    def totals(self) -> EventTotals:
        return sum(self._kind_totals().values(), EventTotals()) + self._drops.totals()

    def summary(self, interrupted: bool) -> ConnSummary:
        return ConnSummary(
            dict(self._outcomes),
            {kind.name.lower(): totals for kind, totals in self._kind_totals().items()},
            self._drops.totals(),
            self.attach_kind,
            interrupted,
            self._context.clock,
        )

    def program_fds(self) -> dict[str, int]:
        return {**self._tcp.program_fds(), **self._drops.program_fds()}

    def notes(self) -> list[str]:
        return self._drops.notes()

    def close(self) -> None:
        self._tcp.close()
        self._drops.close()
        if self._conntrack is not None:
            self._conntrack.close()
            self._conntrack = None
        if self._resets is not None:
            self._resets.close()
            self._resets = None
        if self._own_context:
            self._context.close()


DIAGNOSTIC: DiagnosticSpec[ConnConfig] = DiagnosticSpec(
    name="conn",
    help="one timeline per connection (states, retransmits, drops, resets) ending in a verdict",
    keys=(*FILTER_KEYS, *RunOptions.KEYS),
    read=read_conn_config,
    open=lambda config, context: ConnDiagnostic(config, context),
    objects=("tcp", "drops"),
    records=("conn", "summary"),
    needs=("can_trace", "btf", "raw_tp"),  # tp_btf, or raw_tp where it is missing; a perf buffer will do
)
