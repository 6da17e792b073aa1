"""Per-CPU packet processing for Prometheus: /proc/net/softnet_stat, the NET_RX/NET_TX softirq counts and
the NIC queue interrupts, through the same readers `netsleuth doctor` uses (doctor/procfs.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from netsleuth.agent.config import InterruptsExporterConfig
from netsleuth.doctor.links import read_links
from netsleuth.doctor.model import InterruptLine
from netsleuth.doctor.procfs import read_interrupts, read_softirqs, read_softnet
from netsleuth.doctor.sysfs import read_device
from netsleuth.doctor.topology import device_irqs
from netsleuth.spec.collectors import CollectorInputs, ExporterCollector

__all__ = ["COLLECTORS", "InterruptsCollector", "SoftnetCollector"]

# Which IRQs belong to which NIC changes only when a driver (re)loads; re-derived at most this often.
_IRQ_MAP_TTL_S = 60.0
_NETWORK_SOFTIRQS = ("NET_RX", "NET_TX")


class SoftnetCollector:
    def __init__(self, root: Path = Path("/")) -> None:
        self._root = root

    def collect(self) -> Iterable[Metric]:
        rows = read_softnet(self._root)
        families = {
            "processed": CounterMetricFamily(
                "netsleuth_softnet_processed_packets",
                "Packets this CPU's NET_RX processing took from its queues (softnet_stat column 1)",
                labels=["cpu"],
            ),
            "dropped": CounterMetricFamily(
                "netsleuth_softnet_backlog_drops",
                "Packets dropped because this CPU's input backlog was full (net.core.netdev_max_backlog)",
                labels=["cpu"],
            ),
            "time_squeeze": CounterMetricFamily(
                "netsleuth_softnet_times_squeezed",
                "Times NET_RX ran out of budget (net.core.netdev_budget / _usecs) with work left",
                labels=["cpu"],
            ),
            "received_rps": CounterMetricFamily(
                "netsleuth_softnet_rps_received",
                "Times this CPU was woken by another to process packets steered to it (RPS/RFS)",
                labels=["cpu"],
            ),
            "flow_limit_count": CounterMetricFamily(
                "netsleuth_softnet_flow_limit_drops",
                "Packets dropped by the per-flow backlog limit (net.core.flow_limit_cpu_bitmap)",
                labels=["cpu"],
            ),
        }
        backlog = GaugeMetricFamily(
            "netsleuth_softnet_backlog_packets", "Packets waiting in this CPU's input backlog", labels=["cpu"]
        )
        for row in rows:
            cpu = str(row.cpu)
            for field, family in families.items():
                family.add_metric([cpu], getattr(row, field))
            if row.backlog_len is not None:
                backlog.add_metric([cpu], row.backlog_len)
        return [*families.values(), backlog]


class InterruptsCollector:
    def __init__(
        self,
        config: InterruptsExporterConfig,
        root: Path = Path("/"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._root = root
        self._per_cpu = config.per_cpu
        self._clock = clock
        self._irq_devices: dict[int, str] = {}
        self._mapped_at: float | None = None

    def _nic_irqs(self, interrupts: dict[int, InterruptLine]) -> dict[int, str]:
        now = self._clock()
        if self._mapped_at is None or now - self._mapped_at >= _IRQ_MAP_TTL_S:
            irq_devices: dict[int, str] = {}
            for name, link in read_links(self._root).items():
                if link.kind is not None or name == "lo":
                    continue  # veths, bridges, tunnels: no interrupts of their own
                for irq in device_irqs(name, read_device(self._root, name), None, interrupts):
                    irq_devices.setdefault(irq, name)
            self._irq_devices, self._mapped_at = irq_devices, now
        return self._irq_devices

    def collect(self) -> Iterable[Metric]:
        interrupts = read_interrupts(self._root)
        labels = ["device", "irq", "handler", *(["cpu"] if self._per_cpu else [])]
        nic = CounterMetricFamily(
            "netsleuth_nic_interrupts",
            "Interrupts of a NIC's vectors (/proc/interrupts), by IRQ"
            + (" and CPU" if self._per_cpu else ""),
            labels=labels,
        )
        for irq, device in sorted(self._nic_irqs(interrupts).items()):
            line = interrupts.get(irq)
            if line is None:
                continue
            if self._per_cpu:
                for cpu, count in enumerate(line.per_cpu):
                    nic.add_metric([device, str(irq), line.actions, str(cpu)], count)
            else:
                nic.add_metric([device, str(irq), line.actions], sum(line.per_cpu))
        softirqs = CounterMetricFamily(
            "netsleuth_softirqs",
            "Network softirqs run (/proc/softirqs), by type and CPU",
            labels=["type", "cpu"],
        )
        for kind, counts in read_softirqs(self._root).items():
            if kind in _NETWORK_SOFTIRQS:
                for cpu, count in enumerate(counts):
                    softirqs.add_metric([kind, str(cpu)], count)
        return [nic, softirqs]


def _softnet(_source: None, inputs: CollectorInputs) -> SoftnetCollector:
    return SoftnetCollector(inputs.root)


def _interrupts(_source: None, inputs: CollectorInputs) -> InterruptsCollector:
    return InterruptsCollector(inputs.exporter.interrupts, inputs.root)


COLLECTORS = (
    ExporterCollector("softnet", lambda exporter: exporter.softnet, _softnet),  # [exporter] softnet = ...
    ExporterCollector("interrupts", lambda exporter: exporter.interrupts.enabled, _interrupts),
)
