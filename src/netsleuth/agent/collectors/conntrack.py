"""Connection tracking for Prometheus: table fill and the per-CPU event counters of
/proc/net/stat/nf_conntrack (summed), read by doctor/procfs.py. Nothing when conntrack is not loaded."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from netsleuth.doctor.procfs import read_conntrack
from netsleuth.spec.collectors import CollectorInputs, ExporterCollector

__all__ = ["COLLECTORS", "ConntrackCollector"]


class ConntrackCollector:
    def __init__(self, root: Path = Path("/")) -> None:
        self._root = root

    def collect(self) -> Iterable[Metric]:
        record = read_conntrack(self._root)
        if record is None:
            return []
        events = CounterMetricFamily(
            "netsleuth_conntrack_events",
            "Connection tracking events (/proc/net/stat/nf_conntrack, summed over CPUs): drop and "
            "early_drop mean a full table, insert_failed a race or clash, invalid untrackable packets",
            labels=["event"],
        )
        for name, value in sorted(record.stats.items()):
            if name != "entries":  # a gauge repeated per CPU, exported as netsleuth_conntrack_entries
                events.add_metric([name], value)
        return [
            GaugeMetricFamily("netsleuth_conntrack_entries", "Connections tracked now", value=record.count),
            GaugeMetricFamily(
                "netsleuth_conntrack_entries_limit",
                "Size of the connection tracking table (net.netfilter.nf_conntrack_max)",
                value=record.max,
            ),
            events,
        ]


def _collector(_source: None, inputs: CollectorInputs) -> ConntrackCollector:
    return ConntrackCollector(inputs.root)


# [exporter] conntrack = true|false
COLLECTORS = (ExporterCollector("conntrack", lambda exporter: exporter.conntrack, _collector),)
