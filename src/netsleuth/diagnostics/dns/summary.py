"""The `dns --summary` table from the kernel's groups: per (process, server, name suffix), queries, answers
by response code, timeouts, latency percentiles, and search-list amplification.

Search-list amplification: a resolver with `ndots:5` (Kubernetes' default) tries every search domain before
the name itself, so one application lookup of `api.svc` becomes `api.svc.ns.svc.cluster.local`,
`api.svc.svc.cluster.local`, ... each answered NXDOMAIN, then `api.svc`. A queried name N is a search-list
expansion of another name F the same process queried when N = F + "." + something and N was only ever
answered NXDOMAIN. Expansions are counted in F's row: `queries / lookups` is how many queries one lookup
became. Pure functions over decoded groups, so the rules run on recorded data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from netsleuth.diagnostics.dns.records import DnsRow
from netsleuth.diagnostics.dns.wire import rcode_name
from netsleuth.diagnostics.totals import EventTotals

__all__ = [
    "DnsGroupStats",
    "DnsTotals",
    "latency_bucket_bounds_us",
    "name_suffix",
    "percentile_ms",
    "summary_rows",
]

_NXDOMAIN = 3
_TCP = 6


def latency_bucket_bounds_us(bucket: int) -> tuple[int, int]:
    """[low, high) microseconds of a histogram bucket (bpf/dns.bpf.c latency_bucket: 4 per power of two)."""
    if bucket < 4:
        return bucket, bucket + 1
    log, sub = bucket // 4 + 1, bucket % 4
    return (4 + sub) << (log - 2), (5 + sub) << (log - 2)


def percentile_ms(histogram: Iterable[int], fraction: float) -> float | None:
    """The upper bound of the bucket holding that fraction of the answers (so at most 25 % high)."""
    counts = list(histogram)
    total = sum(counts)
    if not total:
        return None
    wanted = fraction * total
    seen = 0
    for bucket, count in enumerate(counts):
        seen += count
        if count and seen >= wanted:
            return latency_bucket_bounds_us(bucket)[1] / 1000
    return latency_bucket_bounds_us(len(counts) - 1)[1] / 1000


def name_suffix(name: str, labels: int = 2) -> str:
    parts = name.rstrip(".").split(".")
    return ".".join(parts[-labels:]) if len(parts) > labels else name.rstrip(".")


@dataclass(frozen=True)
class DnsGroupStats:
    """One kernel group (bpf/dns.h dns_group_key + dns_group), named, with userspace's timeouts added."""

    pid: int | None
    comm: str
    server: str
    server_port: int
    proto: int
    netns: int
    name: str
    qtype: int
    queries: int
    answers: int
    retransmits: int
    truncated: int
    rcodes: Mapping[int, int]
    histogram: tuple[int, ...]
    latency_sum_ns: int
    timeouts: int = 0


@dataclass(frozen=True)
class DnsTotals:
    """The kernel's exact DNS counters (bpf/dns.h enum dns_stat) plus userspace's timeouts."""

    events: EventTotals
    queries: int
    answers: int
    unmatched: int
    untracked: int
    retransmits: int
    drops: int
    timeouts: int
    filtered: int = 0  # answers --rcode or --slow left out: counted, not missing


@dataclass
class _RowSums:
    """A row while the groups are summed into it."""

    pid: int | None
    comm: str
    server: str
    suffix: str
    queries: int = 0
    lookups: int = 0  # queries of the names the application asked for (not search-list expansions)
    expansions: int = 0  # queries of search-list expansions, all answered NXDOMAIN
    answers: dict[str, int] = field(default_factory=dict)
    timeouts: int = 0
    truncated: int = 0
    retransmits: int = 0
    tcp_queries: int = 0
    names: set[str] = field(default_factory=set)
    histogram: list[int] = field(default_factory=list)
    # The search domains the resolver appended to these names (`a.test` of `api.svc.a.test`).
    search_domains: set[str] = field(default_factory=set)

    def row(self) -> DnsRow:
        return DnsRow(
            pid=self.pid,
            comm=self.comm,
            server=self.server,
            suffix=self.suffix,
            queries=self.queries,
            answers=dict(sorted(self.answers.items())),
            timeouts=self.timeouts,
            truncated=self.truncated,
            retransmits=self.retransmits,
            tcp_queries=self.tcp_queries,
            p50_ms=percentile_ms(self.histogram, 0.5),
            p99_ms=percentile_ms(self.histogram, 0.99),
            lookups=self.lookups,
            search_expansions=self.expansions,
            amplification=(self.lookups + self.expansions) / self.lookups if self.lookups else None,
            names=tuple(sorted(self.names)[:8]),
            search_domains=tuple(sorted(self.search_domains)),
        )


def _only_nxdomain(groups: list[DnsGroupStats]) -> bool:
    answered = sum(group.answers for group in groups)
    return answered > 0 and all(
        count == 0 for group in groups for rcode, count in group.rcodes.items() if rcode != _NXDOMAIN
    )


def _application_names(names: Mapping[str, list[DnsGroupStats]]) -> dict[str, str]:
    """Each queried name -> the name the application asked for (itself, or the name it expands)."""
    ordered = sorted(names, key=len)
    result: dict[str, str] = {}
    for name in ordered:
        base = name
        if _only_nxdomain(names[name]):
            for candidate in ordered:
                if len(candidate) >= len(name):
                    break
                if name.startswith(candidate + "."):
                    base = result.get(candidate, candidate)
                    break
        result[name] = base
    return result


def summary_rows(groups: Iterable[DnsGroupStats], suffix_labels: int = 2) -> list[DnsRow]:
    by_process: dict[tuple[int | None, str], dict[str, list[DnsGroupStats]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for group in groups:
        by_process[(group.pid, group.comm)][group.name.lower()].append(group)
    rows: dict[tuple[int | None, str, str, str], _RowSums] = {}
    for (pid, comm), names in by_process.items():
        application = _application_names(names)
        for name, name_groups in names.items():
            base = application[name]
            suffix = name_suffix(base, suffix_labels)
            for group in name_groups:
                key = (pid, comm, group.server, suffix)
                row = rows.get(key)
                if row is None:
                    row = rows[key] = _RowSums(pid, comm, group.server, suffix)
                row.queries += group.queries
                if base == name:
                    row.lookups += group.queries
                else:
                    row.expansions += group.queries
                    row.search_domains.add(name[len(base) + 1 :])
                for rcode, count in group.rcodes.items():
                    if count:
                        label = rcode_name(rcode)
                        row.answers[label] = row.answers.get(label, 0) + count
                row.timeouts += group.timeouts
                row.truncated += group.truncated
                row.retransmits += group.retransmits
                if group.proto == _TCP:
                    row.tcp_queries += group.queries
                row.names.add(base)
                if len(row.histogram) < len(group.histogram):
                    row.histogram.extend([0] * (len(group.histogram) - len(row.histogram)))
                for bucket, count in enumerate(group.histogram):
                    row.histogram[bucket] += count
    ordered = sorted(rows.values(), key=lambda row: (-row.queries, row.comm, row.server, row.suffix))
    return [row.row() for row in ordered]
