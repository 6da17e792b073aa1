"""The controller's own metrics, served on /metrics for Prometheus: what an operator alerts on before anyone
reads the audit trail.

No series names a host or a user: the page needs no token, and host names are not shown to those who may
not use the hosts (the log and the audit trail name them).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["REFUSAL_REASONS", "ControllerMetrics"]

# Why a message from an agent was refused (controller/sessions.py).
REFUSAL_REASONS = (
    "other_host",  # its body names a host other than its subject's
    "other_session",  # its body names a session other than its subject's
    "not_in_session",  # its subject's host is not one of the session's
    "malformed",  # not a valid status or record batch
    "unknown_kind",  # neither a status nor records
)
_KINDS = ("status", "records", "other")


class _GcPauses(Collector):
    """How long the controller's own garbage collections held its event loop, by generation: with a
    10,000-host session in memory a full collection walks millions of objects, and nothing is read from
    NATS meanwhile (a stall of seconds is a slow consumer to the server). One callback for the process."""

    seconds: ClassVar[list[float]] = [0.0, 0.0, 0.0]
    longest: ClassVar[list[float]] = [0.0, 0.0, 0.0]
    _started = 0.0
    _installed = False

    @classmethod
    def install(cls) -> None:
        if not cls._installed:
            cls._installed = True
            gc.callbacks.append(cls._on_gc)

    @classmethod
    def _on_gc(cls, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            cls._started = time.perf_counter()
            return
        took, generation = time.perf_counter() - cls._started, int(info.get("generation", 2))
        cls.seconds[generation] += took
        cls.longest[generation] = max(cls.longest[generation], took)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        total = CounterMetricFamily(
            "netsleuth_controller_gc_pause_seconds",
            "Time the controller spent in its garbage collections (its event loop held), by generation",
            labels=["generation"],
        )
        longest = GaugeMetricFamily(
            "netsleuth_controller_gc_pause_longest_seconds",
            "The longest single garbage collection since the controller started, by generation",
            labels=["generation"],
        )
        for generation in range(3):
            total.add_metric([str(generation)], self.seconds[generation])
            longest.add_metric([str(generation)], self.longest[generation])
        yield total
        yield longest


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        _GcPauses.install()
        self.registry.register(_GcPauses())
        self.refused_messages = Counter(
            "netsleuth_controller_refused_messages",
            "Messages from agents on a session's subjects that were refused, by kind and reason (a body "
            "naming another host or session than its subject, a malformed one, ...)",
            ["kind", "reason"],
            registry=self.registry,
        )
        for kind in _KINDS:  # every series from the start: an alert on rate() needs its zero
            for reason in REFUSAL_REASONS:
                self.refused_messages.labels(kind, reason)
        self.taken_over = Counter(
            "netsleuth_controller_sessions_taken_over",
            "Running sessions this controller took over from another whose lease ran out (it stopped, died)",
            registry=self.registry,
        )

    def refused(self, kind: str, reason: str) -> None:
        self.refused_messages.labels(kind if kind in _KINDS else "other", reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
