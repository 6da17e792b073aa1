"""Record the files and netlink answers one snapshot reads into a directory that works as a `root`: the
fixtures under tests/fixtures/doctor/ are made this way, and a bug report can carry one.

    python -m netsleuth.doctor.recording DEST [--netns NAME]

The layout mirrors the live tree (proc/..., sys/...), with each NIC's `device` link pointing at a small
sys/devices/<name>/ directory holding numa_node, local_cpulist and msi_irqs; netlink answers go to
netlink/links.json and netlink/ethtool.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from netsleuth.doctor import ethtool, links, procfs, sysfs
from netsleuth.doctor.cpuset import format_cpu_list
from netsleuth.doctor.topology import device_irqs
from netsleuth.kernel.netns_exec import call_in_netns

__all__ = ["record_root"]

_PROC_FILES = (
    "proc/net/softnet_stat",
    "proc/interrupts",
    "proc/softirqs",
    "proc/net/snmp",
    "proc/net/netstat",
    "proc/net/snmp6",
    "proc/net/stat/nf_conntrack",
    "proc/sys/net/netfilter/nf_conntrack_count",
    "proc/sys/net/netfilter/nf_conntrack_max",
)


def _copy(source: Path, destination: Path) -> None:
    try:
        data = source.read_bytes()
    except OSError:
        return
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_bytes(data)


def _record_device(live: Path, dest: Path, name: str) -> None:
    net_dir = live / "sys/class/net" / name
    out_dir = dest / "sys/class/net" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    for stat in ("rx_nohandler", "rx_otherhost_dropped"):
        _copy(net_dir / "statistics" / stat, out_dir / "statistics" / stat)
    for queue in sorted((net_dir / "queues").glob("*")) if (net_dir / "queues").is_dir() else []:
        for file_name in ("rps_cpus", "xps_cpus"):
            _copy(queue / file_name, out_dir / "queues" / queue.name / file_name)
    for file_name in ("slaves", "mode"):
        _copy(net_dir / "bonding" / file_name, out_dir / "bonding" / file_name)
    device = sysfs.read_device(live, name)
    if not device.is_physical:
        return
    device_dir = dest / "sys/devices" / (device.device_name or name)
    device_dir.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(device_dir, out_dir), out_dir / "device")
    if device.numa_node is not None:
        (device_dir / "numa_node").write_text(f"{device.numa_node}\n")
    if device.local_cpus:
        (device_dir / "local_cpulist").write_text(format_cpu_list(device.local_cpus) + "\n")
    for irq in device.msi_irqs:
        (device_dir / "msi_irqs").mkdir(exist_ok=True)
        (device_dir / "msi_irqs" / str(irq)).write_text("msix\n")


def _record(dest: Path) -> None:
    live = Path("/")
    for relative in _PROC_FILES:
        _copy(live / relative, dest / relative)
    _copy(live / "sys/devices/system/cpu/online", dest / "sys/devices/system/cpu/online")
    link_records = links.read_links(live)
    names = sorted(link_records)
    for key in procfs.read_sysctls(live, names):
        _copy(procfs.sysctl_path(live, key), procfs.sysctl_path(dest, key))
    for name in names:
        _record_device(live, dest, name)
    ethtool_records = ethtool.read_ethtool(live, names)
    interrupts = procfs.read_interrupts(live)
    for name in names:
        device = sysfs.read_device(live, name)
        for irq in device_irqs(name, device, ethtool_records.get(name), interrupts):
            for file_name in ("smp_affinity_list", "effective_affinity_list"):
                _copy(live / f"proc/irq/{irq}/{file_name}", dest / f"proc/irq/{irq}/{file_name}")
    (dest / "netlink").mkdir(parents=True, exist_ok=True)
    (dest / links.LINKS_FILE).write_text(
        json.dumps([asdict(link) for link in link_records.values()], indent=1)
    )
    (dest / ethtool.ETHTOOL_FILE).write_text(
        json.dumps({name: asdict(record) for name, record in ethtool_records.items()}, indent=1)
    )


def record_root(dest: Path, netns: str | None = None) -> None:
    """Write everything a snapshot reads, live, into `dest` (emptied first)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    call_in_netns(netns, lambda: _record(dest))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--netns")
    arguments = parser.parse_args()
    record_root(arguments.dest, arguments.netns)
