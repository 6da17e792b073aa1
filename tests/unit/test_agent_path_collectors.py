"""Path-health counters (interfaces, softnet, interrupts, TCP/UDP MIB, conntrack) through a registry, on the
recorded machine the doctor's tests use (tests/fixtures/doctor/base/after: 8 CPUs, eth0 with 8 queue IRQs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from netsleuth.agent.collectors.conntrack import ConntrackCollector
from netsleuth.agent.collectors.links import LinkCollector
from netsleuth.agent.collectors.netstat import NetstatCollector
from netsleuth.agent.collectors.softnet import InterruptsCollector, SoftnetCollector
from netsleuth.agent.config import InterruptsExporterConfig, NicExporterConfig

ROOT = Path(__file__).parents[1] / "fixtures" / "doctor" / "base" / "after"


def registry_of(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def value(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


def test_interface_counters() -> None:
    registry = registry_of(LinkCollector(NicExporterConfig(), ROOT))
    assert value(registry, "netsleuth_link_receive_drops_total", device="eth0") == 1932
    assert value(registry, "netsleuth_link_receive_packets_total", device="eth0") == 9000100000
    assert value(registry, "netsleuth_link_receive_errors_total", device="eth0") == 12
    assert value(registry, "netsleuth_link_up", device="eth0") == 1
    assert value(registry, "netsleuth_link_up", device="lo") == 0  # operstate UNKNOWN
    assert value(registry, "netsleuth_link_mtu_bytes", device="lo") == 65536


def test_interface_limit_and_exclusion() -> None:
    limited = registry_of(LinkCollector(NicExporterConfig(max_devices=1), ROOT))
    assert value(limited, "netsleuth_link_receive_drops_total", device="eth0") == 1932  # the busiest
    assert value(limited, "netsleuth_link_receive_drops_total", device="lo") is None
    assert value(limited, "netsleuth_link_receive_drops_total", device="other") == 0
    excluded = registry_of(LinkCollector(NicExporterConfig(exclude_devices="^eth"), ROOT))
    assert value(excluded, "netsleuth_link_receive_drops_total", device="eth0") is None
    assert value(excluded, "netsleuth_link_mtu_bytes", device="lo") == 65536


def test_softnet_per_cpu() -> None:
    registry = registry_of(SoftnetCollector(ROOT))
    assert value(registry, "netsleuth_softnet_processed_packets_total", cpu="0") == 0xEE6B58D4
    assert value(registry, "netsleuth_softnet_backlog_drops_total", cpu="3") == 0x5DC
    assert value(registry, "netsleuth_softnet_times_squeezed_total", cpu="7") == 0x15F90
    assert value(registry, "netsleuth_softnet_backlog_packets", cpu="0") == 0


@pytest.mark.parametrize("per_cpu", [False, True], ids=["per-irq", "per-cpu"])
def test_nic_interrupts_and_network_softirqs(per_cpu: bool) -> None:
    registry = registry_of(InterruptsCollector(InterruptsExporterConfig(per_cpu=per_cpu), ROOT))
    labels = {"device": "eth0", "irq": "64", "handler": "eth0-TxRx-0"}
    if per_cpu:
        assert value(registry, "netsleuth_nic_interrupts_total", **labels, cpu="0") == 5004000
        assert value(registry, "netsleuth_nic_interrupts_total", **labels, cpu="1") == 5000000
    else:
        assert value(registry, "netsleuth_nic_interrupts_total", **labels) == 5004000 + 7 * 5000000
    assert value(registry, "netsleuth_nic_interrupts_total", device="eth0", irq="0", handler="timer") is None
    assert value(registry, "netsleuth_softirqs_total", type="NET_RX", cpu="2") == 8004000
    assert value(registry, "netsleuth_softirqs_total", type="TIMER", cpu="2") is None


def test_tcp_and_udp_mib_counters() -> None:
    registry = registry_of(NetstatCollector(ROOT))
    assert value(registry, "netsleuth_tcp_listen_overflows_total") == 3120
    assert value(registry, "netsleuth_tcp_retransmitted_segments_total") == 0
    assert value(registry, "netsleuth_udp_receive_buffer_errors_total", family="ipv4") == 77
    assert value(registry, "netsleuth_udp_receive_buffer_errors_total", family="ipv6") == 0
    # Absent from this recording (older /proc/net/netstat): no sample rather than a made-up zero.
    assert value(registry, "netsleuth_tcp_aborts_total", cause="data") is None


def test_conntrack() -> None:
    registry = registry_of(ConntrackCollector(ROOT))
    assert value(registry, "netsleuth_conntrack_entries") == 1200
    assert value(registry, "netsleuth_conntrack_entries_limit") == 262144
    assert value(registry, "netsleuth_conntrack_events_total", event="invalid") == 0x28 * 8
    assert value(registry, "netsleuth_conntrack_events_total", event="entries") is None


def test_missing_sources_export_nothing(tmp_path: Path) -> None:
    for collector in (ConntrackCollector(tmp_path), SoftnetCollector(tmp_path), NetstatCollector(tmp_path)):
        registry = registry_of(collector)
        assert all(not family.samples for family in registry.collect())


def test_exposition_follows_prometheus_conventions() -> None:
    """Every family: netsleuth_ prefix, help text, counters end in _total, units in names where they apply."""
    registry = CollectorRegistry()
    for collector in (
        LinkCollector(NicExporterConfig(), ROOT),
        SoftnetCollector(ROOT),
        InterruptsCollector(InterruptsExporterConfig(), ROOT),
        NetstatCollector(ROOT),
        ConntrackCollector(ROOT),
    ):
        registry.register(collector)
    text = generate_latest(registry).decode()
    families = list(text_string_to_metric_families(text))
    assert len(families) > 40
    for family in families:
        assert family.name.startswith("netsleuth_"), family.name
        assert family.documentation, family.name
        if family.type == "counter":
            assert all(sample.name.endswith("_total") for sample in family.samples), family.name
    assert "netsleuth_link_mtu_bytes" in {family.name for family in families}
