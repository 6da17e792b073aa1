"""Every doctor rule on recorded/synthetic fixture roots (tests/fixtures/doctor): each scenario must raise
exactly its findings with the right fix, and quiet machines must raise nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsleuth.doctor.findings import Finding, FixKind, Report, Severity
from netsleuth.doctor.rules import diagnose
from tests.fixtures.doctor import FIXTURES, scenario_window, window_from_roots


def _report(name: str, tmp_path: Path) -> Report:
    return diagnose(scenario_window(name, tmp_path))


def _only(report: Report, finding_id: str) -> Finding:
    finding = report.finding(finding_id)
    assert finding is not None, [f.id for f in report.findings]
    return finding


EXPECTED = {
    "backlog-drops": {"backlog-drops"},
    "bond-slaves": {"bond-slave-offload:bond0", "gro-off:eth1"},
    "budget-squeeze": {"time-squeeze"},
    "coalesce-off": {"coalesce-off:eth0"},
    "conntrack": {"conntrack-full", "conntrack-invalid"},
    "few-queues": {"queues-vs-cpus:eth0", "softirq-skew:cpu0"},
    "gro-off": {"gro-off:eth0"},
    "irq-cpu3": {"irq-pileup:eth0", "softirq-skew:cpu3"},
    "listen-overflow": {"listen-overflow"},
    "low-traffic-drops": set(),
    "lro-forwarding": {"lro-forwarding:eth0"},
    "nohandler": {"rx-nohandler:eth0"},
    "numa-remote": {"irq-numa:eth0"},
    "ring-512": {"ring-exhaustion:eth0"},
    "rp-filter": {"rp-filter-drops"},
    "rx-drops": {"rx-drops:eth0"},
    "single-queue-rps": {"rps-single-queue:eth0", "softirq-skew:cpu0"},
    "softirq-skew": {"softirq-skew:cpu5"},
    "tcp-backlog": {"tcp-receive-drops"},
    "tunnel-tso": {"tunnel-tso:vxlan0"},
    "udp-rcvbuf": {"udp-rcvbuf-errors"},
    "usecs-squeeze": {"time-squeeze"},
    "veth-mtu": {"veth-mtu:vb"},
    "vxlan-mtu": {"tunnel-mtu:vxlan0"},
}


def test_every_scenario_has_an_expectation() -> None:
    assert {path.name for path in (FIXTURES / "scenarios").iterdir()} == set(EXPECTED)


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_scenario_raises_exactly_its_findings(scenario: str, tmp_path: Path) -> None:
    report = _report(scenario, tmp_path)
    assert {finding.id for finding in report.findings} == EXPECTED[scenario]
    for finding in report.findings:
        assert finding.explanation and finding.title and finding.evidence
        # An automatic fix always comes with the command a human would type.
        assert not finding.actions or finding.fix_commands


def test_quiet_synthetic_host_with_old_damage_raises_nothing(tmp_path: Path) -> None:
    window = scenario_window("base", tmp_path)
    # The counters carry old drops and overflows: only growth during the run may count.
    assert window.after.links["eth0"].stats["rx_missed_errors"] > 40_000
    assert window.after.netstat["TcpExt.ListenOverflows"] > 3_000
    report = diagnose(window)
    assert report.findings == ()
    assert any("checksum offload" in line for line in report.all_good)


def test_quiet_recorded_vm_raises_nothing() -> None:
    report = diagnose(window_from_roots(FIXTURES / "vm-quiet/before", FIXTURES / "vm-quiet/after", 1.0))
    assert report.findings == ()


def test_irq_pileup_spreads_the_eight_queues_over_local_cpus(tmp_path: Path) -> None:
    finding = _only(_report("irq-cpu3", tmp_path), "irq-pileup:eth0")
    assert finding.evidence["effective_cpu"] == 3
    assert finding.evidence["queue_irqs"] == list(range(64, 72))
    writes = {action.target: action.value for action in finding.actions}
    assert writes == {f"/proc/irq/{64 + queue}/smp_affinity_list": str(queue) for queue in range(8)}
    assert "echo 0 > /proc/irq/64/smp_affinity_list" in finding.fix_commands
    assert all(action.kind is FixKind.FILE for action in finding.actions)


def test_ring_exhaustion_grows_the_ring_toward_the_preset_max(tmp_path: Path) -> None:
    finding = _only(_report("ring-512", tmp_path), "ring-exhaustion:eth0")
    assert finding.severity is Severity.CRITICAL
    assert finding.evidence["rx_ring"] == 512 and finding.evidence["rx_ring_max"] == 4096
    assert finding.evidence["rx_missed_errors_per_s"] == 150.0
    assert finding.evidence["rx_no_buffer_count_per_s"] == 150.0
    assert finding.fix_commands == ("ethtool -G eth0 rx 2048",)
    assert any("RxBufferSize=2048" in line for line in finding.persistent)


def test_time_squeeze_with_full_runs_raises_netdev_budget(tmp_path: Path) -> None:
    finding = _only(_report("budget-squeeze", tmp_path), "time-squeeze")
    assert finding.evidence["netdev_budget"] == 300
    assert finding.evidence["packets_per_net_rx_run"] == pytest.approx(266.7, abs=0.1)
    assert finding.fix_commands == ("sysctl -w net.core.netdev_budget=600",)
    assert finding.persistent == ("/etc/sysctl.d/90-netsleuth.conf: net.core.netdev_budget = 600",)


def test_time_squeeze_with_short_runs_blames_budget_usecs(tmp_path: Path) -> None:
    finding = _only(_report("usecs-squeeze", tmp_path), "time-squeeze")
    assert finding.fix_commands == ("sysctl -w net.core.netdev_budget_usecs=4000",)
    assert "Raising netdev_budget would change nothing" in finding.explanation


def test_softirq_skew_names_the_hot_cpu(tmp_path: Path) -> None:
    finding = _only(_report("softirq-skew", tmp_path), "softirq-skew:cpu5")
    assert finding.evidence["busiest_share"] == pytest.approx(0.7, abs=0.01)
    assert finding.actions == ()


def test_backlog_drops_double_netdev_max_backlog(tmp_path: Path) -> None:
    finding = _only(_report("backlog-drops", tmp_path), "backlog-drops")
    assert finding.evidence["dropped_per_s_by_cpu"] == {"2": 30.0}
    assert finding.fix_commands == ("sysctl -w net.core.netdev_max_backlog=2000",)


def test_tunnel_mtu_fix_fits_the_vxlan_overhead(tmp_path: Path) -> None:
    finding = _only(_report("vxlan-mtu", tmp_path), "tunnel-mtu:vxlan0")
    assert finding.evidence["encapsulation_bytes"] == 50
    assert finding.fix_commands == ("ip link set dev vxlan0 mtu 1450",)
    assert [action.kind for action in finding.actions] == [FixKind.MTU]


def test_tunnel_tso_without_underlay_offload_has_no_automatic_fix(tmp_path: Path) -> None:
    finding = _only(_report("tunnel-tso", tmp_path), "tunnel-tso:vxlan0")
    assert finding.evidence["tx-udp_tnl-segmentation"] == "off [fixed]"
    assert finding.actions == ()


def test_bond_slaves_are_aligned_to_the_bond(tmp_path: Path) -> None:
    finding = _only(_report("bond-slaves", tmp_path), "bond-slave-offload:bond0")
    assert finding.evidence["features"]["rx-gro"] == {"eth0": "on", "eth1": "off"}
    assert set(finding.fix_commands) == {"ethtool -K eth1 gro on", "ethtool -K eth1 tso on"}
    assert {action.target for action in finding.actions} == {"eth1"}


def test_veth_mtu_lowers_the_larger_end(tmp_path: Path) -> None:
    finding = _only(_report("veth-mtu", tmp_path), "veth-mtu:vb")
    assert finding.fix_commands == ("ip link set dev vb mtu 1500",)


def test_conntrack_invalid_suggests_be_liberal(tmp_path: Path) -> None:
    report = _report("conntrack", tmp_path)
    assert _only(report, "conntrack-full").fix_commands == (
        "sysctl -w net.netfilter.nf_conntrack_max=524288",
    )
    invalid = _only(report, "conntrack-invalid")
    assert invalid.fix_commands == ("sysctl -w net.netfilter.nf_conntrack_tcp_be_liberal=1",)


def test_rp_filter_loosens_the_strict_scopes_it_names(tmp_path: Path) -> None:
    finding = _only(_report("rp-filter", tmp_path), "rp-filter-drops")
    targets = {action.target for action in finding.actions}
    assert targets == {"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.eth0.rp_filter"}
    assert all(action.value == "2" for action in finding.actions)


def test_listen_overflow_is_critical_and_raises_somaxconn(tmp_path: Path) -> None:
    finding = _only(_report("listen-overflow", tmp_path), "listen-overflow")
    assert finding.severity is Severity.CRITICAL
    assert "sysctl -w net.core.somaxconn=8192" in finding.fix_commands


def test_udp_rcvbuf_counts_ipv4_and_ipv6(tmp_path: Path) -> None:
    finding = _only(_report("udp-rcvbuf", tmp_path), "udp-rcvbuf-errors")
    assert finding.evidence["RcvbufErrors_per_s"] == 50.0


def test_lro_while_forwarding_is_critical(tmp_path: Path) -> None:
    finding = _only(_report("lro-forwarding", tmp_path), "lro-forwarding:eth0")
    assert finding.severity is Severity.CRITICAL
    assert finding.fix_commands == ("ethtool -K eth0 lro off",)


def test_rx_nohandler_is_explained_not_alarmed(tmp_path: Path) -> None:
    finding = _only(_report("nohandler", tmp_path), "rx-nohandler:eth0")
    assert finding.severity is Severity.INFO
    assert "VLAN" in finding.explanation


def test_findings_sort_worst_first(tmp_path: Path) -> None:
    report = _report("conntrack", tmp_path)
    assert [finding.severity for finding in report.findings] == sorted(f.severity for f in report.findings)
