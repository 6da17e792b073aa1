"""Conntrack entries read over netlink (NETLINK_NETFILTER, the ctnetlink subsystem `conntrack -L` uses), in
every network namespace on the host, as `nat_join.ConntrackEntry` tagged with where they were read.

Read-only: a dump (IPCTNL_MSG_CT_GET with NLM_F_DUMP) changes nothing. Each namespace gets its own socket,
created inside it once (pyroute2 forks a child that enters the namespace and passes the socket back, so this
process never changes namespace) and reused for every later read. Entries of other protocols are skipped
here, not in the kernel (see `_dump`).

What a dump can and cannot show: only *confirmed* entries are in the table. An entry is confirmed when its
first packet leaves the namespace's last hook (nf_conntrack_confirm at POSTROUTING/INPUT), so a NAT hop that
forwards a SYN has a confirmed entry (it lasts nf_conntrack_tcp_timeout_syn_sent, 120 s, while the client
retries), but a SYN dropped in the same namespace that translated it is never confirmed and never listed
(since Linux 6.1 the unconfirmed list is gone: IPCTNL_MSG_CT_GET_UNCONFIRMED dumps nothing).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterable
from typing import Any, Protocol

from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple, status_names
from netsleuth.kernel.netns import NetnsNames, current_netns_inode

__all__ = [
    "ConntrackReader",
    "ConntrackSource",
    "entry_from_message",
]

_PROTO_NAMES = {socket.IPPROTO_TCP: "tcp", socket.IPPROTO_UDP: "udp", 1: "icmp", 58: "icmpv6", 132: "sctp"}
# UAPI include/uapi/linux/netfilter/nf_conntrack_tcp.h enum tcp_conntrack.
_TCP_STATES = (
    "NONE",
    "SYN_SENT",
    "SYN_RECV",
    "ESTABLISHED",
    "FIN_WAIT",
    "CLOSE_WAIT",
    "LAST_ACK",
    "TIME_WAIT",
    "CLOSE",
    "SYN_SENT2",
)
_DEFAULT_LIMIT = 65536  # entries kept per namespace and read: a table larger than this is cut, and counted


class ConntrackSource(Protocol):
    """What `conn`'s tracker asks: the entries of every namespace it can see, read now."""

    def entries(self) -> list[ConntrackEntry]: ...


def _tuple(proto_num: int, raw: Any) -> FlowTuple | None:
    if raw is None:
        return None
    ip, proto = raw.get_attr("CTA_TUPLE_IP"), raw.get_attr("CTA_TUPLE_PROTO")
    if ip is None or proto is None:
        return None
    src = ip.get_attr("CTA_IP_V4_SRC") or ip.get_attr("CTA_IP_V6_SRC")
    dst = ip.get_attr("CTA_IP_V4_DST") or ip.get_attr("CTA_IP_V6_DST")
    if src is None or dst is None:
        return None
    sport = proto.get_attr("CTA_PROTO_SRC_PORT") or proto.get_attr("CTA_PROTO_ICMP_ID") or 0
    dport = proto.get_attr("CTA_PROTO_DST_PORT") or 0
    name = _PROTO_NAMES.get(proto_num, str(proto_num))
    return FlowTuple(name, (str(src), int(sport)), (str(dst), int(dport)))


def entry_from_message(message: Any, where: str) -> ConntrackEntry | None:
    """One ctnetlink message (pyroute2 nfct_msg) -> an entry; None for anything without both tuples."""
    orig_raw = message.get_attr("CTA_TUPLE_ORIG")
    proto_attrs = orig_raw.get_attr("CTA_TUPLE_PROTO") if orig_raw is not None else None
    proto_num = int(proto_attrs.get_attr("CTA_PROTO_NUM") or 0) if proto_attrs is not None else 0
    original = _tuple(proto_num, orig_raw)
    reply = _tuple(proto_num, message.get_attr("CTA_TUPLE_REPLY"))
    if original is None or reply is None:
        return None
    state: str | None = None
    protoinfo = message.get_attr("CTA_PROTOINFO")
    tcp = protoinfo.get_attr("CTA_PROTOINFO_TCP") if protoinfo is not None else None
    if tcp is not None:
        number = tcp.get_attr("CTA_PROTOINFO_TCP_STATE")
        if number is not None:
            state = _TCP_STATES[number] if number < len(_TCP_STATES) else str(number)
    return ConntrackEntry(
        where=where,
        original=original,
        reply=reply,
        family=6 if message.get("nfgen_family") == socket.AF_INET6 else 4,
        state=state,
        status=status_names(int(message.get_attr("CTA_STATUS") or 0)),
        mark=int(message.get_attr("CTA_MARK") or 0),
    )


class ConntrackReader:
    """Entries of every network namespace on the host (or of the ones given), one socket per namespace.

    `problems` collects one sentence per namespace that could not be read (no conntrack there is not a
    problem: its table is simply empty). `truncated` counts entries left out past `limit` per namespace.
    """

    def __init__(
        self,
        proto: int | None = socket.IPPROTO_TCP,
        names: NetnsNames | None = None,
        namespaces: Iterable[str] | None = None,
        limit: int = _DEFAULT_LIMIT,
    ) -> None:
        self.proto = proto
        self.names = names or NetnsNames()
        self._only = tuple(namespaces) if namespaces is not None else None
        self.limit = limit
        self._sockets: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.problems: dict[int, str] = {}
        self.truncated = 0
        self.reads = 0

    def _namespaces(self) -> list[tuple[int, str | None, str]]:
        """(inode, path to enter or None for our own, label) for every namespace to read."""
        own = current_netns_inode()
        found: dict[int, tuple[str | None, str]] = {}
        if self._only is not None:
            for given in self._only:
                full = given if "/" in given else f"/run/netns/{given}"
                inode = os.stat(full).st_ino
                found[inode] = (None if inode == own else full, f"netns {self.names.name_of(inode) or given}")
        else:
            for inode in sorted(set(self.names.inodes()) | {own}):
                path = None if inode == own else self.names.path_of(inode)
                if inode != own and path is None:
                    continue
                name = self.names.name_of(inode)
                found[inode] = (path, f"netns {name or ('host' if inode == own else inode)}")
        return [(inode, path, label) for inode, (path, label) in sorted(found.items())]

    def _socket(self, inode: int, path: str | None) -> Any:
        sock = self._sockets.get(inode)
        if sock is None:
            from pyroute2 import NFCTSocket

            # nfgen_family AF_UNSPEC dumps IPv4 and IPv6 alike; flags=0: never create a namespace.
            kwargs: dict[str, Any] = {"netns": path, "flags": 0} if path else {}
            sock = NFCTSocket(nfgen_family=socket.AF_UNSPEC, **kwargs)
            self._sockets[inode] = sock
        return sock

    def _dump(self, sock: Any) -> Iterable[Any]:
        # No CTA_FILTER: the kernel refuses a tuple filter on an AF_UNSPEC dump (EOPNOTSUPP), and one dump
        # for both families costs less than two filtered ones on the small tables this is read from.
        messages: Iterable[Any] = sock.dump()
        return messages

    def read(self, inode: int, path: str | None, where: str) -> list[ConntrackEntry]:
        entries: list[ConntrackEntry] = []
        for message in self._dump(self._socket(inode, path)):
            entry = entry_from_message(message, where)
            if entry is None:
                continue
            if self.proto is not None and entry.original.proto != _PROTO_NAMES.get(self.proto):
                continue
            if len(entries) >= self.limit:
                self.truncated += 1
                continue
            entries.append(entry)
        return entries

    def entries(self) -> list[ConntrackEntry]:
        with self._lock:
            self.reads += 1
            found: list[ConntrackEntry] = []
            namespaces = self._namespaces()
            for inode, path, where in namespaces:
                try:
                    found.extend(self.read(inode, path, where))
                    self.problems.pop(inode, None)
                except Exception as error:  # gone namespace, no ctnetlink: that namespace reads as empty
                    self.problems[inode] = f"conntrack of {where} unreadable: {error}"
                    self._drop_socket(inode)
            # Sockets of namespaces that went away are closed, not kept open forever.
            for inode in set(self._sockets) - {inode for inode, _, _ in namespaces}:
                self._drop_socket(inode)
            return found

    def _drop_socket(self, inode: int) -> None:
        sock = self._sockets.pop(inode, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        with self._lock:
            for sock in self._sockets.values():
                sock.close()
            self._sockets.clear()

    def __enter__(self) -> ConntrackReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
