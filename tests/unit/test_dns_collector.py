"""The agent's DNS metrics from fake kernel groups: series per server under the cardinality guard, exact sums,
and the latency histogram on the kernel's own bucket edges."""

from __future__ import annotations

from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from netsleuth.diagnostics.dns.collector import LATENCY_BOUNDS_US, DnsCollector, cumulative_buckets
from netsleuth.diagnostics.dns.summary import DnsGroupStats, DnsTotals
from netsleuth.diagnostics.totals import EventTotals


def _histogram(*latencies_us: int) -> tuple[int, ...]:
    counts = [0] * 100
    for us in latencies_us:
        log = us.bit_length() - 1
        bucket = us if us < 4 else (log - 1) * 4 + ((us >> (log - 2)) & 3)
        counts[bucket] += 1
    return tuple(counts)


def _group(
    server: str, queries: int, rcodes: dict[int, int], histogram: tuple[int, ...], timeouts: int = 0
) -> DnsGroupStats:
    return DnsGroupStats(
        pid=None,
        comm="kernel",
        server=server,
        server_port=53,
        proto=17,
        netns=0,
        name="?",
        qtype=0,
        queries=queries,
        answers=sum(rcodes.values()),
        retransmits=0,
        truncated=0,
        rcodes=rcodes,
        histogram=histogram,
        latency_sum_ns=sum(histogram) * 1000,
        timeouts=timeouts,
    )


class FakeSource:
    def __init__(self, groups: list[DnsGroupStats]) -> None:
        self.refreshed = 0
        self._groups = groups

    def refresh(self) -> None:
        self.refreshed += 1

    def groups(self) -> list[DnsGroupStats]:
        return self._groups

    def dns_totals(self) -> DnsTotals:
        return DnsTotals(EventTotals(), 0, 0, unmatched=2, untracked=0, retransmits=0, drops=3, timeouts=1)


def _samples(collector: DnsCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_series_per_server_with_the_rest_as_other() -> None:
    source = FakeSource(
        [
            _group("198.18.0.2", 10, {0: 7, 3: 2}, _histogram(300, 300, 5000), timeouts=1),
            _group("198.18.0.3", 4, {2: 4}, _histogram(100)),
            _group("2001:db8::2", 1, {0: 1}, _histogram(2_000_000)),
        ]
    )
    samples = _samples(DnsCollector(source, server_series=1))
    assert source.refreshed == 1
    big = (("server", "198.18.0.2:53/udp"),)
    other = (("server", "other"),)
    assert samples[("netsleuth_dns_queries_total", big)] == 10
    assert samples[("netsleuth_dns_queries_total", other)] == 5
    assert samples[("netsleuth_dns_timeouts_total", big)] == 1
    assert samples[("netsleuth_dns_answers_total", (("rcode", "NXDOMAIN"), *big))] == 2
    assert samples[("netsleuth_dns_answers_total", (("rcode", "SERVFAIL"), *other))] == 4
    assert samples[("netsleuth_dns_latency_seconds_count", big)] == 3
    assert samples[("netsleuth_dns_latency_seconds_bucket", (("le", "0.000512"), *big))] == 2
    assert samples[("netsleuth_dns_latency_seconds_bucket", (("le", "0.008192"), *big))] == 3
    assert samples[("netsleuth_dns_unmatched_answers_total", ())] == 2
    assert samples[("netsleuth_dns_dropped_packets_total", ())] == 3


def test_bucket_edges_are_kernel_bucket_edges() -> None:
    # 512 us sits at the start of its own kernel bucket: it belongs above le=0.000512, never in it.
    buckets = dict(cumulative_buckets(list(_histogram(511, 512, 4_500_000))))
    assert buckets["0.000512"] == 1
    assert buckets["0.001024"] == 2
    assert buckets[repr(LATENCY_BOUNDS_US[-1] / 1e6)] == 2
    assert buckets["+Inf"] == 3
