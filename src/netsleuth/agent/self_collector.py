"""The agent's metrics about itself: programs and their kernel-side cost, sessions, scrape timing.

`TimedCollector` wraps each source collector: a source that fails (conntrack unloaded mid-scrape, a
vanished interface) costs its own series for that scrape, never the whole scrape, and its duration and
success are reported here. The self collector is registered last, so it reports the scrape it is part of.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from netsleuth import __version__
from netsleuth.agent.programs import ProgramLedger
from netsleuth.agent.sessions import SessionStats

__all__ = ["ScrapeTimings", "SelfCollector", "TimedCollector"]

_LOG = logging.getLogger("netsleuth.agent")


class ScrapeTimings:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, bool]] = {}

    def record(self, collector: str, seconds: float, success: bool) -> None:
        with self._lock:
            self._last[collector] = (seconds, success)

    def last(self) -> dict[str, tuple[float, bool]]:
        with self._lock:
            return dict(self._last)


class TimedCollector:
    def __init__(
        self,
        name: str,
        inner: Collector,
        timings: ScrapeTimings,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.name = name
        self._inner = inner
        self._timings = timings
        self._clock = clock

    def collect(self) -> Iterable[Metric]:
        started = self._clock()
        try:
            families = list(self._inner.collect())
            success = True
        except Exception:  # one broken source must not take the other collectors' series down with it
            _LOG.exception("collector %s failed", self.name)
            families, success = [], False
        self._timings.record(self.name, self._clock() - started, success)
        return families


class SelfCollector:
    def __init__(
        self,
        ledger: ProgramLedger,
        sessions: SessionStats,
        timings: ScrapeTimings,
        bpf_stats_enabled: Callable[[], bool],
        ready: Callable[[], bool],
    ) -> None:
        self._ledger = ledger
        self._sessions = sessions
        self._timings = timings
        self._bpf_stats_enabled = bpf_stats_enabled
        self._ready = ready

    def collect(self) -> Iterable[Metric]:
        info = GaugeMetricFamily("netsleuth_agent_info", "The running agent's version", labels=["version"])
        info.add_metric([__version__], 1)
        ready = GaugeMetricFamily(
            "netsleuth_agent_ready", "1 once the exporter's programs are attached", value=int(self._ready())
        )
        attached = GaugeMetricFamily(
            "netsleuth_bpf_programs_attached",
            "BPF programs this agent has attached: the exporter's and the running sessions'",
            labels=["owner", "program"],
        )
        run_seconds = CounterMetricFamily(
            "netsleuth_bpf_program_run_seconds",
            "CPU time the agent's BPF programs ran in the kernel (bpf_stats run_time_ns), including "
            "sessions that have ended",
            labels=["owner", "program"],
        )
        runs = CounterMetricFamily(
            "netsleuth_bpf_program_runs",
            "Times the agent's BPF programs ran (bpf_stats run_cnt), including sessions that have ended",
            labels=["owner", "program"],
        )
        for cost in self._ledger.costs():
            labels = [cost.owner, cost.program]
            attached.add_metric(labels, cost.attached)
            run_seconds.add_metric(labels, cost.run_time_ns / 1e9)
            runs.add_metric(labels, cost.run_count)
        stats_enabled = GaugeMetricFamily(
            "netsleuth_bpf_stats_enabled",
            "1 when the kernel accounts BPF run time (needed for run-time metrics and session CPU budgets)",
            value=int(self._bpf_stats_enabled()),
        )
        yield from (info, ready, attached, run_seconds, runs, stats_enabled)
        yield from self._session_metrics()
        yield from self._scrape_metrics()

    def _session_metrics(self) -> Iterable[Metric]:
        stats = self._sessions
        with stats.lock:
            active = stats.active
            ended = dict(stats.ended)
            refused = dict(stats.refused)
            events, sent_bytes, lost, sampled = stats.events, stats.bytes, stats.lost, stats.sampled
        ended_family = CounterMetricFamily(
            "netsleuth_sessions",
            "Sessions that have ended, by diagnostic and why they ended (duration, max_events, max_bytes, "
            "cpu_budget, client_gone, agent_stopping, error)",
            labels=["diagnostic", "reason"],
        )
        for (diagnostic, reason), count in sorted(ended.items()):
            ended_family.add_metric([diagnostic, reason], count)
        refused_family = CounterMetricFamily(
            "netsleuth_sessions_refused",
            "Session requests refused, by cause (busy, invalid, unavailable, failed)",
            labels=["cause"],
        )
        for cause, count in sorted(refused.items()):
            refused_family.add_metric([cause], count)
        yield GaugeMetricFamily("netsleuth_sessions_active", "Sessions running now", value=active)
        yield ended_family
        yield refused_family
        yield CounterMetricFamily(
            "netsleuth_session_events", "Events streamed to session clients (ended sessions)", value=events
        )
        yield CounterMetricFamily(
            "netsleuth_session_sent_bytes",
            "Bytes streamed to session clients (ended sessions)",
            value=sent_bytes,
        )
        yield CounterMetricFamily(
            "netsleuth_session_events_lost",
            "Events the kernel could not queue for a session (ring buffer full; ended sessions)",
            value=lost,
        )
        yield CounterMetricFamily(
            "netsleuth_session_events_sampled",
            "Events left out on purpose by sampling or back-pressure (ended sessions)",
            value=sampled,
        )

    def _scrape_metrics(self) -> Iterable[Metric]:
        duration = GaugeMetricFamily(
            "netsleuth_scrape_collector_duration_seconds",
            "How long each collector took in this scrape",
            labels=["collector"],
        )
        success = GaugeMetricFamily(
            "netsleuth_scrape_collector_success",
            "1 if the collector succeeded in this scrape",
            labels=["collector"],
        )
        for name, (seconds, ok) in sorted(self._timings.last().items()):
            duration.add_metric([name], seconds)
            success.add_metric([name], int(ok))
        yield duration
        yield success
