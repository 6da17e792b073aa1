"""The JSON of `dns` records, declared as typed dictionaries for netsleuth.diagnostics.record_schemas (which
makes their JSON Schemas and checks every printed record against them)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from netsleuth.diagnostics.record_parts import Clock, PodRef

__all__ = ["DNS_RECORD_TYPES"]


class _DnsQuery(TypedDict):
    v: int
    time: str  # the query's first send
    pid: int | None
    comm: str
    owner: str  # "task" | "socket" | "kernel"
    container: str | None
    netns: int
    netns_name: str | None
    proto: str  # "udp" | "tcp"
    family: int
    client: str
    client_port: int
    server: str
    server_port: int
    id: int
    name: str
    qtype: str
    retransmits: int
    container_name: NotRequired[str]
    pod: NotRequired[PodRef]


class DnsDropJson(TypedDict):
    type: Literal["dns_drop"]
    v: int
    time: str
    direction: str  # "query" | "answer"
    reason: str
    location: str
    proto: str | None
    saddr: str | None
    daddr: str | None
    sport: int | None
    dport: int | None
    id: int | None
    name: str | None
    pid: int | None
    comm: str
    owner: str
    netns: int
    netns_name: str | None
    rule: str | None
    hook: str | None
    netfilter: dict[str, Any] | None
    cause: str


class DnsJson(_DnsQuery):
    type: Literal["dns"]
    latency_ms: float
    rcode: str
    answer_count: int
    answers: list[str]
    truncated: bool
    tcp_retry: bool


class DnsTimeoutJson(_DnsQuery):
    type: Literal["dns_timeout"]
    waited_ms: float
    answer_arrived_ms: float | None
    cause: str
    drop: DnsDropJson | None


class DnsUnmatchedJson(TypedDict):
    type: Literal["dns_unmatched"]
    v: int
    time: str
    pid: int | None
    comm: str
    netns: int
    proto: str | None
    client: str
    client_port: int
    server: str
    id: int
    name: str | None
    rcode: str
    late: bool


class DnsRowJson(TypedDict):
    pid: int | None
    comm: str
    server: str
    suffix: str
    queries: int
    answers: dict[str, int]  # by response code name
    timeouts: int
    truncated: int
    retransmits: int
    tcp_queries: int
    p50_ms: float | None
    p99_ms: float | None
    lookups: int
    search_expansions: int
    amplification: float | None
    names: list[str]


class DnsSummaryJson(TypedDict):
    type: Literal["summary"]
    v: int
    diagnostic: Literal["dns"]
    seen: int
    total: int
    emitted: int
    filtered: int  # answers --rcode/--slow left out (not sampled: nothing is missing)
    sampled: int
    lost: int
    ungrouped: int
    queries: int
    answers: int
    unmatched: int
    untracked: int
    retransmits: int
    dns_drops: int
    timeouts: int
    attach: str
    interrupted: bool
    clock: Clock
    rows: list[DnsRowJson]
    notes: NotRequired[list[str]]


DNS_RECORD_TYPES: dict[str, type] = {
    "dns": DnsJson,
    "dns_timeout": DnsTimeoutJson,
    "dns_unmatched": DnsUnmatchedJson,
    "dns_drop": DnsDropJson,
    "summary:dns": DnsSummaryJson,
}
