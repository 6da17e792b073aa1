"""The softirq programs' counters as numbers (bpf/softirq.bpf.c): log2 histograms and their percentiles, one
vector's counts on one CPU, what NET_RX did on one CPU, one NAPI instance - added up over CPUs here, then
written as the summary record (`softirq_summary`). Pure data: `doctor` measures with the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from netsleuth.diagnostics.softirq.records import NapiPart, NetRxPart, SoftirqSummary, TimesPart, VectorPart
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.spec.summary import ClockPart, Summary

__all__ = [
    "CountHistogram",
    "Histogram",
    "NapiInstance",
    "NetRxRuns",
    "VectorStats",
    "softirq_summary",
]


@dataclass(frozen=True)
class Histogram:
    """Counts by log2 bucket: bucket b holds values in [2^b, 2^(b+1)) (bucket 0 also holds 0)."""

    buckets: tuple[int, ...]

    @property
    def count(self) -> int:
        return sum(self.buckets)

    def percentile(self, fraction: float) -> int | None:
        """The upper edge of the bucket holding the `fraction` quantile."""
        total = self.count
        if not total:
            return None
        needed = fraction * total
        seen = 0
        for bucket, count in enumerate(self.buckets):
            seen += count
            if count and seen >= needed:
                return self.upper_edge(bucket)
        return self.upper_edge(len(self.buckets) - 1)

    def __add__(self, other: Self) -> Self:
        return type(self)(tuple(a + b for a, b in zip(self.buckets, other.buckets, strict=True)))

    @staticmethod
    def lower_edge(bucket: int) -> int:
        return 0 if bucket == 0 else 1 << bucket

    @staticmethod
    def upper_edge(bucket: int) -> int:
        return 1 << (bucket + 1)

    def by_lower_edge(self) -> dict[str, int]:
        """{lower edge: count} of the non-empty buckets, as the records show a histogram."""
        return {str(self.lower_edge(bucket)): count for bucket, count in enumerate(self.buckets) if count}


@dataclass(frozen=True)
class CountHistogram(Histogram):
    """Packets per run or per poll, as the kernel buckets them (bpf/softirq.bpf.c count_bucket): bucket 0
    holds 0, bucket b >= 1 holds [2^(b-1), 2^b), so 1 packet is under 1, 2-3 under 2, 4-7 under 4. A
    percentile is the largest count of its bucket."""

    @staticmethod
    def lower_edge(bucket: int) -> int:
        return 0 if bucket == 0 else 1 << (bucket - 1)

    @staticmethod
    def upper_edge(bucket: int) -> int:
        return 0 if bucket == 0 else (1 << bucket) - 1


@dataclass(frozen=True)
class VectorStats:
    """One vector on one CPU (cpu None: summed over CPUs)."""

    name: str
    cpu: int | None
    raised: int
    runs: int
    latency: Histogram
    latency_sum_ns: int
    latency_max_ns: int
    duration: Histogram
    duration_sum_ns: int
    duration_max_ns: int

    def __add__(self, other: VectorStats) -> VectorStats:
        return VectorStats(
            self.name,
            None,
            self.raised + other.raised,
            self.runs + other.runs,
            self.latency + other.latency,
            self.latency_sum_ns + other.latency_sum_ns,
            max(self.latency_max_ns, other.latency_max_ns),
            self.duration + other.duration,
            self.duration_sum_ns + other.duration_sum_ns,
            max(self.duration_max_ns, other.duration_max_ns),
        )

    def part(self) -> VectorPart:
        def side(histogram: Histogram, total: int, largest: int) -> TimesPart:
            count = histogram.count
            return TimesPart(
                count=count,
                mean_ns=round(total / count) if count else None,
                p50_ns=histogram.percentile(0.5),
                p99_ns=histogram.percentile(0.99),
                max_ns=largest if count else None,
                histogram_ns=histogram.by_lower_edge(),
            )

        return VectorPart(
            vector=self.name,
            cpu=self.cpu,
            raised=self.raised,
            runs=self.runs,
            latency=side(self.latency, self.latency_sum_ns, self.latency_max_ns),
            duration=side(self.duration, self.duration_sum_ns, self.duration_max_ns),
        )


@dataclass(frozen=True)
class NetRxRuns:
    """What net_rx_action did on one CPU (cpu None: all), from the polls between its entry and exit."""

    cpu: int | None
    runs: int
    polls: int
    work: int
    budget_runs: int  # stopped with netdev_budget packets done
    time_runs: int  # lasted netdev_budget_usecs or longer
    exhausted_polls: int  # NAPI polls that used their whole budget (weight)
    work_per_run: CountHistogram

    def __add__(self, other: NetRxRuns) -> NetRxRuns:
        return NetRxRuns(
            None,
            self.runs + other.runs,
            self.polls + other.polls,
            self.work + other.work,
            self.budget_runs + other.budget_runs,
            self.time_runs + other.time_runs,
            self.exhausted_polls + other.exhausted_polls,
            self.work_per_run + other.work_per_run,
        )

    def part(self) -> NetRxPart:
        return NetRxPart(
            cpu=self.cpu,
            runs=self.runs,
            polls=self.polls,
            packets=self.work,
            packets_per_run=round(self.work / self.runs, 1) if self.runs else None,
            budget_runs=self.budget_runs,
            time_runs=self.time_runs,
            exhausted_polls=self.exhausted_polls,
            packets_per_run_histogram=self.work_per_run.by_lower_edge(),
        )


@dataclass(frozen=True)
class NapiInstance:
    netns: int
    netns_name: str | None
    dev: str
    ifindex: int
    napi_id: int
    budget: int
    polls_by_cpu: dict[int, int]
    work: int
    exhausted: int
    idle: int
    max_work: int
    work_per_poll: CountHistogram

    @property
    def polls(self) -> int:
        return sum(self.polls_by_cpu.values())

    def part(self) -> NapiPart:
        return NapiPart(
            dev=self.dev,
            ifindex=self.ifindex,
            netns=self.netns,
            netns_name=self.netns_name,
            napi_id=self.napi_id,
            budget=self.budget,
            polls=self.polls,
            polls_by_cpu={str(cpu): polls for cpu, polls in sorted(self.polls_by_cpu.items())},
            packets=self.work,
            exhausted_polls=self.exhausted,
            idle_polls=self.idle,
            max_packets=self.max_work,
            packets_per_poll_histogram=self.work_per_poll.by_lower_edge(),
        )


def _summed(parts: Sequence[VectorStats] | Sequence[NetRxRuns]) -> VectorStats | NetRxRuns | None:
    total = None
    for part in parts:
        total = part if total is None else total + part  # type: ignore[operator]
    return total


def softirq_summary(
    *,
    seconds: float,
    budget: int,
    budget_usecs: int,
    vectors: Sequence[VectorStats],
    net_rx: Sequence[NetRxRuns],
    napi: Sequence[NapiInstance],
    attach: str,
    interrupted: bool,
    clock: ClockPart,
    shown: Sequence[str] = (),
) -> SoftirqSummary:
    """The summary record of per-CPU measurements: `shown` vectors (all when empty), each over every CPU
    and on each CPU; NET_RX runs on each CPU and in all."""
    names = list(dict.fromkeys(stats.name for stats in vectors if not shown or stats.name in shown))
    totals = [_summed([stats for stats in vectors if stats.name == name]) for name in names]
    runs = sum(stats.runs for stats in vectors)
    net_rx_total = _summed(net_rx)
    return SoftirqSummary(
        diagnostic="softirq",
        **Summary.totals_fields(EventTotals(seen=runs, matched=runs)),
        attach=attach,
        interrupted=interrupted,
        clock=clock,
        seconds=round(seconds, 3),
        netdev_budget=budget,
        netdev_budget_usecs=budget_usecs,
        vectors=tuple(total.part() for total in totals if isinstance(total, VectorStats)),
        per_cpu=tuple(stats.part() for stats in vectors if stats.name in names),
        net_rx=net_rx_total.part() if isinstance(net_rx_total, NetRxRuns) else None,
        net_rx_per_cpu=tuple(runs.part() for runs in net_rx),
        napi=tuple(instance.part() for instance in napi),
    )
