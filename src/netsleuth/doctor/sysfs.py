"""Readers for /sys: online CPUs, and per device its NUMA node, local CPUs, queue RPS/XPS masks, MSI IRQs,
bonding mode and slaves, and the counters pyroute2's stats64 lacks.

Paths from Documentation/ABI/testing/sysfs-class-net, sysfs-class-net-queues, sysfs-bus-pci and
Documentation/networking/bonding.rst. Every reader takes `root` (the directory holding `sys/`).
"""

from __future__ import annotations

import os
from pathlib import Path

from netsleuth.doctor.cpuset import parse_cpu_list, parse_cpu_mask
from netsleuth.doctor.model import DeviceSysfs

__all__ = ["list_devices", "read_device", "read_online_cpus"]

# rtnl_link_stats64 fields that pyroute2 0.9's ifstats64 does not decode (include/uapi/linux/if_link.h).
_EXTRA_STATS = ("rx_nohandler", "rx_otherhost_dropped")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        # xps_cpus on a single-queue device and some driver files answer EINVAL/ENOENT: treat as absent.
        return None


def read_online_cpus(root: Path) -> tuple[int, ...]:
    text = _read(root / "sys/devices/system/cpu/online")
    return parse_cpu_list(text) if text else ()


def list_devices(root: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in (root / "sys/class/net").iterdir())
    except OSError:
        return []


def _msi_irqs(device_dir: Path) -> tuple[int, ...]:
    # A PCI NIC lists its vectors in device/msi_irqs; a virtio NIC's `device` is the virtio bus device,
    # whose PCI parent holds them.
    for candidate in (device_dir / "msi_irqs", device_dir / ".." / "msi_irqs"):
        try:
            return tuple(sorted(int(entry.name) for entry in candidate.iterdir() if entry.name.isdigit()))
        except OSError:
            continue
    return ()


def _numa_node(device_dir: Path) -> int | None:
    for candidate in (device_dir / "numa_node", device_dir / ".." / "numa_node"):
        text = _read(candidate)
        if text is not None:
            node = int(text)
            return node if node >= 0 else None
    return None


def _local_cpus(device_dir: Path) -> tuple[int, ...]:
    for candidate in (device_dir / "local_cpulist", device_dir / ".." / "local_cpulist"):
        text = _read(candidate)
        if text:
            return parse_cpu_list(text)
    return ()


def _queue_masks(net_dir: Path, prefix: str, file_name: str) -> dict[str, tuple[int, ...]]:
    masks: dict[str, tuple[int, ...]] = {}
    try:
        queues = sorted(entry for entry in (net_dir / "queues").iterdir() if entry.name.startswith(prefix))
    except OSError:
        return masks
    for queue in queues:
        text = _read(queue / file_name)
        if text is not None:
            masks[queue.name] = parse_cpu_mask(text)
    return masks


def read_device(root: Path, name: str) -> DeviceSysfs:
    net_dir = root / "sys/class/net" / name
    device_dir = net_dir / "device"
    is_physical = device_dir.exists()
    device_name: str | None = None
    if is_physical:
        try:
            device_name = os.path.basename(os.readlink(device_dir))
        except OSError:
            device_name = None
    extra_stats: dict[str, int] = {}
    for stat in _EXTRA_STATS:
        text = _read(net_dir / "statistics" / stat)
        if text is not None and text.isdigit():
            extra_stats[stat] = int(text)
    slaves_text = _read(net_dir / "bonding/slaves")
    mode_text = _read(net_dir / "bonding/mode")
    return DeviceSysfs(
        is_physical=is_physical,
        device_name=device_name,
        numa_node=_numa_node(device_dir) if is_physical else None,
        local_cpus=_local_cpus(device_dir) if is_physical else (),
        rps_cpus=_queue_masks(net_dir, "rx-", "rps_cpus"),
        xps_cpus=_queue_masks(net_dir, "tx-", "xps_cpus"),
        msi_irqs=_msi_irqs(device_dir) if is_physical else (),
        # bonding/mode reads "balance-rr 0"; keep the name.
        bond_mode=mode_text.split()[0] if mode_text else None,
        bond_slaves=tuple(slaves_text.split()) if slaves_text else (),
        extra_stats=extra_stats,
    )
