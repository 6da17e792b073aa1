"""The in-kernel side of the shared packet filters: the LPM address maps, the --pid/--comm socket-inode set
and the namespace set, filled the same way for every program that declares them (bpf/filter_maps.bpf.h).

Map names and layouts are the programs' contract: `host_filter`, `src_filter`, `dst_filter` (LPM tries keyed
by struct lpm_addr_key, bpf/packet.h), `owner_inodes` (u64 socket inode -> u8) and `netns_filter` (u32
netns inode -> u8).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from netsleuth._generated.shared_abi import LpmAddrKey
from netsleuth.bpf.object import BpfObject
from netsleuth.diagnostics.filters import IpNetwork, PacketFilter

if TYPE_CHECKING:
    from netsleuth.kernel.process import SocketOwners

__all__ = ["OwnerInodeSync", "fill_address_maps", "fill_filter_config", "lpm_key"]

_OWNER_REFRESH_S = 0.5


def lpm_key(network: IpNetwork) -> bytes:
    """The LPM key of a prefix: the family byte is part of the prefix, so v4 never matches v6."""
    key = LpmAddrKey()
    key.family = network.version
    key.prefixlen = 8 + network.prefixlen
    packed = network.network_address.packed
    ctypes.memmove(key.addr, packed, len(packed))
    return bytes(key)


def fill_filter_config(cfg: ctypes.Structure, packet_filter: PacketFilter) -> None:
    """The shared filter fields of a program's .rodata config (netns, pid, comm, ports, family, proto, dev and
    the flags that say which filter maps to consult), named alike in every config struct.

    Only the fields the struct declares are set: a program that cannot apply a filter has no field for it,
    and its config reader refuses that filter with a sentence (tcp: --dev, route: -6). Names are cut to the
    kernel's 15 bytes (--comm and --dev are checked in characters; a multi-byte name could be longer)."""
    fields = {entry[0] for entry in type(cfg)._fields_}
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
    if packet_filter.proto is not None:
        values.update(filter_l4proto=1, l4proto=packet_filter.proto)
    if packet_filter.dev:
        values.update(filter_dev=1, dev=packet_filter.dev.encode()[:15])
    for name, value in values.items():
        if name in fields:
            setattr(cfg, name, value)


def fill_address_maps(bpf_object: BpfObject, packet_filter: PacketFilter) -> None:
    """--host/--src/--dst prefixes into the object's LPM maps, and the namespaces of a filter that names
    several (--k8s-namespace) into `netns_filter` (the cfg flags say which to consult)."""
    if packet_filter.netns_set:
        netns_map = bpf_object.map("netns_filter")
        for inode in packet_filter.netns_set:
            netns_map.update(inode.to_bytes(4, "little"), b"\x01")
    for map_name, networks in (
        ("host_filter", packet_filter.hosts),
        ("src_filter", packet_filter.sources),
        ("dst_filter", packet_filter.destinations),
    ):
        lpm = bpf_object.map(map_name)
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

    def refresh(self, bpf_object: BpfObject, force: bool = False) -> None:
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
        inodes_map = bpf_object.map("owner_inodes")
        for inode in self._inodes - inodes:
            inodes_map.delete(inode.to_bytes(8, "little"))
        for inode in inodes - self._inodes:
            inodes_map.update(inode.to_bytes(8, "little"), b"\x01")
        self._inodes = inodes
