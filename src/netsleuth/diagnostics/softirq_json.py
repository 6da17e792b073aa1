"""The JSON of `softirq`'s summary, declared as typed dictionaries for netsleuth.diagnostics.record_schemas
(which makes its JSON Schema and checks every printed summary against it)."""

from __future__ import annotations

from typing import Literal, TypedDict

from netsleuth.diagnostics.record_parts import Clock

__all__ = ["SOFTIRQ_RECORD_TYPES"]


class _Side(TypedDict):
    count: int
    mean_ns: int | None
    p50_ns: int | None  # upper edge of the log2 bucket
    p99_ns: int | None
    max_ns: int | None
    histogram_ns: dict[str, int]  # lower bucket edge -> count


class _Vector(TypedDict):
    vector: str
    cpu: int | None
    raised: int
    runs: int
    latency: _Side  # raise -> entry
    duration: _Side  # entry -> exit


class _NetRx(TypedDict):
    cpu: int | None
    runs: int
    polls: int
    packets: int
    packets_per_run: float | None
    budget_runs: int
    time_runs: int
    exhausted_polls: int
    packets_per_run_histogram: dict[str, int]


class _Napi(TypedDict):
    dev: str  # "" for a CPU's backlog (netif_rx, RPS)
    ifindex: int
    netns: int
    netns_name: str | None
    napi_id: int
    budget: int
    polls: int
    polls_by_cpu: dict[str, int]
    packets: int
    exhausted_polls: int
    idle_polls: int
    max_packets: int
    packets_per_poll_histogram: dict[str, int]


class SoftirqSummaryJson(TypedDict):
    type: Literal["summary"]
    v: int
    diagnostic: Literal["softirq"]
    seconds: float
    netdev_budget: int
    netdev_budget_usecs: int
    vectors: list[_Vector]
    per_cpu: list[_Vector]
    net_rx: _NetRx | None
    net_rx_per_cpu: list[_NetRx]
    napi: list[_Napi]
    attach: str
    interrupted: bool
    clock: Clock


SOFTIRQ_RECORD_TYPES: dict[str, type] = {"summary:softirq": SoftirqSummaryJson}
