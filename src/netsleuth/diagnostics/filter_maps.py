"""The in-kernel side of the shared packet filters: the LPM address maps, the --pid/--comm socket-inode set
and the namespace set, filled the same way for every program that declares them (bpf/filter_maps.bpf.h).

Map names and layouts are the programs' contract: `host_filter`, `src_filter`, `dst_filter` (LPM tries keyed
by struct lpm_addr_key, bpf/packet.h), `owner_inodes` (u64 socket inode -> u8) and `netns_filter` (u32
netns inode -> u8). They are reached through each object's generated maps (`FilterMaps`, netsleuth.bpf.abigen
checks every filtering object declares them), and the config fields are written fail-closed: a filter the
struct has no field for is an error, never a filter left open.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol

from netsleuth._generated.shared_abi import LpmAddrKey
from netsleuth.bpf.errors import BpfError
from netsleuth.diagnostics.filters import IpNetwork, PacketFilter

if TYPE_CHECKING:
    from netsleuth.bpf.maps import BpfMap
    from netsleuth.kernel.process import SocketOwners

__all__ = [
    "FilterMaps",
    "OwnerInodeSync",
    "fill_address_maps",
    "fill_filter_config",
    "fill_netns_config",
    "lpm_key",
]


class FilterMaps(Protocol):
    """The maps of bpf/filter_maps.bpf.h, as every filtering object's generated `<Name>Maps` has them."""

    @property
    def host_filter(self) -> BpfMap: ...
    @property
    def src_filter(self) -> BpfMap: ...
    @property
    def dst_filter(self) -> BpfMap: ...
    @property
    def owner_inodes(self) -> BpfMap: ...
    @property
    def netns_filter(self) -> BpfMap: ...


_OWNER_REFRESH_S = 0.5


def lpm_key(network: IpNetwork) -> bytes:
    """The LPM key of a prefix: the family byte is part of the prefix, so v4 never matches v6."""
    key = LpmAddrKey()
    key.family = network.version
    key.prefixlen = 8 + network.prefixlen
    packed = network.network_address.packed
    ctypes.memmove(key.addr, packed, len(packed))
    return bytes(key)


def fill_filter_config(
    cfg: ctypes.Structure, packet_filter: PacketFilter, inherent: Collection[str] = ()
) -> None:
    """The shared filter fields of a program's .rodata config (netns, pid, comm, ports, family, proto, dev and
    the flags that say which filter maps to consult), named alike in every config struct.

    Fail closed: every field a filter needs must be in the struct, or this raises a BpfError naming it - a
    field renamed in C never leaves its filter open. --proto and --dev need theirs only when given (a
    program that cannot apply them has none, and its config has no such option), and `inherent` names the
    filters the object applies by what it is (tcp: "proto", it sees TCP only). Names are cut to the kernel's
    15 bytes (--comm and --dev are checked in characters; a multi-byte name could be longer)."""
    values: dict[str, object] = {
        "netns": packet_filter.netns or 0,
        "pid": packet_filter.pid or 0,
        "comm": (packet_filter.comm or "").encode()[:15],
        "port": packet_filter.port or 0,
        "sport": packet_filter.sport or 0,
        "dport": packet_filter.dport or 0,
        "family": packet_filter.family or 0,
        "filter_host": int(bool(packet_filter.hosts)),
        "filter_src": int(bool(packet_filter.sources)),
        "filter_dst": int(bool(packet_filter.destinations)),
        "filter_owner": int(packet_filter.filters_owner),
        "filter_netns": int(bool(packet_filter.netns_set)),
    }
    if packet_filter.proto is not None and "proto" not in inherent:
        values.update(filter_l4proto=1, l4proto=packet_filter.proto)
    if packet_filter.dev and "dev" not in inherent:
        values.update(filter_dev=1, dev=packet_filter.dev.encode()[:15])
    _write_fields(cfg, values)


def fill_netns_config(cfg: ctypes.Structure, netns: int | None) -> None:
    """The namespace filter of an object that filters by namespace only (snoop, softirq, profile: they
    include bpf/filter_maps.bpf.h with NS_FILTER_NETNS_ONLY): one inode, 0 for any. Fails closed alike."""
    _write_fields(cfg, {"netns": netns or 0, "filter_netns": 0})


def _write_fields(cfg: ctypes.Structure, values: dict[str, object]) -> None:
    missing = [name for name in values if not hasattr(type(cfg), name)]
    if missing:
        c_name = getattr(type(cfg), "c_name", type(cfg).__name__)
        raise BpfError(
            f"struct {c_name} has no {', '.join(missing)}: the filter cannot be applied in the kernel, and "
            "the object and the Python code are out of step (run `make bpf`)"
        )
    for name, value in values.items():
        setattr(cfg, name, value)


def fill_address_maps(maps: FilterMaps, packet_filter: PacketFilter) -> None:
    """--host/--src/--dst prefixes into the object's LPM maps, and the namespaces of a filter that names
    several (--k8s-namespace) into `netns_filter` (the cfg flags say which to consult)."""
    if packet_filter.netns_set:
        netns_map = maps.netns_filter
        for inode in packet_filter.netns_set:
            netns_map.update(inode.to_bytes(4, "little"), b"\x01")
    for lpm, networks in (
        (maps.host_filter, packet_filter.hosts),
        (maps.src_filter, packet_filter.sources),
        (maps.dst_filter, packet_filter.destinations),
    ):
        for network in networks:
            lpm.update(lpm_key(network), b"\x01")


class OwnerInodeSync:
    """Keeps `owner_inodes` equal to the socket inodes the --pid/--comm processes hold, rescanning /proc at
    most every `interval` seconds (a process opens sockets while we trace it)."""

    def __init__(
        self,
        packet_filter: PacketFilter,
        processes: SocketOwners | None = None,
        interval: float = _OWNER_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._filter = packet_filter
        self._processes = processes  # made on the first refresh that needs it: most runs filter no owner
        self._interval = interval
        self._clock = clock
        self._refreshed: float | None = None
        self._inodes: set[int] = set()

    def refresh(self, maps: FilterMaps, force: bool = False) -> None:
        if not self._filter.filters_owner:
            return
        now = self._clock()
        if not force and self._refreshed is not None and now - self._refreshed < self._interval:
            return
        self._refreshed = now
        if self._processes is None:
            from netsleuth.kernel.process import SocketOwners

            self._processes = SocketOwners()
        inodes = self._processes.socket_inodes_of(
            self._processes.pids_matching(self._filter.pid, self._filter.comm)
        )
        inodes_map = maps.owner_inodes
        for inode in self._inodes - inodes:
            inodes_map.delete(inode.to_bytes(8, "little"))
        for inode in inodes - self._inodes:
            inodes_map.update(inode.to_bytes(8, "little"), b"\x01")
        self._inodes = inodes
