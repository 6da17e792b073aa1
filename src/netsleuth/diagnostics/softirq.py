"""`softirq`: per CPU and vector, how long raised softirqs wait (raise -> entry) and run (entry -> exit); per
NAPI instance, polls and work against budget; per NET_RX run, whether it stopped on the packet budget or the
time limit (bpf/softirq.bpf.c). Everything is counted in per-CPU maps in the kernel: the counts are exact,
and nothing is sent per event.

Histograms are log2 buckets of nanoseconds (and of packets, CountHistogram); a percentile is reported as the
upper edge of the bucket it falls in (an upper bound within a factor of two).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from netsleuth._generated.softirq_abi import (
    COUNTERS,
    HIST_KINDS,
    SIRQ_BUCKETS,
    SIRQ_MAX_VECTORS,
    HistKind,
    NapiKeyC,
    NapiSlotC,
    NapiStatsC,
    NetRxCounter,
    SoftirqConfigC,
    SoftirqCounter,
    SoftirqCpuStateC,
)
from netsleuth.bpf.program_session import TP_BTF_THEN_RAW_TP, ProgramSession, Variant
from netsleuth.diagnostics.model import ConfigInput, DiagnosticSpec, RunOptions
from netsleuth.diagnostics.schema import SCHEMA_VERSIONS
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError

if TYPE_CHECKING:
    from netsleuth.kernel.context import KernelClock, KernelContext

__all__ = [
    "DIAGNOSTIC",
    "CountHistogram",
    "Histogram",
    "NapiInstance",
    "NetRxRuns",
    "SoftirqConfig",
    "SoftirqDiagnostic",
    "SoftirqSummary",
    "VectorStats",
    "read_softirq_config",
    "softirq_names",
]

_PROGRAMS = ("sirq_raise", "sirq_entry", "sirq_exit", "sirq_napi")
_DEFAULT_BUDGET = 300  # net.core.netdev_budget (net/core/dev.c)
_DEFAULT_BUDGET_USECS = 2000  # net.core.netdev_budget_usecs: 2 jiffies at HZ=1000


def softirq_names(proc_softirqs: Path = Path("/proc/softirqs")) -> list[str]:
    """The vectors' names in vector order, as this kernel prints them (softirq_to_name[]): HI, TIMER, NET_TX,
    NET_RX, ... Read at run time rather than kept in a table, as ARCHITECTURE.md asks of kernel enums."""
    try:
        lines = proc_softirqs.read_text().splitlines()
    except OSError:
        return []
    return [line.split(":", 1)[0].strip() for line in lines[1:] if ":" in line]


def _sysctl(name: str, default: int, root: Path = Path("/proc/sys")) -> int:
    try:
        return int((root / name.replace(".", "/")).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


# -- config --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftirqConfig:
    vectors: tuple[str, ...] = ()  # shown; all are measured
    netns: int | None = None  # NAPI instances of devices in this namespace
    dev: str | None = None
    duration: float | None = None
    budget: int = _DEFAULT_BUDGET
    budget_usecs: int = _DEFAULT_BUDGET_USECS

    @property
    def run_options(self) -> RunOptions:
        return RunOptions(summary=True, duration=self.duration)


SOFTIRQ_KEYS = ("vector", "netns", "dev", "duration")


def read_softirq_config(values: ConfigInput) -> SoftirqConfig:
    from netsleuth.kernel.netns import resolve_netns_arg

    duration = values.number("duration")
    if duration is not None and duration <= 0:
        raise UsageError("--duration must be a positive number of seconds")
    known = softirq_names()
    vectors = tuple(name.upper() for name in values.texts("vector"))
    for name in vectors:
        if known and name not in known:
            raise UsageError(f"--vector {name!r} is not a softirq of this kernel; it has {', '.join(known)}")
    dev = values.text("dev")
    if dev is not None and not 0 < len(dev) <= 15:
        raise UsageError(f"--dev {dev!r} is not an interface name (1 to 15 characters)")
    netns = values.text("netns")
    return SoftirqConfig(
        vectors=vectors,
        netns=resolve_netns_arg(netns) if netns is not None else None,
        dev=dev,
        duration=duration,
        budget=_sysctl("net.core.netdev_budget", _DEFAULT_BUDGET),
        budget_usecs=_sysctl("net.core.netdev_budget_usecs", _DEFAULT_BUDGET_USECS),
    )


# -- measurements --------------------------------------------------------------------------------------


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

    def to_json(self) -> dict[str, int]:
        """{lower edge: count} of the non-empty buckets."""
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

    def to_json(self) -> dict[str, Any]:
        def side(histogram: Histogram, total: int, largest: int) -> dict[str, Any]:
            count = histogram.count
            return {
                "count": count,
                "mean_ns": round(total / count) if count else None,
                "p50_ns": histogram.percentile(0.5),
                "p99_ns": histogram.percentile(0.99),
                "max_ns": largest if count else None,
                "histogram_ns": histogram.to_json(),
            }

        return {
            "vector": self.name,
            "cpu": self.cpu,
            "raised": self.raised,
            "runs": self.runs,
            "latency": side(self.latency, self.latency_sum_ns, self.latency_max_ns),
            "duration": side(self.duration, self.duration_sum_ns, self.duration_max_ns),
        }


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

    def to_json(self) -> dict[str, Any]:
        return {
            "cpu": self.cpu,
            "runs": self.runs,
            "polls": self.polls,
            "packets": self.work,
            "packets_per_run": round(self.work / self.runs, 1) if self.runs else None,
            "budget_runs": self.budget_runs,
            "time_runs": self.time_runs,
            "exhausted_polls": self.exhausted_polls,
            "packets_per_run_histogram": self.work_per_run.to_json(),
        }


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

    def to_json(self) -> dict[str, Any]:
        return {
            "dev": self.dev,
            "ifindex": self.ifindex,
            "netns": self.netns,
            "netns_name": self.netns_name,
            "napi_id": self.napi_id,
            "budget": self.budget,
            "polls": self.polls,
            "polls_by_cpu": {str(cpu): polls for cpu, polls in sorted(self.polls_by_cpu.items())},
            "packets": self.work,
            "exhausted_polls": self.exhausted,
            "idle_polls": self.idle,
            "max_packets": self.max_work,
            "packets_per_poll_histogram": self.work_per_poll.to_json(),
        }


@dataclass(frozen=True)
class SoftirqSummary:
    seconds: float
    netdev_budget: int
    netdev_budget_usecs: int
    vectors: tuple[VectorStats, ...]  # per CPU
    net_rx: tuple[NetRxRuns, ...]  # per CPU
    napi: tuple[NapiInstance, ...]
    attach: str
    interrupted: bool
    clock: KernelClock
    shown: tuple[str, ...] = field(default=())

    def vector_total(self, name: str) -> VectorStats | None:
        matching = [stats for stats in self.vectors if stats.name == name]
        if not matching:
            return None
        total = matching[0]
        for stats in matching[1:]:
            total = total + stats
        return total

    @property
    def net_rx_total(self) -> NetRxRuns | None:
        if not self.net_rx:
            return None
        total = self.net_rx[0]
        for runs in self.net_rx[1:]:
            total = total + runs
        return total

    def to_json(self) -> dict[str, Any]:
        names = list(
            dict.fromkeys(stats.name for stats in self.vectors if not self.shown or stats.name in self.shown)
        )
        totals = [self.vector_total(name) for name in names]
        net_rx_total = self.net_rx_total
        return {
            "type": "summary",
            "v": SCHEMA_VERSIONS["summary"],
            "diagnostic": "softirq",
            "seconds": round(self.seconds, 3),
            "netdev_budget": self.netdev_budget,
            "netdev_budget_usecs": self.netdev_budget_usecs,
            "vectors": [total.to_json() for total in totals if total is not None],
            "per_cpu": [stats.to_json() for stats in self.vectors if stats.name in names],
            "net_rx": net_rx_total.to_json() if net_rx_total is not None else None,
            "net_rx_per_cpu": [runs.to_json() for runs in self.net_rx],
            "napi": [instance.to_json() for instance in self.napi],
            "attach": self.attach,
            "interrupted": self.interrupted,
            "clock": self.clock.to_json(),
        }


# -- the session ---------------------------------------------------------------------------------------


def _u64s(raw: bytes, count: int) -> list[int]:
    return [int.from_bytes(raw[i * 8 : i * 8 + 8], "little") for i in range(count)]


class SoftirqDiagnostic:
    """`softirq` as a session of the diagnostic model: it yields no records while it counts, and its
    measurements in the summary."""

    def __init__(
        self,
        config: SoftirqConfig,
        context: KernelContext | None = None,
        variants: Sequence[Variant] = TP_BTF_THEN_RAW_TP,
    ) -> None:
        """`variants`: the program builds tried in turn (tests pin one, e.g. the raw_tp fallback)."""
        from netsleuth.kernel.context import KernelContext

        self.config = config
        self._context = context or KernelContext()
        self._own_context = context is None
        self._programs = ProgramSession(
            "softirq",
            _PROGRAMS,
            variants,
            mirrors=(("napi_slot", NapiSlotC), ("napi_stats", NapiStatsC)),
        )
        self._names = softirq_names()
        self._started = 0.0

    @property
    def attach_kind(self) -> str:
        return self._programs.attach_kind

    def _kernel_config(self) -> SoftirqConfigC:
        cfg = SoftirqConfigC()
        cfg.budget_packets = self.config.budget
        cfg.budget_ns = self.config.budget_usecs * 1000
        cfg.netns = self.config.netns or 0
        if self.config.dev:
            cfg.filter_dev = 1
            cfg.dev = self.config.dev.encode()
        return cfg

    def start(self) -> None:
        from netsleuth.bpf.features import require_tracepoints

        require_tracepoints(["softirq_raise", "softirq_entry", "softirq_exit", "napi_poll"])
        self._programs.start(list(_PROGRAMS), ("cfg", self._kernel_config()))
        self._started = time.monotonic()

    def poll(self, timeout_ms: int) -> list[Any]:
        self._programs.poll(timeout_ms)  # no ring buffer: waits
        return []

    def drain(self) -> list[Any]:
        return []

    def _cpu_states(self) -> list[SoftirqCpuStateC]:
        """Each CPU's counters and histograms (one read of the per-CPU `cpu_state` entry)."""
        if not self._programs.started:
            return []
        slots = self._programs.map("cpu_state").lookup_per_cpu(bytes(4))
        return [SoftirqCpuStateC.from_buffer_copy(slot) for slot in slots]

    def vector_stats(self) -> list[VectorStats]:
        stats = []
        for cpu, state in enumerate(self._cpu_states()):
            cpu_counts, cpu_hist = list(state.counts), list(state.hist)
            for vector, name in enumerate(self._names[:SIRQ_MAX_VECTORS]):
                base = vector * COUNTERS

                def histogram(kind: int, vector: int = vector, cpu_hist: list[int] = cpu_hist) -> Histogram:
                    start = (vector * HIST_KINDS + kind) * SIRQ_BUCKETS
                    return Histogram(tuple(cpu_hist[start : start + SIRQ_BUCKETS]))

                stats.append(
                    VectorStats(
                        name=name,
                        cpu=cpu,
                        raised=cpu_counts[base + SoftirqCounter.RAISED],
                        runs=cpu_counts[base + SoftirqCounter.RUNS],
                        latency=histogram(HistKind.LATENCY),
                        latency_sum_ns=cpu_counts[base + SoftirqCounter.LATENCY_SUM],
                        latency_max_ns=cpu_counts[base + SoftirqCounter.LATENCY_MAX],
                        duration=histogram(HistKind.DURATION),
                        duration_sum_ns=cpu_counts[base + SoftirqCounter.DURATION_SUM],
                        duration_max_ns=cpu_counts[base + SoftirqCounter.DURATION_MAX],
                    )
                )
        return stats

    def net_rx_runs(self) -> list[NetRxRuns]:
        counts_and_hists = [(list(state.netrx), list(state.netrx_work_hist)) for state in self._cpu_states()]
        return [
            NetRxRuns(
                cpu,
                cpu_counts[NetRxCounter.RUNS],
                cpu_counts[NetRxCounter.POLLS],
                cpu_counts[NetRxCounter.WORK],
                cpu_counts[NetRxCounter.BUDGET_RUNS],
                cpu_counts[NetRxCounter.TIME_RUNS],
                cpu_counts[NetRxCounter.EXHAUSTED_POLLS],
                CountHistogram(tuple(cpu_hist)),
            )
            for cpu, (cpu_counts, cpu_hist) in enumerate(counts_and_hists)
        ]

    def _napi_per_cpu(self) -> list[tuple[NapiKeyC, bytes, dict[int, NapiStatsC]]]:
        """Each NAPI instance's key, name and counters on every CPU that polled it. A CPU counts an instance
        in its own slot of the per-CPU `napi_polls` array, named by its value in the per-CPU `napi_slots`
        hash (bpf/softirq.h, struct napi_slot)."""
        slots = self._programs.map("napi_slots")
        polls = self._programs.map("napi_polls")
        # slot -> its value on every CPU, read once (CPUs may keep different instances in one slot)
        by_slot: dict[int, list[bytes]] = {}
        found = []
        for raw_key in slots.keys():  # noqa: SIM118 - a BPF map, not a dict
            places = [NapiSlotC.from_buffer_copy(value) for value in slots.lookup_per_cpu(raw_key)]
            per_cpu = {}
            for cpu, place in enumerate(places):
                if not place.polled:
                    continue
                if place.slot not in by_slot:
                    by_slot[place.slot] = polls.lookup_per_cpu(place.slot.to_bytes(4, "little"))
                per_cpu[cpu] = NapiStatsC.from_buffer_copy(by_slot[place.slot][cpu])
            if per_cpu:
                ifname = next((place.ifname for place in places if place.ifname), b"")
                found.append((NapiKeyC.from_buffer_copy(raw_key), ifname, per_cpu))
        return found

    def napi_instances(self) -> list[NapiInstance]:
        if not self._programs.started:
            return []
        instances = []
        for key, ifname, by_cpu in self._napi_per_cpu():
            per_cpu = list(by_cpu.values())
            work_hist = CountHistogram(
                tuple(sum(stats.work_hist[b] for stats in per_cpu) for b in range(SIRQ_BUCKETS))
            )
            instances.append(
                NapiInstance(
                    netns=key.netns,
                    netns_name=self._context.netns_name(key.netns),
                    dev=ifname.decode(errors="replace"),
                    ifindex=key.ifindex,
                    napi_id=key.napi_id,
                    budget=max(stats.budget for stats in per_cpu),
                    polls_by_cpu={cpu: stats.polls for cpu, stats in by_cpu.items() if stats.polls},
                    work=sum(stats.work for stats in per_cpu),
                    exhausted=sum(stats.exhausted for stats in per_cpu),
                    idle=sum(stats.idle for stats in per_cpu),
                    max_work=max(stats.max_work for stats in per_cpu),
                    work_per_poll=work_hist,
                )
            )
        return sorted(instances, key=lambda instance: -instance.polls)

    def totals(self) -> EventTotals:
        """Softirq runs (every vector, every CPU): all counted, none sent."""
        runs = sum(stats.runs for stats in self.vector_stats())
        return EventTotals(seen=runs, matched=runs)

    def summary(self, interrupted: bool) -> SoftirqSummary:
        return SoftirqSummary(
            seconds=time.monotonic() - self._started if self._started else 0.0,
            netdev_budget=self.config.budget,
            netdev_budget_usecs=self.config.budget_usecs,
            vectors=tuple(self.vector_stats()),
            net_rx=tuple(self.net_rx_runs()),
            napi=tuple(self.napi_instances()),
            attach=self.attach_kind,
            interrupted=interrupted,
            clock=self._context.clock,
            shown=self.config.vectors,
        )

    def program_fds(self) -> dict[str, int]:
        return self._programs.program_fds()

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        self._programs.close()
        if self._own_context:
            self._context.close()


DIAGNOSTIC: DiagnosticSpec[SoftirqConfig] = DiagnosticSpec(
    name="softirq",
    help="softirq latency (raise -> entry) and duration per CPU and vector; NAPI polls and work vs budget",
    keys=SOFTIRQ_KEYS,
    read=read_softirq_config,
    open=lambda config, context: SoftirqDiagnostic(config, context),
    objects=("softirq",),
    records=("summary",),
    needs=("can_trace", "btf", "raw_tp", "ring_buffer"),  # tp_btf, or raw_tp where it is missing
)
