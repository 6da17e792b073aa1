"""The /proc and /sys readers on literal file contents, and the Snapshot JSON round trip."""

from __future__ import annotations

from pathlib import Path

from netsleuth.doctor import procfs, sysfs
from netsleuth.doctor.cpuset import format_cpu_list, format_cpu_mask, parse_cpu_list, parse_cpu_mask
from netsleuth.doctor.model import DeviceSysfs, InterruptLine, Snapshot
from netsleuth.doctor.snapshot import take_snapshot
from netsleuth.doctor.topology import queue_irqs, rx_queue_irqs
from netsleuth.doctor.window import counter_delta
from tests.fixtures.doctor import FIXTURES


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cpu_lists_and_masks_round_trip() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpu_list((11, 0, 1, 2, 3, 8, 10)) == "0-3,8,10-11"
    assert parse_cpu_mask("00000000,0000010f") == (0, 1, 2, 3, 8)
    assert format_cpu_mask((0, 1, 2, 3, 8)) == "10f"
    assert parse_cpu_mask("0") == ()


def test_softnet_reads_new_and_old_column_layouts(tmp_path: Path) -> None:
    new = "0000083e 00000002 00000003 0 0 0 0 0 0 00000004 00000005 00000006 00000001 00000000 00000006\n"
    _write(tmp_path, "proc/net/softnet_stat", new)
    (row,) = procfs.read_softnet(tmp_path)
    assert (row.cpu, row.processed, row.dropped, row.time_squeeze) == (1, 0x83E, 2, 3)
    assert (row.received_rps, row.flow_limit_count, row.backlog_len) == (4, 5, 6)
    old = "00000010 00000000 00000001 0 0 0 0 0 0 00000000 00000000\n" * 2
    _write(tmp_path, "proc/net/softnet_stat", old)
    rows = procfs.read_softnet(tmp_path)
    assert [row.cpu for row in rows] == [0, 1] and rows[0].backlog_len is None


def test_interrupts_parse_handler_names(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "proc/interrupts",
        "           CPU0       CPU1\n"
        " 38:          0       1473 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0\n"
        " 39:       1232          0 PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0\n"
        "NMI:          0          0   Non-maskable interrupts\n",
    )
    interrupts = procfs.read_interrupts(tmp_path)
    assert set(interrupts) == {38, 39}
    assert interrupts[38].per_cpu == (0, 1473) and interrupts[38].actions == "virtio2-input.0"


def test_queue_irqs_skip_control_and_bare_link_vectors() -> None:
    lines = {
        64: InterruptLine(64, (1,), "PCI", "eth0-TxRx-0"),
        65: InterruptLine(65, (1,), "PCI", "eth0-TxRx-1"),
        66: InterruptLine(66, (1,), "PCI", "eth0"),
        37: InterruptLine(37, (1,), "PCI", "virtio2-config"),
        38: InterruptLine(38, (1,), "PCI", "virtio2-input.0"),
        39: InterruptLine(39, (1,), "PCI", "virtio2-output.0"),
    }
    assert queue_irqs("eth0", DeviceSysfs(is_physical=True), None, lines) == [64, 65]
    virtio = DeviceSysfs(is_physical=True, device_name="virtio2", msi_irqs=(37, 38, 39))
    assert queue_irqs("ens3", virtio, None, lines) == [38, 39]
    assert rx_queue_irqs("ens3", virtio, None, lines) == [38]
    single = {66: lines[66]}
    assert queue_irqs("eth0", DeviceSysfs(is_physical=True), None, single) == [66]


def test_netstat_snmp_and_snmp6(tmp_path: Path) -> None:
    _write(tmp_path, "proc/net/netstat", "TcpExt: ListenOverflows ListenDrops\nTcpExt: 7 9\n")
    _write(tmp_path, "proc/net/snmp", "Udp: InDatagrams RcvbufErrors\nUdp: 100 3\n")
    _write(tmp_path, "proc/net/snmp6", "Ip6InReceives      5\nUdp6RcvbufErrors   2\n")
    counters = procfs.read_netstat(tmp_path)
    assert counters["TcpExt.ListenOverflows"] == 7 and counters["Udp.RcvbufErrors"] == 3
    assert counters["Udp6.RcvbufErrors"] == 2 and counters["Ip6.InReceives"] == 5


def test_sysctls_include_rp_filter_of_dotted_device_names(tmp_path: Path) -> None:
    _write(tmp_path, "proc/sys/net/core/netdev_budget", "300\n")
    _write(tmp_path, "proc/sys/net/ipv4/conf/eth0.100/rp_filter", "1\n")
    _write(tmp_path, "proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456\n")
    values = procfs.read_sysctls(tmp_path, ["eth0.100"])
    assert values["net.core.netdev_budget"] == "300"
    assert values["net.ipv4.conf.eth0.100.rp_filter"] == "1"
    assert values["net.ipv4.tcp_rmem"] == "4096 131072 6291456"
    assert procfs.sysctl_path(tmp_path, "net.ipv4.conf.eth0.100.rp_filter").exists()


def test_conntrack_sums_per_cpu_hex_rows(tmp_path: Path) -> None:
    _write(tmp_path, "proc/sys/net/netfilter/nf_conntrack_count", "10\n")
    _write(tmp_path, "proc/sys/net/netfilter/nf_conntrack_max", "100\n")
    _write(
        tmp_path,
        "proc/net/stat/nf_conntrack",
        "entries invalid drop\n0000000a 00000010 00000001\n0000000a 00000001 0\n",
    )
    record = procfs.read_conntrack(tmp_path)
    assert record is not None and (record.count, record.max) == (10, 100)
    assert record.stats == {"entries": 10, "invalid": 17, "drop": 1}
    assert procfs.read_conntrack(tmp_path / "nothing") is None


def test_device_reads_numa_queues_and_bonding(tmp_path: Path) -> None:
    device = sysfs.read_device(FIXTURES / "base/before", "eth0")
    assert device.is_physical and device.device_name == "0000:03:00.0"
    assert device.numa_node == 0 and device.local_cpus == tuple(range(8))
    assert len(device.rps_cpus) == 8 and device.xps_cpus["tx-3"] == (3,)
    assert device.msi_irqs == tuple(range(64, 73))
    _write(tmp_path, "sys/class/net/bond0/bonding/slaves", "eth0 eth1\n")
    _write(tmp_path, "sys/class/net/bond0/bonding/mode", "active-backup 1\n")
    bond = sysfs.read_device(tmp_path, "bond0")
    assert bond.bond_slaves == ("eth0", "eth1") and bond.bond_mode == "active-backup" and not bond.is_physical


def test_missing_files_read_as_absent(tmp_path: Path) -> None:
    snapshot = take_snapshot(tmp_path, clock=lambda: 1.0)
    assert snapshot.links == {} and snapshot.softnet == () and snapshot.conntrack is None


def test_snapshot_json_round_trip() -> None:
    snapshot = take_snapshot(FIXTURES / "base/before", clock=lambda: 5.0)
    assert Snapshot.from_json(snapshot.to_json()) == snapshot


def test_counter_reset_is_not_growth() -> None:
    assert counter_delta(100, 150) == 50
    assert counter_delta(150, 3) == 0
    assert counter_delta(None, 3) == 0
