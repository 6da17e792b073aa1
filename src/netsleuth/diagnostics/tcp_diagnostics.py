"""The diagnostics the tcp object serves (bpf/tcp.bpf.c): `resets` and `tcp.life|states|retrans|connlat|
queues`.

Each is a `TcpSession` asked for its event kinds (emitted, or only grouped under --summary), and the
enricher that turns those kinds into records: `ResetEnricher` for resets and the aborts that come without
one, `TcpEventEnricher` for the tcp views. Totals are the kernel's exact per-kind counters, summed over the
kinds the diagnostic owns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from netsleuth._generated.tcp_abi import EventKind
from netsleuth.diagnostics.filters import FILTER_KEYS, PacketFilter, read_packet_filter
from netsleuth.diagnostics.model import ConfigInput, DiagnosticSpec, RunOptions
from netsleuth.diagnostics.schema import SCHEMA_VERSIONS
from netsleuth.diagnostics.tcp_session import KindTotals, TcpSession, TcpSessionConfig
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError

if TYPE_CHECKING:
    from netsleuth.diagnostics.resets import AbortRecord, ResetEnricher, ResetGroup, ResetRecord
    from netsleuth.diagnostics.tcp_events import NetstatReader, TcpEventEnricher, TcpGroupRecord, TcpRecord
    from netsleuth.kernel.context import KernelClock, KernelContext

__all__ = [
    "DIAGNOSTICS",
    "RESET_LABELS",
    "TCP_SUBCOMMANDS",
    "ResetsConfig",
    "ResetsDiagnostic",
    "ResetsSummary",
    "TcpEventsConfig",
    "TcpEventsDiagnostic",
    "TcpEventsSummary",
    "read_tcp_filter",
]

_TCP = 6
RESET_KINDS = frozenset({EventKind.RESET_SENT, EventKind.RESET_RECEIVED, EventKind.RESET_FIREWALL})
# Summary keys and text labels of the three reset kinds.
RESET_LABELS = {
    EventKind.RESET_SENT: ("sent", "resets sent by the TCP stack"),
    EventKind.RESET_RECEIVED: ("received", "resets received"),
    EventKind.RESET_FIREWALL: ("firewall", "resets sent by firewall REJECT rules"),
}
TCP_SUBCOMMANDS = ("life", "states", "retrans", "connlat", "queues")


def read_tcp_filter(values: ConfigInput) -> PacketFilter:
    """The shared filters, minus the ones that cannot apply to TCP sockets."""
    packet_filter = read_packet_filter(values)
    if packet_filter.proto not in (None, _TCP):
        raise UsageError("this command traces TCP: --proto can only be tcp")
    if packet_filter.dev is not None:
        raise UsageError("--dev does not apply here: TCP events belong to sockets, not interfaces")
    return packet_filter


def _sum_kinds(totals: dict[EventKind, KindTotals], kinds: frozenset[EventKind]) -> EventTotals:
    return sum((totals.get(kind, KindTotals()) for kind in sorted(kinds)), EventTotals())


# -- resets ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResetsConfig:
    packet_filter: PacketFilter = field(default_factory=PacketFilter)
    stack: bool = False
    run: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        if self.run.summary and self.stack:
            raise UsageError("--stack needs individual resets: it cannot be combined with --summary")

    @property
    def run_options(self) -> RunOptions:
        return self.run


def read_resets_config(values: ConfigInput) -> ResetsConfig:
    return ResetsConfig(read_tcp_filter(values), values.flag("stack"), RunOptions.read(values))


@dataclass(frozen=True)
class ResetsSummary:
    totals: dict[EventKind, KindTotals]
    groups: tuple[ResetGroup, ...]
    attach: str
    interrupted: bool
    clock: KernelClock

    @property
    def aborts(self) -> int:
        from netsleuth.diagnostics.resets import AbortRecord

        return sum(group.count for group in self.groups if isinstance(group.example, AbortRecord))

    def labelled_totals(self) -> dict[str, KindTotals]:
        return {label: self.totals.get(kind, KindTotals()) for kind, (_, label) in RESET_LABELS.items()}

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "type": "summary",
            "v": SCHEMA_VERSIONS["summary"],
            "diagnostic": "resets",
            "attach": self.attach,
            "interrupted": self.interrupted,
        }
        for kind, (key, _) in RESET_LABELS.items():
            data[key] = self.totals.get(kind, KindTotals()).to_json()
        data["total"] = sum(self.totals.get(kind, KindTotals()).matched for kind in RESET_KINDS)
        data["aborts"] = self.aborts
        data["clock"] = self.clock.to_json()
        data["groups"] = [group.to_json() for group in self.groups]
        return data


class ResetsDiagnostic:
    """Every RST sent or received (and REJECT rules'), plus connections killed without one."""

    def __init__(self, config: ResetsConfig, context: KernelContext | None = None) -> None:
        from netsleuth.diagnostics.resets import resets_session_config

        self.config = config
        self._session = TcpSession(
            resets_session_config(config.packet_filter, config.run.summary, config.stack, config.run.sample)
        )
        self._context = context
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
        from netsleuth.diagnostics.resets import ResetEnricher

        self._session.start()
        self._enricher = ResetEnricher(self._context, want_stack=self.config.stack)
        self._enricher.prepare(self.config.packet_filter.netns)

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
        return ResetsSummary(
            self._session.totals(),
            tuple(self.groups()),
            self._session.attach_kind,
            interrupted,
            self.enricher.context.clock,
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


# -- tcp life | states | retrans | connlat | queues ------------------------------------------------------


@dataclass(frozen=True)
class TcpEventsConfig:
    subcommand: str
    packet_filter: PacketFilter = field(default_factory=PacketFilter)
    run: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        if self.subcommand not in TCP_SUBCOMMANDS:
            raise UsageError(f"tcp has no view {self.subcommand!r}; it has {', '.join(TCP_SUBCOMMANDS)}")

    @property
    def run_options(self) -> RunOptions:
        return self.run

    @property
    def kinds(self) -> frozenset[EventKind]:
        from netsleuth.diagnostics.tcp_events import SUBCOMMAND_KINDS

        return SUBCOMMAND_KINDS[self.subcommand]


@dataclass(frozen=True)
class TcpEventsSummary:
    subcommand: str
    totals: EventTotals
    attach: str
    interrupted: bool
    groups: tuple[TcpGroupRecord, ...]
    netstat: dict[str, int] | None  # TcpExt growth during the trace (queues)
    clock: KernelClock

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "type": "summary",
            "v": SCHEMA_VERSIONS["summary"],
            "diagnostic": f"tcp.{self.subcommand}",
            "subcommand": self.subcommand,
            **self.totals.to_json(),
            "attach": self.attach,
            "interrupted": self.interrupted,
            "clock": self.clock.to_json(),
            "groups": [group.to_json() for group in self.groups],
        }
        if self.netstat is not None:
            data["netstat"] = self.netstat
        if self.subcommand == "retrans":
            data["segments"] = self.segments
        return data

    @property
    def segments(self) -> int:
        """Retransmitted segments (what TcpRetransSegs counts) over every group; `total` counts skbs."""
        return sum(group.segs for group in self.groups)


class TcpEventsDiagnostic:
    """One tcp view: the kinds it owns, emitted (or only grouped under --summary), named by one enricher."""

    def __init__(self, config: TcpEventsConfig, context: KernelContext | None = None) -> None:
        from netsleuth.kernel.reasons import load_drop_reasons

        self.config = config
        self._queues = config.subcommand == "queues"
        self._reasons = load_drop_reasons() if self._queues else None
        kinds = config.kinds
        self._session = TcpSession(
            TcpSessionConfig(
                config.packet_filter,
                emit=frozenset() if config.run.summary else kinds,
                group=kinds,
                sample_every=config.run.sample,
                group_flows=config.subcommand == "retrans",
            ),
            self._reasons,
        )
        self._context = context
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
        from netsleuth.diagnostics.tcp_events import NetstatReader, TcpEventEnricher
        from netsleuth.kernel.context import KernelContext

        self._session.start()
        context = self._context or KernelContext()
        self._context = context
        context.prepare()
        self._enricher = TcpEventEnricher(context, self._reasons)
        if self._queues:
            netns = self.config.packet_filter.netns
            self._netstat = NetstatReader(context.netns_path(netns) if netns else None)
            self._netstat.start()

    def _enrich(self, raws: list[Any]) -> list[TcpRecord]:
        enrich = self.enricher.enrich
        return [record for raw in raws if (record := enrich(raw)) is not None]

    def poll(self, timeout_ms: int) -> list[TcpRecord]:
        return self._enrich(self._session.poll(timeout_ms))

    def drain(self) -> list[TcpRecord]:
        return self._enrich(self._session.drain())

    def totals(self) -> EventTotals:
        return _sum_kinds(self._session.totals(), self.config.kinds)

    def summary(self, interrupted: bool) -> TcpEventsSummary:
        enricher = self.enricher
        groups = [
            group
            for raw in self._session.groups(self.config.kinds)
            if (group := enricher.enrich_group(raw)) is not None
        ]
        return TcpEventsSummary(
            self.config.subcommand,
            self.totals(),
            self._session.attach_kind,
            interrupted,
            tuple(sorted(groups, key=lambda g: -g.count)),
            self._netstat.growth() if self._netstat is not None else None,
            enricher.context.clock,
        )

    def program_fds(self) -> dict[str, int]:
        return self._session.program_fds()

    def notes(self) -> list[str]:
        return list(self._session.existing.problems)  # sockets older than the trace not walked, and why

    def close(self) -> None:
        self._session.close()


def _view_reader(name: str) -> Callable[[ConfigInput], TcpEventsConfig]:
    def read(values: ConfigInput) -> TcpEventsConfig:
        return TcpEventsConfig(name, read_tcp_filter(values), RunOptions.read(values))

    return read


TCP_HELP = {
    "life": "each connection's life when it closes: process, endpoints, duration, bytes (like tcplife)",
    "states": "every TCP state change with the time spent in the previous state (like tcpstates)",
    "retrans": "retransmits: SYN, SYN-ACK, tail loss probe, timeout, fast; per-flow counts (like tcpretrans)",
    "connlat": "connect latency per process and destination, and failed connects with errno (like "
    "tcpconnlat)",
    "queues": "accept-queue overflows, receive-buffer and memory drops, SYN-queue counters, with owners",
}
_RECORD_OF_VIEW = {
    "life": "life",
    "states": "state",
    "retrans": "retrans",
    "connlat": "connect",
    "queues": "queue",
}

# tp_btf, or raw_tp where it is missing; events go through a perf buffer on a kernel without ring buffers.
TCP_NEEDS = ("can_trace", "btf", "raw_tp")

DIAGNOSTICS: dict[str, DiagnosticSpec[Any]] = {
    "resets": DiagnosticSpec(
        name="resets",
        help="every TCP reset sent or received: state, trigger, kernel reason, owner, and why in plain words",
        keys=(*FILTER_KEYS, *RunOptions.KEYS, "stack"),
        read=read_resets_config,
        open=lambda config, context: ResetsDiagnostic(config, context),
        objects=("tcp",),
        records=("reset", "abort", "summary"),
        needs=TCP_NEEDS,
    ),
    **{
        f"tcp.{name}": DiagnosticSpec(
            name=f"tcp.{name}",
            help=text,
            keys=(*FILTER_KEYS, *RunOptions.KEYS),
            read=_view_reader(name),
            open=lambda config, context: TcpEventsDiagnostic(config, context),
            objects=("tcp",),
            records=(_RECORD_OF_VIEW[name], "summary"),
            needs=TCP_NEEDS,
        )
        for name, text in TCP_HELP.items()
    },
}
