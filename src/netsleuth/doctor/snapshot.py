"""One pass over every source, from a root directory (the live "/" or a recorded machine), optionally inside
a network namespace. Two snapshots `interval` seconds apart are what the rules judge.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from netsleuth.doctor import ethtool, links, procfs, sysfs
from netsleuth.doctor.model import Snapshot
from netsleuth.doctor.topology import device_irqs
from netsleuth.kernel.netns_exec import call_in_netns
from netsleuth.netns_command import is_host_wide_sysctl

__all__ = ["Clock", "collect_snapshot", "take_snapshot"]

Clock = Callable[[], float]


def take_snapshot(
    root: Path = Path("/"), clock: Clock = time.monotonic, settings_from: Snapshot | None = None
) -> Snapshot:
    """Read every source under `root` in the current namespace. With `settings_from`, ethtool settings
    (features, rings, channels, coalescing) are taken from that earlier snapshot; counters are read anew."""
    taken_at = clock()
    link_records = links.read_links(root)
    names = sorted(link_records) if link_records else sysfs.list_devices(root)
    devices = {name: sysfs.read_device(root, name) for name in names}
    ethtool_records = ethtool.read_ethtool(root, names, settings_from.ethtool if settings_from else None)
    interrupts = procfs.read_interrupts(root)
    nic_irqs: set[int] = set()
    for name in names:
        nic_irqs.update(device_irqs(name, devices.get(name), ethtool_records.get(name), interrupts))
    return Snapshot(
        taken_at=taken_at,
        cpus=sysfs.read_online_cpus(root),
        links=link_records,
        ethtool=ethtool_records,
        devices=devices,
        softnet=procfs.read_softnet(root),
        interrupts=interrupts,
        irq_affinity=procfs.read_irq_affinity(root, sorted(nic_irqs)),
        softirqs=procfs.read_softirqs(root),
        netstat=procfs.read_netstat(root),
        sysctls=procfs.read_sysctls(root, names),
        conntrack=procfs.read_conntrack(root),
    )


def collect_snapshot(
    root: Path = Path("/"),
    netns: str | None = None,
    clock: Clock = time.monotonic,
    settings_from: Snapshot | None = None,
) -> Snapshot:
    """`take_snapshot`, inside `netns` when given (a forked child enters it; see kernel/netns_exec.py)."""
    snapshot = call_in_netns(netns, lambda: take_snapshot(root, clock, settings_from))
    if not netns:
        return snapshot
    # Host-wide sysctls (netdev_budget, netdev_max_backlog, ...) do not exist inside a namespace; the
    # namespace's traffic is judged against the host's values, read here, outside it.
    host = {
        key: value
        for key, value in procfs.read_sysctls(root, []).items()
        if is_host_wide_sysctl(key) and key not in snapshot.sysctls
    }
    # Recorded with the snapshot, so fixes printed from it (also on replay) name the namespace.
    return dataclasses.replace(snapshot, netns=netns, sysctls={**snapshot.sysctls, **host})
