"""The exporter's collectors as the agent finds them (netsleuth.agent.collectors.registered): each declared in
its own file or on its diagnostic's spec, switched by its [exporter] table, opened from the registry alone -
here the host ones on the recorded machine of test_agent_path_collectors (the BPF-backed ones, drops and dns,
run in tests/privileged/test_agent_prometheus.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from netsleuth.agent.collectors import registered
from netsleuth.agent.config import parse_config
from netsleuth.diagnostics.registry import get_diagnostic
from netsleuth.kernel.reasons import DropReasons
from netsleuth.spec.collectors import CollectorInputs
from netsleuth.spec.diagnostic import DiagnosticSpec
from tests.unit.test_agent_path_collectors import ROOT


def _served(raw_config: dict[str, object]) -> tuple[list[str], set[str]]:
    """The collectors a config turns on (by name), and the metric families the ones without BPF serve."""
    exporter = parse_config({"exporter": raw_config}).exporter
    inputs = CollectorInputs(exporter=exporter, root=ROOT, reasons=DropReasons({}, "none"))
    registry = CollectorRegistry()
    on = [offer for offer in registered() if offer.enabled(exporter)]
    for offer in on:
        if offer.source is None:
            registry.register(offer.collector(None, inputs))
    families = {family.name for family in text_string_to_metric_families(generate_latest(registry).decode())}
    return [offer.name for offer in on], families


def test_every_collector_is_registered_once_host_ones_by_file_and_dns_and_drops_on_their_specs() -> None:
    names = [offer.name for offer in registered()]
    assert sorted(names) == ["conntrack", "dns", "drops", "interrupts", "links", "netstat", "softnet"]
    for diagnostic in ("dns", "drops"):
        spec = get_diagnostic(diagnostic)
        assert isinstance(spec, DiagnosticSpec)
        assert [offer.name for offer in spec.collectors] == [diagnostic]
        assert spec.collectors[0].source is not None  # counted in the kernel
    # Their sources attach in this order: the agent's attach kind is the first's, drops'.
    assert [offer.name for offer in registered() if offer.source is not None] == ["drops", "dns"]


def test_the_defaults_serve_every_host_collector_and_a_switch_turns_only_its_own_off() -> None:
    on, families = _served({})
    # The host's, by file, then the diagnostics' (drops) in the registry's order; dns: off by default.
    assert on == ["conntrack", "links", "netstat", "softnet", "interrupts", "drops"]
    host = {
        "netsleuth_conntrack_entries": "conntrack",
        "netsleuth_link_receive_drops": "links",
        "netsleuth_tcp_retransmitted_segments": "netstat",
        "netsleuth_softnet_processed_packets": "softnet",
        "netsleuth_nic_interrupts": "interrupts",
    }
    assert set(host) <= families, families
    for family, name in host.items():
        table = {"tcp": "netstat", "nic": "links"}
        key = next((key for key, value in table.items() if value == name), name)
        on, families = _served({key: {"enabled": False}})
        assert name not in on and family not in families
        assert set(host) - {family} <= families, (key, families)
    on, _ = _served({"dns": {"enabled": True}, "drops": {"enabled": False}})
    assert "dns" in on and "drops" not in on
