"""The --summary table: latency buckets as the BPF program fills them, percentiles, search-list folding."""

from __future__ import annotations

import pytest

from netsleuth.diagnostics.dns.summary import (
    DnsGroupStats,
    latency_bucket_bounds_us,
    name_suffix,
    percentile_ms,
    summary_rows,
)


def bpf_latency_bucket(latency_ns: int) -> int:
    """bpf/dns.bpf.c latency_bucket(), line for line."""
    us = latency_ns // 1000
    if us < 4:
        return us
    log = us.bit_length() - 1
    bucket = (log - 1) * 4 + ((us >> (log - 2)) & 3)
    return min(bucket, 99)


@pytest.mark.parametrize("us", [0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 100, 1000, 12345, 999_999, 4_000_000])
def test_bucket_bounds_hold_the_latency(us: int) -> None:
    low, high = latency_bucket_bounds_us(bpf_latency_bucket(us * 1000))
    assert low <= us < high
    assert high - low <= max(1, low // 4)  # 4 buckets per power of two: at most 25 % wide


def test_percentiles_from_a_histogram() -> None:
    histogram = [0] * 100
    for us, count in ((500, 98), (20_000, 2)):
        histogram[bpf_latency_bucket(us * 1000)] += count
    p50, p99 = percentile_ms(histogram, 0.5), percentile_ms(histogram, 0.99)
    assert p50 is not None and 0.5 <= p50 <= 0.625
    assert p99 is not None and 20 <= p99 <= 25
    assert percentile_ms([0] * 100, 0.5) is None


def _group(name: str, queries: int, rcodes: dict[int, int], pid: int = 10, qtype: int = 1) -> DnsGroupStats:
    return DnsGroupStats(
        pid=pid,
        comm="getent",
        server="198.18.0.2",
        server_port=53,
        proto=17,
        netns=1,
        name=name,
        qtype=qtype,
        queries=queries,
        answers=sum(rcodes.values()),
        retransmits=0,
        truncated=0,
        rcodes=rcodes,
        histogram=(0,) * 100,
        latency_sum_ns=0,
    )


def test_search_list_expansions_fold_into_the_name_asked_for() -> None:
    groups = [
        _group("api.svc.default.svc.cluster.local", 2, {3: 2}),
        _group("api.svc.svc.cluster.local", 2, {3: 2}),
        _group("api.svc.cluster.local", 2, {3: 2}),
        _group("api.svc", 2, {0: 2}),
        _group("www.example.com", 5, {0: 5}),
    ]
    rows = {row.suffix: row for row in summary_rows(groups)}
    assert set(rows) == {"api.svc", "example.com"}
    api = rows["api.svc"]
    assert (api.queries, api.lookups, api.search_expansions) == (8, 2, 6)
    assert api.amplification == 4.0
    assert api.answers == {"NXDOMAIN": 6, "NOERROR": 2}
    # The search list as the resolver used it: what it appended to the name.
    assert api.search_domains == ("cluster.local", "default.svc.cluster.local", "svc.cluster.local")
    assert rows["example.com"].search_domains == ()
    assert rows["example.com"].amplification == 1.0


def test_an_existing_longer_name_is_not_an_expansion() -> None:
    rows = summary_rows([_group("example.com", 1, {0: 1}), _group("www.example.com", 1, {0: 1})])
    assert len(rows) == 1
    assert rows[0].search_expansions == 0 and rows[0].lookups == 2


def test_processes_are_kept_apart() -> None:
    rows = summary_rows([_group("a.test", 1, {3: 1}, pid=1), _group("a.test", 1, {3: 1}, pid=2)])
    assert sorted(row.pid or 0 for row in rows) == [1, 2]


def test_name_suffix() -> None:
    assert name_suffix("www.example.com") == "example.com"
    assert name_suffix("api.svc") == "api.svc"
    assert name_suffix("localhost") == "localhost"
    assert name_suffix("a.b.c.d", 3) == "b.c.d"
