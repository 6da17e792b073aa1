"""The JSON of `route` records, declared as typed dictionaries for netsleuth.diagnostics.record_schemas (which
makes their JSON Schemas and checks every printed record against them)."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from netsleuth.diagnostics.record_parts import Clock, Totals

__all__ = ["ROUTE_RECORD_TYPES"]


class RouteJson(TypedDict):
    type: Literal["route"]
    v: int
    time: str
    netns: int
    netns_name: str | None
    table: int
    table_name: str
    family: int  # 4 (fib:fib_table_lookup) or 6 (fib6:fib6_table_lookup)
    result: str  # "route", "blackhole", "unreachable", "prohibit", "no match"
    err: int
    src: str
    dst: str
    proto: str | None
    sport: int | None
    dport: int | None
    iif: str | None
    oif: str | None
    mark: int
    gateway: str | None
    dev: str | None
    rule: str | None
    route: str | None
    pid: int | None
    comm: str | None
    cpu: int


class NeighJson(TypedDict):
    type: Literal["neigh"]
    v: int
    time: str
    netns: int
    netns_name: str | None
    family: int  # 4: an ARP entry, 6: a neighbour discovery entry
    event: str  # "created", "resolved", "failed", "dead"
    address: str
    dev: str
    state: str


class RouteDropJson(TypedDict):
    type: Literal["route_drop"]
    v: int
    time: str
    netns: int
    netns_name: str | None
    reason: str
    src: str | None
    dst: str | None
    proto: str | None
    dev: str


class _RouteGroup(TypedDict):
    kind: str  # "lookup", "miss", "neigh", "drop"
    count: int
    first_time: str
    last_time: str
    example: dict[str, Any]


class RouteSummaryJson(Totals):
    type: Literal["summary"]
    v: int
    diagnostic: Literal["route"]
    by_kind: dict[str, Totals]
    attach: str
    interrupted: bool
    clock: Clock
    problems: list[str]
    groups: list[_RouteGroup]


ROUTE_RECORD_TYPES: dict[str, type] = {
    "route": RouteJson,
    "neigh": NeighJson,
    "route_drop": RouteDropJson,
    "summary:route": RouteSummaryJson,
}
