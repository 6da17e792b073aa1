"""The agent exporter's DNS metrics (dns offers them on its spec: `collectors`), from the dns programs'
exact in-kernel counters, read at scrape time.

The exporter runs `dns` in its per-server mode (bpf/dns.h `per_server`): the kernel groups every client query
on this host by server only, so the table never fills with names or processes. Each scrape reads the running
totals (nothing to lose between scrapes) and first sweeps the pending table, so queries older than the
timeout are counted as timeouts. Series:

- `netsleuth_dns_queries_total{server}`, `netsleuth_dns_answers_total{server, rcode}`,
  `netsleuth_dns_timeouts_total{server}`, `netsleuth_dns_truncated_total{server}`;
- `netsleuth_dns_latency_seconds{server}`: a histogram whose bucket bounds are edges of the kernel's own
  buckets (powers of two of microseconds), so every answer lands in the bucket it really belongs to;
- `netsleuth_dns_unmatched_answers_total`, `netsleuth_dns_dropped_packets_total`,
  `netsleuth_dns_untracked_queries_total`: what keeps the sums honest.

`server` is "address:port/proto"; past `server_series` servers the rest are summed as server="other"
(cardinality.py: sticky, so no series ever goes down).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from netsleuth.diagnostics.dns.summary import DnsGroupStats, DnsTotals, latency_bucket_bounds_us
from netsleuth.diagnostics.dns.wire import rcode_name
from netsleuth.spec.cardinality import OTHER, SeriesGuard
from netsleuth.spec.collectors import CollectorInputs

__all__ = [
    "LATENCY_BOUNDS_US",
    "DnsCollector",
    "DnsCounts",
    "DnsExporterSession",
    "open_collector",
    "open_source",
]

# 256 us .. ~4.2 s, doubling: each is the lower edge of a kernel bucket (b % 4 == 0), so buckets map exactly.
LATENCY_BOUNDS_US = tuple(1 << power for power in range(8, 23))
_TCP = 6


class DnsCounts(Protocol):
    """What the collector reads: the exporter's DNS session, or a fake in unit tests."""

    def refresh(self) -> None: ...

    def groups(self) -> list[DnsGroupStats]: ...

    def dns_totals(self) -> DnsTotals: ...


@dataclass
class _ServerCounts:
    queries: int = 0
    truncated: int = 0
    timeouts: int = 0
    answers: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    histogram: list[int] = field(default_factory=list)
    latency_sum_ns: int = 0

    def add(self, group: DnsGroupStats) -> None:
        self.queries += group.queries
        self.truncated += group.truncated
        self.timeouts += group.timeouts
        for rcode, count in group.rcodes.items():
            self.answers[rcode_name(rcode)] += count
        if len(self.histogram) < len(group.histogram):
            self.histogram.extend([0] * (len(group.histogram) - len(self.histogram)))
        for bucket, count in enumerate(group.histogram):
            self.histogram[bucket] += count
        self.latency_sum_ns += group.latency_sum_ns


def _server_label(group: DnsGroupStats) -> str:
    server = f"[{group.server}]" if ":" in group.server else group.server
    return f"{server}:{group.server_port}/{'tcp' if group.proto == _TCP else 'udp'}"


def cumulative_buckets(histogram: list[int]) -> list[tuple[str, float]]:
    """The kernel's buckets as Prometheus cumulative (le, count) pairs in seconds, ending with +Inf."""
    counts = [0] * (len(LATENCY_BOUNDS_US) + 1)
    for bucket, count in enumerate(histogram):
        if not count:
            continue
        high = latency_bucket_bounds_us(bucket)[1]
        slot = next((i for i, bound in enumerate(LATENCY_BOUNDS_US) if high <= bound), len(LATENCY_BOUNDS_US))
        counts[slot] += count
    result, running = [], 0
    for bound, count in zip((*LATENCY_BOUNDS_US, None), counts, strict=True):
        running += count
        result.append(("+Inf" if bound is None else repr(bound / 1e6), float(running)))
    return result


class DnsCollector:
    def __init__(self, source: DnsCounts, server_series: int) -> None:
        self._source = source
        self._guard: SeriesGuard[str] = SeriesGuard(server_series)
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            return self._collect()

    def _collect(self) -> list[Metric]:
        self._source.refresh()
        per_server: dict[str, _ServerCounts] = defaultdict(_ServerCounts)
        for group in self._source.groups():
            per_server[_server_label(group)].add(group)
        admitted = self._guard.admit({label: counts.queries for label, counts in per_server.items()})
        series: dict[str, _ServerCounts] = defaultdict(_ServerCounts)
        for label, counts in per_server.items():
            target = series[label if label in admitted else OTHER]
            target.queries += counts.queries
            target.truncated += counts.truncated
            target.timeouts += counts.timeouts
            for rcode, count in counts.answers.items():
                target.answers[rcode] += count
            if len(target.histogram) < len(counts.histogram):
                target.histogram.extend([0] * (len(counts.histogram) - len(target.histogram)))
            for bucket, count in enumerate(counts.histogram):
                target.histogram[bucket] += count
            target.latency_sum_ns += counts.latency_sum_ns

        queries = CounterMetricFamily(
            "netsleuth_dns_queries",
            "DNS queries sent by processes on this host, by server",
            labels=["server"],
        )
        answers = CounterMetricFamily(
            "netsleuth_dns_answers",
            "DNS answers received, joined with their query, by server and response code",
            labels=["server", "rcode"],
        )
        timeouts = CounterMetricFamily(
            "netsleuth_dns_timeouts",
            "DNS queries with no answer within the exporter's timeout, by server",
            labels=["server"],
        )
        truncated = CounterMetricFamily(
            "netsleuth_dns_truncated",
            "DNS answers truncated (TC): the client retries over TCP",
            labels=["server"],
        )
        latency = HistogramMetricFamily(
            "netsleuth_dns_latency_seconds",
            "Time from a DNS query to its answer, by server (kernel timestamps at the socket)",
            labels=["server"],
        )
        for label, counts in sorted(series.items()):
            queries.add_metric([label], counts.queries)
            timeouts.add_metric([label], counts.timeouts)
            truncated.add_metric([label], counts.truncated)
            for rcode, count in sorted(counts.answers.items()):
                answers.add_metric([label, rcode], count)
            latency.add_metric([label], cumulative_buckets(counts.histogram), counts.latency_sum_ns / 1e9)

        totals = self._source.dns_totals()
        unmatched = CounterMetricFamily(
            "netsleuth_dns_unmatched_answers",
            "DNS answers with no pending query (asked before the exporter started, or after a timeout)",
        )
        unmatched.add_metric([], totals.unmatched)
        dropped = CounterMetricFamily(
            "netsleuth_dns_dropped_packets",
            "DNS packets (queries or answers) the kernel dropped on this host",
        )
        dropped.add_metric([], totals.drops)
        untracked = CounterMetricFamily(
            "netsleuth_dns_untracked_queries",
            "DNS queries not tracked for an answer (the pending table was full): they can never time out",
        )
        untracked.add_metric([], totals.untracked)
        return [queries, answers, timeouts, truncated, latency, unmatched, dropped, untracked]


class DnsExporterSession:
    """The exporter's always-on DNS attachment: `dns` in per-server summary mode. A scrape drains what the
    ring holds (drop events: they carry no count the kernel does not also keep) and sweeps timeouts."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        from netsleuth.diagnostics.dns.records import DnsConfig
        from netsleuth.diagnostics.dns.session import DnsDiagnostic

        self._session = DnsDiagnostic(DnsConfig(summary=True, timeout=timeout_s), per_server=True)
        self._lock = threading.Lock()

    @property
    def attach_kind(self) -> str:
        return self._session.attach_kind

    def start(self) -> None:
        self._session.start()

    def refresh(self) -> None:
        with self._lock:
            self._session.catch_up()

    def groups(self) -> list[DnsGroupStats]:
        with self._lock:
            return self._session.groups()

    def dns_totals(self) -> DnsTotals:
        with self._lock:
            return self._session.dns_totals()

    def program_fds(self) -> dict[str, int]:
        return self._session.program_fds()

    def close(self) -> None:
        with self._lock:
            self._session.close()


def open_source(inputs: CollectorInputs) -> DnsExporterSession:
    return DnsExporterSession(inputs.exporter.dns.timeout)


def open_collector(source: DnsExporterSession, inputs: CollectorInputs) -> DnsCollector:
    return DnsCollector(source, inputs.exporter.dns.server_series)
