"""`softirq` attached: per CPU and vector, how long raised softirqs wait (raise -> entry) and run (entry ->
exit); per NAPI instance, polls and work against budget; per NET_RX run, whether it stopped on the packet
budget or the time limit (bpf/softirq.bpf.c). Everything is counted in per-CPU maps in the kernel: the counts
are exact, and nothing is sent per event.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    SoftirqObject,
    SoftirqRodata,
)
from netsleuth.bpf.program_session import TP_BTF_THEN_RAW_TP, ProgramSession, Variant
from netsleuth.bpf.skeleton import variant_programs
from netsleuth.diagnostics.filter_maps import fill_netns_config
from netsleuth.diagnostics.softirq.counts import (
    CountHistogram,
    Histogram,
    NapiInstance,
    NetRxRuns,
    VectorStats,
    softirq_summary,
)
from netsleuth.diagnostics.softirq.records import SoftirqConfig, SoftirqSummary
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.kernel.softirqs import softirq_names, softirq_vector
from netsleuth.spec.summary import ClockPart

if TYPE_CHECKING:
    from netsleuth.kernel.context import KernelContext

__all__ = ["SoftirqDiagnostic"]

_PROGRAMS = variant_programs(
    SoftirqObject,
    ("sirq_raise", "sirq_entry", "sirq_exit", "sirq_napi"),
    [variant.suffix for variant in TP_BTF_THEN_RAW_TP],
)
_DEFAULT_BUDGET = 300  # net.core.netdev_budget (net/core/dev.c)
_DEFAULT_BUDGET_USECS = 2000  # net.core.netdev_budget_usecs: 2 jiffies at HZ=1000


def _sysctl(name: str, default: int, root: Path = Path("/proc/sys")) -> int:
    try:
        return int((root / name.replace(".", "/")).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


# -- the session ---------------------------------------------------------------------------------------


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
        from netsleuth.kernel.netns import resolve_netns_arg

        self.config = config
        self._names = softirq_names()
        # Resolved on this host now: a vector or namespace it does not have is an error before any load.
        self.shown = tuple(softirq_vector(name, "--vector", self._names) for name in config.vector)
        self._context = context or KernelContext()
        self._own_context = context is None
        try:
            self._netns = resolve_netns_arg(config.netns, self._context.netns_names) if config.netns else 0
        except BaseException:
            if self._own_context:
                self._context.close()
            raise
        # The budgets every NET_RX run is measured against, as this host has them set.
        self.budget = _sysctl("net.core.netdev_budget", _DEFAULT_BUDGET)
        self.budget_usecs = _sysctl("net.core.netdev_budget_usecs", _DEFAULT_BUDGET_USECS)
        self._programs = ProgramSession(
            SoftirqObject,
            _PROGRAMS,
            variants,
            mirrors=(("napi_slot", NapiSlotC), ("napi_stats", NapiStatsC)),
        )
        self._started = 0.0

    @property
    def attach_kind(self) -> str:
        return self._programs.attach_kind

    def _kernel_config(self) -> SoftirqConfigC:
        cfg = SoftirqConfigC()
        cfg.budget_packets = self.budget
        cfg.budget_ns = self.budget_usecs * 1000
        fill_netns_config(cfg, self._netns)
        if self.config.dev:
            cfg.filter_dev = 1
            cfg.dev = self.config.dev.encode()
        return cfg

    def start(self) -> None:
        from netsleuth.bpf.features import require_tracepoints

        require_tracepoints(["softirq_raise", "softirq_entry", "softirq_exit", "napi_poll"])
        self._programs.start(list(_PROGRAMS), (SoftirqRodata.cfg, self._kernel_config()))
        self._started = time.monotonic()

    def poll(self, timeout_ms: int) -> list[Any]:
        self._programs.poll(timeout_ms)  # no ring buffer: waits
        return []

    def drain(self) -> list[Any]:
        self._programs.stop()  # the run's end: what the summary reads no longer moves
        return []

    def _cpu_states(self) -> list[SoftirqCpuStateC]:
        """Each CPU's counters and histograms (one read of the per-CPU `cpu_state` entry)."""
        if not self._programs.started:
            return []
        slots = self._programs.maps.cpu_state.lookup_per_cpu(bytes(4))
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
        slots = self._programs.maps.napi_slots
        polls = self._programs.maps.napi_polls
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
        # One read of stopped counters (vectors, NET_RX runs and NAPI instances agree), over the window the
        # programs ran.
        self._programs.stop()
        end = self._programs.stopped_at or time.monotonic()
        return softirq_summary(
            seconds=end - self._started if self._started else 0.0,
            budget=self.budget,
            budget_usecs=self.budget_usecs,
            vectors=self.vector_stats(),
            net_rx=self.net_rx_runs(),
            napi=self.napi_instances(),
            attach=self.attach_kind,
            interrupted=interrupted,
            clock=ClockPart(**self._context.clock.to_json()),
            shown=self.shown,
        )

    def program_fds(self) -> dict[str, int]:
        return self._programs.program_fds()

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        self._programs.close()
        if self._own_context:
            self._context.close()
