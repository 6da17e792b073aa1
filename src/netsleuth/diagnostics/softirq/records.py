"""`softirq`'s config and its one record, the summary: per vector (and per CPU) how long raised softirqs wait
and run, what NET_RX runs did against their budget, and each NAPI instance's polls.

Times are log2 buckets of nanoseconds, packet counts buckets 0, 1, 2-3, 4-7...; a histogram is {lower
bucket edge: count} of its non-empty buckets, and a percentile the upper edge of the bucket it falls in.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from netsleuth.spec.common import CountConfig
from netsleuth.spec.options import Ifname, NetnsRef, Opt, SoftirqName
from netsleuth.spec.scope import NetnsField
from netsleuth.spec.summary import Summary

__all__ = ["NapiPart", "NetRxPart", "SoftirqConfig", "SoftirqSummary", "TimesPart", "VectorPart"]


class SoftirqConfig(CountConfig, frozen=True, kw_only=True):
    """Every vector and NAPI instance is measured; the filters choose what is shown."""

    vector: Annotated[
        tuple[SoftirqName, ...], Opt("show only this vector (NET_RX, TIMER...; repeatable)", metavar="VECTOR")
    ] = ()
    netns: Annotated[
        NetnsRef | None,
        Opt("NAPI instances of devices in this network namespace only", label="network namespace"),
    ] = None
    dev: Annotated[Ifname | None, Opt("NAPI instances of this device only", label="interface")] = None


class TimesPart(msgspec.Struct, frozen=True, kw_only=True):
    """How long (nanoseconds): raise -> entry (latency) or entry -> exit (duration)."""

    count: int
    mean_ns: int | None
    p50_ns: int | None  # the upper edge of the log2 bucket
    p99_ns: int | None
    max_ns: int | None
    histogram_ns: dict[str, int]  # lower bucket edge -> count


class VectorPart(msgspec.Struct, frozen=True, kw_only=True):
    """One vector on one CPU, or on all of them (cpu null)."""

    vector: str
    cpu: int | None
    raised: int
    runs: int
    latency: TimesPart  # raise -> entry
    duration: TimesPart  # entry -> exit


class NetRxPart(msgspec.Struct, frozen=True, kw_only=True):
    """What net_rx_action did on one CPU (or all: cpu null), from the NAPI polls of each run."""

    cpu: int | None
    runs: int
    polls: int
    packets: int
    packets_per_run: float | None
    budget_runs: int  # stopped with netdev_budget packets done
    time_runs: int  # lasted netdev_budget_usecs or longer
    exhausted_polls: int  # NAPI polls that used their whole budget (weight)
    packets_per_run_histogram: dict[str, int]  # lower bucket edge -> runs


class NapiPart(msgspec.Struct, frozen=True, kw_only=True):
    dev: str  # "" for a CPU's backlog (netif_rx, RPS)
    ifindex: int
    netns: NetnsField
    netns_name: str | None
    napi_id: int
    budget: int
    polls: int
    polls_by_cpu: dict[str, int]
    packets: int
    exhausted_polls: int
    idle_polls: int
    max_packets: int
    packets_per_poll_histogram: dict[str, int]  # lower bucket edge -> polls


class SoftirqSummary(Summary, frozen=True, kw_only=True, tag="summary"):
    """Softirq runs are the events: every one counted (`seen` = `total`), none sent."""

    seconds: float
    netdev_budget: int
    netdev_budget_usecs: int
    vectors: tuple[VectorPart, ...]  # each shown vector over every CPU
    per_cpu: tuple[VectorPart, ...]  # each shown vector on each CPU
    net_rx: NetRxPart | None  # every CPU's runs together
    net_rx_per_cpu: tuple[NetRxPart, ...]
    napi: tuple[NapiPart, ...]  # most polled first

    def vector(self, name: str) -> VectorPart | None:
        """The vector's totals over every CPU (None when it is not shown)."""
        return next((part for part in self.vectors if part.vector == name), None)
