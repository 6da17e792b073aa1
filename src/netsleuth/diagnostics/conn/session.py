"""`conn` attached: the tcp object's state, retransmit and reset events of the selected connections, joined
with every TCP drop on the host (the drop that kills a connection is often in another namespace) and with
conntrack's NAT translations, into one timeline and verdict per connection (tracker.py).

`conn_plan` resolves the user's typed `ConnConfig` on this host before anything loads: the exact selection
of connections (user space), and the broader kernel filters of the tcp and drops programs.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from netsleuth.diagnostics.conn.records import ConnConfig, ConnRecord, ConnSummary
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.diagnostics.tcp.program import RESET_KINDS
from netsleuth.diagnostics.totals import EventTotals

if TYPE_CHECKING:
    from netsleuth._generated.tcp_abi import EventKind
    from netsleuth.diagnostics.conn.tracker import ConnReport, ConnSelector, ConnTracker
    from netsleuth.diagnostics.drops.session import DropsDiagnostic
    from netsleuth.diagnostics.tcp.program import KindTotals, TcpSession
    from netsleuth.diagnostics.tcp.resets import ResetEnricher
    from netsleuth.kernel.conntrack import ConntrackReader
    from netsleuth.kernel.context import KernelContext
    from netsleuth.kernel.netns import NetnsNames
    from netsleuth.spec.records import Record

__all__ = ["ConnDiagnostic", "ConnPlan", "conn_plan"]

_TCP = 6


@dataclass(frozen=True)
class ConnPlan:
    """A `ConnConfig` resolved on this host: which connections are reported (`selector`, exact, in user
    space), what the tcp and drops programs are filtered by in the kernel, and the namespaces whose
    conntrack the NAT join reads (None: every one)."""

    selector: ConnSelector
    tcp_filter: PacketFilter
    drops_filter: PacketFilter
    conntrack_namespaces: tuple[str, ...] | None = None


def conn_plan(config: ConnConfig, names: NetnsNames | None = None) -> ConnPlan:
    """The exact selector (user space) and the broader kernel filters for the tcp and drops programs. A
    namespace, pod or process this host does not have is a UsageError."""
    import msgspec

    from netsleuth.diagnostics.conn.tracker import ConnSelector

    packet_filter = config.packet_filter(names)
    server_port = config.server_port()
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
    if packet_filter.hosts and (packet_filter.sources or packet_filter.destinations):
        hosts = packet_filter.hosts  # both must hold; the selector checks the rest
    tcp_filter = msgspec.structs.replace(
        packet_filter,
        proto=None,
        hosts=hosts,
        sources=(),
        destinations=(),
        port=packet_filter.port or server_port or packet_filter.sport,
        sport=None,
        dport=None,
    )
    # Drops anywhere on the host: the one that kills a connection is often in another namespace, and after a
    # DNAT its packets no longer carry the server end, so only the client end narrows them in the kernel
    # (docs/conn.md "Through NAT"); the selector and the NAT join pick the connection's own.
    drops_filter = PacketFilter(
        proto=_TCP, hosts=packet_filter.sources, port=packet_filter.sport, family=packet_filter.family
    )
    conntrack_namespaces = None
    if config.confined_netns:
        # A fleet task's scope: the drop program and the NAT join see only its namespaces (and addresses).
        inodes = config.confined_netns
        drops_filter = msgspec.structs.replace(
            drops_filter,
            netns=inodes[0] if len(inodes) == 1 else None,
            netns_set=frozenset(inodes) if len(inodes) > 1 else frozenset(),
            hosts=drops_filter.hosts or config.confined_networks,
        )
        conntrack_namespaces = _namespace_files(inodes, names)
    return ConnPlan(selector, tcp_filter, drops_filter, conntrack_namespaces)


def _namespace_files(inodes: Sequence[int], names: NetnsNames | None) -> tuple[str, ...]:
    """A file that enters each namespace (for its conntrack table); this process's own by /proc/self."""
    from netsleuth.kernel.netns import NetnsNames

    names = names or NetnsNames()
    own = os.stat("/proc/self/ns/net").st_ino
    files = []
    for inode in inodes:
        path = "/proc/self/ns/net" if inode == own else names.path_of(inode)
        if path is not None:
            files.append(path)
    return tuple(files)


class ConnDiagnostic:
    def __init__(self, config: ConnConfig, context: KernelContext | None = None) -> None:
        from netsleuth._generated.tcp_abi import EventKind
        from netsleuth.diagnostics.drops.program import DropsProgramConfig, forced_fallbacks
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
        self.plan = conn_plan(config, self._context.netns_names)
        self._tcp: TcpSession = TcpSession(
            TcpSessionConfig(self.plan.tcp_filter, emit=self._kinds, sample_every=config.sample)
        )
        # The drops program's fallbacks NETSLEUTH_DROPS_FALLBACK forces, as for `drops`.
        fallbacks: dict[str, Any] = forced_fallbacks()
        self._drops: DropsDiagnostic = DropsDiagnostic(
            DropsProgramConfig(packet_filter=self.plan.drops_filter, **fallbacks), self._context
        )
        self._resets: ResetEnricher | None = None
        self._conntrack: ConntrackReader | None = None
        self._tracker: ConnTracker | None = None
        self._outcomes: Counter[str] = Counter()

    @property
    def attach_kind(self) -> str:
        return f"{self._tcp.attach_kind} {self._drops.attach_kind}"

    def start(self) -> None:
        from netsleuth.diagnostics.conn.tracker import ConnTracker
        from netsleuth.diagnostics.tcp.resets import ResetEnricher
        from netsleuth.kernel.conntrack import ConntrackReader

        self._tcp.start()
        self._drops.start()
        self._context.prepare()
        self._resets = ResetEnricher(self._context)
        self._resets.prepare(self.plan.tcp_filter.netns)
        # Joins packets rewritten by a NAT on this host (docs/conn.md).
        self._conntrack = ConntrackReader(namespaces=self.plan.conntrack_namespaces)
        self._tracker = ConnTracker(self.plan.selector, self._context, conntrack=self._conntrack)
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
        return [report.record(self._context.netns_name) for report in reports]

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
        from netsleuth.spec.summary import ClockPart, TotalsPart

        return ConnSummary(
            connections=sum(self._outcomes.values()),
            outcomes=dict(self._outcomes),
            events={kind.name.lower(): TotalsPart.of(totals) for kind, totals in self._kind_totals().items()},
            drops=TotalsPart.of(self._drops.totals()),
            attach=self.attach_kind,
            interrupted=interrupted,
            clock=ClockPart(**self._context.clock.to_json()),
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
