"""The sessions of the diagnostics the tcp object serves (bpf/tcp.bpf.c): `resets` and `tcp.life|states|
retrans|connlat|queues`.

Each is a `TcpSession` asked for its event kinds (emitted, or only grouped under --summary), and the
enricher that turns those kinds into records: `ResetEnricher` for resets and the aborts that come without
one, `TcpEventEnricher` for the tcp views. Totals are the kernel's exact per-kind counters, summed over the
kinds the diagnostic owns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgspec import UNSET

from netsleuth._generated.tcp_abi import EventKind
from netsleuth.diagnostics.tcp.events import SUBCOMMAND_KINDS
from netsleuth.diagnostics.tcp.program import (
    RESET_KINDS,
    KindTotals,
    RawTcpEvent,
    TcpSession,
    TcpSessionConfig,
)
from netsleuth.diagnostics.tcp.records import (
    AbortRecord,
    ResetGroup,
    ResetRecord,
    ResetsConfig,
    ResetsSummary,
    TcpConfig,
    TcpGroup,
    TcpRecord,
    TcpSummary,
)
from netsleuth.diagnostics.tcp.resets import resets_session_config
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError
from netsleuth.spec.summary import ClockPart, Summary, TotalsPart

if TYPE_CHECKING:
    from netsleuth.diagnostics.filters import PacketFilter
    from netsleuth.diagnostics.tcp.events import NetstatReader, TcpEventEnricher
    from netsleuth.diagnostics.tcp.resets import ResetEnricher
    from netsleuth.kernel.context import KernelContext

__all__ = ["RESET_KEYS", "ResetsDiagnostic", "TcpEventsDiagnostic"]

# The summary's key of each reset kind.
RESET_KEYS = {
    EventKind.RESET_SENT: "sent",
    EventKind.RESET_RECEIVED: "received",
    EventKind.RESET_FIREWALL: "firewall",
}


def _segments(group: TcpGroup) -> int:
    return group.segments if isinstance(group.segments, int) else 0


def _sum_kinds(totals: dict[EventKind, KindTotals], kinds: frozenset[EventKind]) -> EventTotals:
    return sum((totals.get(kind, KindTotals()) for kind in sorted(kinds)), EventTotals())


class _TcpDiagnostic:
    """What both sessions share: the run's KernelContext (theirs unless given), and the packet filter
    resolved on this host before anything loads (or diagnose's, already resolved)."""

    def __init__(self, context: KernelContext | None) -> None:
        from netsleuth.kernel.context import KernelContext

        self._context = context or KernelContext()
        self._own_context = context is None

    def _resolve(self, config: TcpConfig, packet_filter: PacketFilter | None) -> PacketFilter:
        try:
            return packet_filter or config.packet_filter(self._context.netns_names)
        except BaseException:
            self._close_context()
            raise

    def _close_context(self) -> None:
        if self._own_context:
            self._context.close()
            self._own_context = False

    @property
    def context(self) -> KernelContext:
        return self._context


# -- resets ------------------------------------------------------------------------------------------------


class ResetsDiagnostic(_TcpDiagnostic):
    """Every RST sent or received (and REJECT rules'), plus connections killed without one."""

    def __init__(
        self,
        config: ResetsConfig,
        context: KernelContext | None = None,
        packet_filter: PacketFilter | None = None,
    ) -> None:
        super().__init__(context)
        self.config = config
        self.packet_filter = self._resolve(config, packet_filter)
        self._session = TcpSession(
            resets_session_config(self.packet_filter, config.summary, config.stack, config.sample)
        )
        self._enricher: ResetEnricher | None = None

    @property
    def attach_kind(self) -> str:
        return self._session.attach_kind

    @property
    def raw(self) -> TcpSession:
        return self._session

    @property
    def enricher(self) -> ResetEnricher:
        if self._enricher is None:
            raise UsageError("the resets session is not started")
        return self._enricher

    def start(self) -> None:
        from netsleuth.diagnostics.tcp.resets import ResetEnricher

        self._session.start()
        self._enricher = ResetEnricher(self._context, want_stack=self.config.stack)
        self._enricher.prepare(self.packet_filter.netns)

    def poll(self, timeout_ms: int) -> list[ResetRecord | AbortRecord]:
        return self.enricher.enrich_many(self._session.poll(timeout_ms))

    def drain(self) -> list[ResetRecord | AbortRecord]:
        return self.enricher.enrich_many(self._session.drain())

    def totals(self) -> EventTotals:
        return _sum_kinds(self._session.totals(), RESET_KINDS)

    def groups(self) -> list[ResetGroup]:
        enricher = self.enricher
        groups = [
            group
            for raw in self._session.groups(RESET_KINDS | {EventKind.ERROR})
            if (group := enricher.enrich_group(raw)) is not None
        ]
        return sorted(groups, key=lambda g: -g.count)

    def summary(self, interrupted: bool) -> ResetsSummary:
        self._session.stop()  # one read of stopped counters: the total is the groups' sum (+ ungrouped)
        kinds = self._session.totals()
        groups = tuple(self.groups())
        by_key = {key: TotalsPart.of(kinds.get(kind, KindTotals())) for kind, key in RESET_KEYS.items()}
        return ResetsSummary(
            diagnostic="resets",
            **Summary.totals_fields(_sum_kinds(kinds, RESET_KINDS)),
            attach=self._session.attach_kind,
            interrupted=interrupted,
            clock=ClockPart(**self._context.clock.to_json()),
            sent=by_key["sent"],
            received=by_key["received"],
            firewall=by_key["firewall"],
            aborts=sum(group.count for group in groups if isinstance(group.example, AbortRecord)),
            groups=groups,
        )

    def program_fds(self) -> dict[str, int]:
        return self._session.program_fds()

    def notes(self) -> list[str]:
        notes = list(self._session.existing.problems)  # sockets older than the trace not walked, and why
        if self._session.attach_kind and not self._session.has_reset_reason:
            notes.append("this kernel gives no reset reasons (Linux 6.10+); causes are inferred")
        return notes

    def close(self) -> None:
        self._session.close()
        if self._enricher is not None:
            self._enricher.close()
            self._enricher = None
        self._close_context()


# -- tcp life | states | retrans | connlat | queues ------------------------------------------------------


class TcpEventsDiagnostic(_TcpDiagnostic):
    """One tcp view: the kinds it owns, emitted (or only grouped under --summary), named by one enricher."""

    def __init__(
        self,
        subcommand: str,
        config: TcpConfig,
        context: KernelContext | None = None,
        packet_filter: PacketFilter | None = None,
    ) -> None:
        from netsleuth.kernel.reasons import load_drop_reasons

        super().__init__(context)
        self.subcommand = subcommand
        self.config = config
        self.kinds = SUBCOMMAND_KINDS[subcommand]
        self.packet_filter = self._resolve(config, packet_filter)
        self._queues = subcommand == "queues"
        self._reasons = load_drop_reasons() if self._queues else None
        self._session = TcpSession(
            TcpSessionConfig(
                self.packet_filter,
                emit=frozenset() if config.summary else self.kinds,
                group=self.kinds,
                sample_every=config.sample,
                group_flows=subcommand == "retrans",
            ),
            self._reasons,
        )
        self._enricher: TcpEventEnricher | None = None
        self._netstat: NetstatReader | None = None

    @property
    def attach_kind(self) -> str:
        return self._session.attach_kind

    @property
    def enricher(self) -> TcpEventEnricher:
        if self._enricher is None:
            raise UsageError("the tcp session is not started")
        return self._enricher

    def start(self) -> None:
        from netsleuth.diagnostics.tcp.events import NetstatReader, TcpEventEnricher

        self._session.start()
        context = self._context
        context.prepare()
        self._enricher = TcpEventEnricher(context, self._reasons)
        if self._queues:
            netns = self.packet_filter.netns
            self._netstat = NetstatReader(context.netns_path(netns) if netns else None)
            self._netstat.start()

    def _enrich(self, raws: list[RawTcpEvent]) -> list[TcpRecord]:
        enrich = self.enricher.enrich
        return [record for raw in raws if (record := enrich(raw)) is not None]

    def poll(self, timeout_ms: int) -> list[TcpRecord]:
        return self._enrich(self._session.poll(timeout_ms))

    def drain(self) -> list[TcpRecord]:
        return self._enrich(self._session.drain())

    def totals(self) -> EventTotals:
        return _sum_kinds(self._session.totals(), self.kinds)

    def summary(self, interrupted: bool) -> TcpSummary:
        self._session.stop()  # one read of stopped counters: the total is the groups' sum (+ ungrouped)
        enricher = self.enricher
        groups = sorted(
            (
                group
                for raw in self._session.groups(self.kinds)
                if (group := enricher.enrich_group(raw)) is not None
            ),
            key=lambda g: -g.count,
        )
        retrans = self.subcommand == "retrans"
        return TcpSummary(
            diagnostic=f"tcp.{self.subcommand}",
            **Summary.totals_fields(self.totals()),
            attach=self._session.attach_kind,
            interrupted=interrupted,
            clock=ClockPart(**self._context.clock.to_json()),
            subcommand=self.subcommand,
            groups=tuple(groups),
            netstat=self._netstat.growth() if self._netstat is not None else UNSET,
            # Retransmitted segments (what TcpRetransSegs counts) over every group; `total` counts skbs.
            segments=sum(_segments(group) for group in groups) if retrans else UNSET,
        )

    def program_fds(self) -> dict[str, int]:
        return self._session.program_fds()

    def notes(self) -> list[str]:
        return list(self._session.existing.problems)  # sockets older than the trace not walked, and why

    def close(self) -> None:
        self._session.close()
        self._close_context()
