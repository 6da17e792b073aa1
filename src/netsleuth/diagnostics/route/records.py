"""`route`'s config and records: what a user asks for, and what each lookup, neighbour event and drop reads
as (the rule, table and prefix that decided a lookup are named when the record is built)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from netsleuth.spec.common import PacketConfig
from netsleuth.spec.configs import ConfigError
from netsleuth.spec.options import Opt
from netsleuth.spec.records import Record, WallTime
from netsleuth.spec.scope import AddressField, AddressText, NetnsField
from netsleuth.spec.summary import Summary, TotalsPart

__all__ = [
    "NeighRecord",
    "RouteConfig",
    "RouteDropRecord",
    "RouteGroup",
    "RouteLookupRecord",
    "RouteRecord",
    "RouteSummary",
]

# -- config --------------------------------------------------------------------------------------------


class RouteConfig(PacketConfig, frozen=True, kw_only=True):
    failed: Annotated[
        bool,
        Opt("only reject routes (blackhole, unreachable, prohibit), failed/dead next hops and their drops"),
    ] = False
    misses: Annotated[bool, Opt("also the tables the rules tried that had no matching route")] = False

    def check(self) -> None:
        super().check()
        if self.failed and self.misses:
            raise ConfigError(
                "misses",
                "shows lookups that found nothing to decide; it cannot go with --failed",
                flag="--misses",
            )


# -- records -------------------------------------------------------------------------------------------


class RouteLookupRecord(Record, frozen=True, kw_only=True, tag="route"):
    """One route lookup, named: which rule sent it to which table, which prefix matched, with what result."""

    time: WallTime
    netns: NetnsField
    netns_name: str | None
    table: int
    table_name: str
    family: int  # 4 (fib:fib_table_lookup) or 6 (fib6:fib6_table_lookup)
    result: str  # "route", "blackhole", "unreachable", "prohibit", "no match"
    err: int
    src: AddressText
    dst: AddressText
    proto: str | None  # "udp"...; None: the lookup named no protocol
    sport: int | None
    dport: int | None
    iif: str | None
    oif: str | None
    mark: int
    gateway: str | None
    dev: str | None
    rule: str | None  # "1000: from 198.18.3.0/24 lookup 100"
    route: str | None  # "blackhole 198.18.5.0/24"
    pid: int | None  # the task whose syscall looked it up; None in softirq
    comm: str | None
    cpu: int


class NeighRecord(Record, frozen=True, kw_only=True, tag="neigh"):
    """A next hop's neighbour entry: created (resolution starts), resolved, failed (nobody answered), dead."""

    time: WallTime
    netns: NetnsField
    netns_name: str | None
    family: int  # 4: an ARP entry, 6: a neighbour discovery entry
    event: str  # "created", "resolved", "failed", "dead"
    address: AddressText
    dev: str
    state: str  # NUD states: "INCOMPLETE|PROBE"...


class RouteDropRecord(Record, frozen=True, kw_only=True, tag="route_drop"):
    """A packet the kernel dropped because its next hop did not resolve (NEIGH_FAILED, NEIGH_QUEUEFULL...)."""

    time: WallTime
    netns: NetnsField
    netns_name: str | None
    reason: str
    src: AddressField
    dst: AddressField
    proto: str | None
    dev: str


RouteRecord = RouteLookupRecord | NeighRecord | RouteDropRecord


class RouteGroup(msgspec.Struct, frozen=True, kw_only=True):
    """Exact count of one decision (kernel groups), with the first event of the group as its example."""

    kind: str  # "lookup", "miss", "neigh", "drop"
    count: int
    first_time: WallTime
    last_time: WallTime
    example: RouteRecord


class RouteSummary(Summary, frozen=True, kw_only=True, tag="summary"):
    # Every kind's exact totals; the summary's own totals are their sum (table misses included).
    by_kind: dict[str, TotalsPart]
    problems: tuple[str, ...]  # namespaces whose rules and routes could not be read, and why
    groups: tuple[RouteGroup, ...]
