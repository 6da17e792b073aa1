"""The typed view of one moment of the machine's packet path: what every source returns, what rules read.

Everything here is plain data (ints, strings, tuples, dicts) so a `Snapshot` round-trips through JSON: the
same rules run on a live machine, on a recorded fixture and on a bundle sent from another host.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "ChannelRecord",
    "ConntrackRecord",
    "DeviceSysfs",
    "EthtoolRecord",
    "FeatureState",
    "InterruptLine",
    "IrqAffinity",
    "LinkRecord",
    "RingRecord",
    "Snapshot",
    "SoftnetRow",
    "TunnelRecord",
]


@dataclass(frozen=True)
class TunnelRecord:
    """An encapsulating device and the device its packets leave through (the underlay)."""

    kind: str
    underlay_index: int | None
    ipv6: bool
    # Bytes added beyond the kind's base overhead (GRE key/csum/seq words), see rules/mtu.py.
    option_bytes: int = 0


@dataclass(frozen=True)
class LinkRecord:
    """One interface as rtnetlink (RTM_GETLINK) describes it, plus the few counters only sysfs has."""

    index: int
    name: str
    kind: str | None  # IFLA_INFO_KIND ("veth", "vxlan", "bond", "bridge"); None for a plain NIC or loopback
    mtu: int
    operstate: str
    master_index: int | None
    link_index: int | None  # IFLA_LINK: the veth peer, or the lower device of a macvlan/vlan
    link_netnsid: int | None  # set when IFLA_LINK lives in another namespace
    peer_name: str | None = None
    peer_mtu: int | None = None
    peer_netns: str | None = None  # `ip netns` name of the peer's namespace, when it has one
    tunnel: TunnelRecord | None = None
    num_rx_queues: int = 1
    num_tx_queues: int = 1
    stats: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FeatureState:
    """One `ethtool -k` line: active now, and whether the driver lets anyone change it ("[fixed]")."""

    active: bool
    fixed: bool


@dataclass(frozen=True)
class RingRecord:
    rx: int | None
    rx_max: int | None
    tx: int | None
    tx_max: int | None


@dataclass(frozen=True)
class ChannelRecord:
    rx: int
    tx: int
    other: int
    combined: int
    max_rx: int
    max_tx: int
    max_other: int
    max_combined: int

    @property
    def rx_queues(self) -> int:
        return self.combined + self.rx

    @property
    def max_rx_queues(self) -> int:
        return self.max_combined + self.max_rx


@dataclass(frozen=True)
class EthtoolRecord:
    """What `ethtool -i/-k/-g/-l/-c/-S` would show, read through ioctl/genetlink; None where unsupported."""

    driver: str | None = None
    bus_info: str | None = None
    firmware_version: str | None = None
    features: dict[str, FeatureState] = field(default_factory=dict)
    rings: RingRecord | None = None
    channels: ChannelRecord | None = None
    coalesce: dict[str, int] | None = None
    driver_stats: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceSysfs:
    """/sys/class/net/DEV: where the NIC sits (NUMA), its queues' RPS/XPS masks, its IRQs, bonding."""

    is_physical: bool = False
    device_name: str | None = None  # basename of the `device` link ("0000:03:00.0", "virtio2")
    numa_node: int | None = None
    local_cpus: tuple[int, ...] = ()
    rps_cpus: dict[str, tuple[int, ...]] = field(default_factory=dict)  # "rx-0" -> CPUs
    xps_cpus: dict[str, tuple[int, ...]] = field(default_factory=dict)  # "tx-0" -> CPUs
    msi_irqs: tuple[int, ...] = ()
    bond_mode: str | None = None
    bond_slaves: tuple[str, ...] = ()
    extra_stats: dict[str, int] = field(default_factory=dict)  # rx_nohandler: not in pyroute2's stats64


@dataclass(frozen=True)
class SoftnetRow:
    """One line of /proc/net/softnet_stat (net/core/net-procfs.c softnet_seq_show)."""

    cpu: int
    processed: int
    dropped: int
    time_squeeze: int
    received_rps: int
    flow_limit_count: int
    backlog_len: int | None


@dataclass(frozen=True)
class InterruptLine:
    irq: int
    per_cpu: tuple[int, ...]
    chip: str
    actions: str  # the handler names, e.g. "eth0-TxRx-3" or "virtio2-input.0"


@dataclass(frozen=True)
class IrqAffinity:
    requested: tuple[int, ...]  # smp_affinity_list: what someone asked for
    effective: tuple[int, ...]  # effective_affinity_list: where the interrupt controller really sends it


@dataclass(frozen=True)
class ConntrackRecord:
    count: int
    max: int
    stats: dict[str, int]  # /proc/net/stat/nf_conntrack columns summed over CPUs


@dataclass(frozen=True)
class Snapshot:
    """Everything one pass over the sources read; two of them, `interval` apart, make a judgement."""

    taken_at: float
    cpus: tuple[int, ...] = ()
    links: dict[str, LinkRecord] = field(default_factory=dict)
    ethtool: dict[str, EthtoolRecord] = field(default_factory=dict)
    devices: dict[str, DeviceSysfs] = field(default_factory=dict)
    softnet: tuple[SoftnetRow, ...] = ()
    interrupts: dict[int, InterruptLine] = field(default_factory=dict)
    irq_affinity: dict[int, IrqAffinity] = field(default_factory=dict)
    softirqs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    netstat: dict[str, int] = field(default_factory=dict)  # "TcpExt.ListenOverflows" -> value
    sysctls: dict[str, str] = field(default_factory=dict)  # "net.core.netdev_budget" -> "300"
    conntrack: ConntrackRecord | None = None
    netns: str | None = None  # the `ip netns` name (or file) it was read in; None: the caller's namespace

    def link_by_index(self, index: int | None) -> LinkRecord | None:
        if index is None:
            return None
        for link in self.links.values():
            if link.index == index:
                return link
        return None

    def sysctl_int(self, key: str) -> int | None:
        value = self.sysctls.get(key)
        if value is None:
            return None
        try:
            return int(value.split()[0])
        except (ValueError, IndexError):
            return None

    def to_json(self) -> dict[str, Any]:
        raw = asdict(self)
        # JSON keys must be strings; IRQ numbers come back as ints in from_json.
        raw["interrupts"] = {str(irq): line for irq, line in raw["interrupts"].items()}
        raw["irq_affinity"] = {str(irq): aff for irq, aff in raw["irq_affinity"].items()}
        return raw

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Snapshot:
        return cls(
            taken_at=float(raw["taken_at"]),
            cpus=tuple(raw.get("cpus", ())),
            links={name: link_from_json(value) for name, value in raw.get("links", {}).items()},
            ethtool={name: ethtool_from_json(value) for name, value in raw.get("ethtool", {}).items()},
            devices={name: device_from_json(value) for name, value in raw.get("devices", {}).items()},
            softnet=tuple(SoftnetRow(**row) for row in raw.get("softnet", ())),
            interrupts={
                int(irq): InterruptLine(
                    irq=int(line["irq"]),
                    per_cpu=tuple(line["per_cpu"]),
                    chip=line["chip"],
                    actions=line["actions"],
                )
                for irq, line in raw.get("interrupts", {}).items()
            },
            irq_affinity={
                int(irq): IrqAffinity(requested=tuple(aff["requested"]), effective=tuple(aff["effective"]))
                for irq, aff in raw.get("irq_affinity", {}).items()
            },
            softirqs={name: tuple(values) for name, values in raw.get("softirqs", {}).items()},
            netstat=dict(raw.get("netstat", {})),
            sysctls=dict(raw.get("sysctls", {})),
            conntrack=ConntrackRecord(**raw["conntrack"]) if raw.get("conntrack") else None,
            netns=raw.get("netns"),
        )


def link_from_json(raw: dict[str, Any]) -> LinkRecord:
    tunnel = raw.get("tunnel")
    return LinkRecord(
        index=raw["index"],
        name=raw["name"],
        kind=raw.get("kind"),
        mtu=raw["mtu"],
        operstate=raw.get("operstate", "UNKNOWN"),
        master_index=raw.get("master_index"),
        link_index=raw.get("link_index"),
        link_netnsid=raw.get("link_netnsid"),
        peer_name=raw.get("peer_name"),
        peer_mtu=raw.get("peer_mtu"),
        peer_netns=raw.get("peer_netns"),
        tunnel=TunnelRecord(**tunnel) if tunnel else None,
        num_rx_queues=raw.get("num_rx_queues", 1),
        num_tx_queues=raw.get("num_tx_queues", 1),
        stats=dict(raw.get("stats", {})),
    )


def ethtool_from_json(raw: dict[str, Any]) -> EthtoolRecord:
    return EthtoolRecord(
        driver=raw.get("driver"),
        bus_info=raw.get("bus_info"),
        firmware_version=raw.get("firmware_version"),
        features={name: FeatureState(**state) for name, state in raw.get("features", {}).items()},
        rings=RingRecord(**raw["rings"]) if raw.get("rings") else None,
        channels=ChannelRecord(**raw["channels"]) if raw.get("channels") else None,
        coalesce=dict(raw["coalesce"]) if raw.get("coalesce") is not None else None,
        driver_stats=dict(raw.get("driver_stats", {})),
    )


def device_from_json(raw: dict[str, Any]) -> DeviceSysfs:
    return DeviceSysfs(
        is_physical=raw.get("is_physical", False),
        device_name=raw.get("device_name"),
        numa_node=raw.get("numa_node"),
        local_cpus=tuple(raw.get("local_cpus", ())),
        rps_cpus={queue: tuple(cpus) for queue, cpus in raw.get("rps_cpus", {}).items()},
        xps_cpus={queue: tuple(cpus) for queue, cpus in raw.get("xps_cpus", {}).items()},
        msi_irqs=tuple(raw.get("msi_irqs", ())),
        bond_mode=raw.get("bond_mode"),
        bond_slaves=tuple(raw.get("bond_slaves", ())),
        extra_stats=dict(raw.get("extra_stats", {})),
    )
