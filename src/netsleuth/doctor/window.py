"""Two snapshots and the time between them: every rule judges rates, never absolute counters, so a counter
that only grew before the run (a reboot-old burst) raises nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from netsleuth.doctor.model import Snapshot, SoftnetRow
from netsleuth.doctor.napi_measure import NapiMeasurement

__all__ = ["Window", "counter_delta"]


def counter_delta(before: int | None, after: int | None) -> int:
    """Growth of a monotonic counter; a reset (driver reload, 32-bit wrap) counts as no growth."""
    if before is None or after is None or after < before:
        return 0
    return after - before


@dataclass(frozen=True)
class Window:
    before: Snapshot
    after: Snapshot
    # NET_RX runs and NAPI polls measured with BPF over the window (napi_measure.py); None when not
    # measured, with the reason in `napi_problem` (rules then infer from softnet_stat).
    napi: NapiMeasurement | None = None
    napi_problem: str | None = None

    @property
    def seconds(self) -> float:
        # A zero-length window (two fixtures with the same stamp) must not divide by zero.
        return max(self.after.taken_at - self.before.taken_at, 1e-6)

    def per_second(self, delta: float) -> float:
        return delta / self.seconds

    def link_delta(self, name: str, stat: str) -> int:
        before, after = self.before.links.get(name), self.after.links.get(name)
        if before is None or after is None:
            return 0
        return counter_delta(before.stats.get(stat), after.stats.get(stat))

    def link_rate(self, name: str, stat: str) -> float:
        return self.per_second(self.link_delta(name, stat))

    def extra_stat_delta(self, name: str, stat: str) -> int:
        before, after = self.before.devices.get(name), self.after.devices.get(name)
        if before is None or after is None:
            return 0
        return counter_delta(before.extra_stats.get(stat), after.extra_stats.get(stat))

    def driver_stat_delta(self, name: str, stat: str) -> int:
        before, after = self.before.ethtool.get(name), self.after.ethtool.get(name)
        if before is None or after is None:
            return 0
        return counter_delta(before.driver_stats.get(stat), after.driver_stats.get(stat))

    def netstat_delta(self, key: str) -> int:
        return counter_delta(self.before.netstat.get(key), self.after.netstat.get(key))

    def softnet_deltas(self) -> list[SoftnetRow]:
        """Per-CPU growth of softnet_stat; backlog_len is a gauge, so it keeps the later value."""
        before = {row.cpu: row for row in self.before.softnet}
        deltas: list[SoftnetRow] = []
        for row in self.after.softnet:
            old = before.get(row.cpu)
            if old is None:
                continue
            deltas.append(
                SoftnetRow(
                    cpu=row.cpu,
                    processed=counter_delta(old.processed, row.processed),
                    dropped=counter_delta(old.dropped, row.dropped),
                    time_squeeze=counter_delta(old.time_squeeze, row.time_squeeze),
                    received_rps=counter_delta(old.received_rps, row.received_rps),
                    flow_limit_count=counter_delta(old.flow_limit_count, row.flow_limit_count),
                    backlog_len=row.backlog_len,
                )
            )
        return deltas

    def irq_deltas(self, irq: int) -> tuple[int, ...]:
        before, after = self.before.interrupts.get(irq), self.after.interrupts.get(irq)
        if before is None or after is None:
            return ()
        return tuple(counter_delta(old, new) for old, new in zip(before.per_cpu, after.per_cpu, strict=False))

    def softirq_deltas(self, name: str) -> tuple[int, ...]:
        before, after = self.before.softirqs.get(name, ()), self.after.softirqs.get(name, ())
        return tuple(counter_delta(old, new) for old, new in zip(before, after, strict=False))
