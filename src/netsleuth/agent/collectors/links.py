"""Interface counters for Prometheus: rtnetlink stats64 of every interface in the agent's namespace.

The same reader `netsleuth doctor` uses (doctor/links.py), called at scrape time, so values are the kernel's
own running totals; rates are Prometheus' job. `max_devices` bounds the series on hosts with thousands of
veths: the busiest interfaces first keep their series, the rest are summed as device="other".
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from netsleuth.agent.config import NicExporterConfig
from netsleuth.doctor.links import read_links
from netsleuth.spec.cardinality import OTHER, SeriesGuard
from netsleuth.spec.collectors import CollectorInputs, ExporterCollector

__all__ = ["COLLECTORS", "LINK_COUNTERS", "LinkCollector"]

# stats64 field (include/uapi/linux/if_link.h struct rtnl_link_stats64) -> metric name, help.
LINK_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("rx_bytes", "netsleuth_link_receive_bytes", "Bytes received"),
    ("tx_bytes", "netsleuth_link_transmit_bytes", "Bytes sent"),
    ("rx_packets", "netsleuth_link_receive_packets", "Packets received"),
    ("tx_packets", "netsleuth_link_transmit_packets", "Packets sent"),
    ("rx_errors", "netsleuth_link_receive_errors", "Receive errors (all kinds)"),
    ("tx_errors", "netsleuth_link_transmit_errors", "Transmit errors (all kinds)"),
    (
        "rx_dropped",
        "netsleuth_link_receive_drops",
        "Received packets the device or driver dropped before the stack (no buffer, filtered, bad protocol)",
    ),
    ("tx_dropped", "netsleuth_link_transmit_drops", "Packets the device or driver dropped on transmit"),
    (
        "rx_missed_errors",
        "netsleuth_link_receive_missed",
        "Packets the NIC missed for lack of a free receive ring buffer (the host was too slow)",
    ),
    ("rx_fifo_errors", "netsleuth_link_receive_fifo_errors", "Receive FIFO overruns"),
    ("rx_over_errors", "netsleuth_link_receive_overrun_errors", "Receive ring overruns"),
    (
        "rx_crc_errors",
        "netsleuth_link_receive_crc_errors",
        "Frames received with a bad CRC (cabling, optics)",
    ),
    ("rx_length_errors", "netsleuth_link_receive_length_errors", "Frames received with a bad length"),
    ("rx_frame_errors", "netsleuth_link_receive_frame_errors", "Frame alignment errors"),
    ("rx_nohandler", "netsleuth_link_receive_nohandler", "Packets no protocol handler took"),
    ("tx_carrier_errors", "netsleuth_link_transmit_carrier_errors", "Transmit carrier errors (link flaps)"),
    ("tx_fifo_errors", "netsleuth_link_transmit_fifo_errors", "Transmit FIFO errors"),
    ("tx_aborted_errors", "netsleuth_link_transmit_aborted_errors", "Transmits aborted"),
    ("collisions", "netsleuth_link_collisions", "Collisions (half-duplex links)"),
    ("multicast", "netsleuth_link_receive_multicast_packets", "Multicast packets received"),
)


class LinkCollector:
    def __init__(self, config: NicExporterConfig, root: Path = Path("/")) -> None:
        self._root = root
        self._exclude = re.compile(config.exclude_devices) if config.exclude_devices else None
        self._guard: SeriesGuard[str] = SeriesGuard(config.max_devices)

    def collect(self) -> Iterable[Metric]:
        links = {
            name: link
            for name, link in read_links(self._root).items()
            if self._exclude is None or not self._exclude.search(name)
        }
        admitted = self._guard.admit(
            {
                name: link.stats.get("rx_packets", 0) + link.stats.get("tx_packets", 0)
                for name, link in links.items()
            }
        )
        counters = {
            field: CounterMetricFamily(
                metric, f"{text}, per interface (rtnetlink stats64 {field})", labels=["device"]
            )
            for field, metric, text in LINK_COUNTERS
        }
        folded: dict[str, int] = defaultdict(int)
        for name in sorted(links):
            stats = links[name].stats
            for field, _, _ in LINK_COUNTERS:
                if field not in stats:
                    continue
                if name in admitted:
                    counters[field].add_metric([name], stats[field])
                else:
                    folded[field] += stats[field]
        for field, value in folded.items():
            counters[field].add_metric([OTHER], value)
        up = GaugeMetricFamily(
            "netsleuth_link_up", "1 when the interface's operational state is UP", labels=["device"]
        )
        mtu = GaugeMetricFamily("netsleuth_link_mtu_bytes", "The interface's MTU", labels=["device"])
        for name in sorted(admitted):
            up.add_metric([name], 1 if links[name].operstate == "UP" else 0)
            mtu.add_metric([name], links[name].mtu)
        return [*counters.values(), up, mtu]


def _collector(_source: None, inputs: CollectorInputs) -> LinkCollector:
    return LinkCollector(inputs.exporter.nic, inputs.root)


# [exporter.nic]
COLLECTORS = (ExporterCollector("links", lambda exporter: exporter.nic.enabled, _collector),)
