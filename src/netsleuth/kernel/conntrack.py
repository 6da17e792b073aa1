"""Conntrack entries read over netlink (NETLINK_NETFILTER, the ctnetlink subsystem `conntrack -L` uses), in
every network namespace on the host, as `nat_join.ConntrackEntry` tagged with where they were read.

Read-only: a dump (IPCTNL_MSG_CT_GET with NLM_F_DUMP) or a lookup (IPCTNL_MSG_CT_GET with one tuple) changes
nothing. Each namespace gets its own netlink socket, created inside it once (pyroute2's create_socket forks a
child that enters the namespace and hands the socket back, so this process never changes namespace) and kept
for every later read. Requests and replies go over that socket directly; pyroute2's nfct_msg encodes and
decodes the messages (its asyncio socket layer costs ~50 ms per request, too much per namespace per poll).

Two ways to read:
- `lookup(flows)`: the entries holding these tuples, in either direction (ctnetlink_get_conntrack ->
  nf_conntrack_find_get hashes both directions), one request per tuple and namespace: constant cost however
  large the tables are. `conn` uses it for the few flows it waits on.
- `entries()`: every entry of every namespace (a dump), what the fleet's agents ship at the end of a session.

What either can see: only *confirmed* entries are in the table. An entry is confirmed when its first packet
leaves the namespace's last hook (nf_conntrack_confirm at POSTROUTING/INPUT), so a NAT hop that forwards a SYN
has a confirmed entry (kept nf_conntrack_tcp_timeout_syn_sent, 120 s, while the client retries), but a SYN
dropped in the same namespace that translated it is never confirmed, and never listed (the unconfirmed list
that IPCTNL_MSG_CT_GET_UNCONFIRMED used to dump is gone since Linux 6.1).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple, status_names
from netsleuth.kernel.netns import NetnsNames, current_netns_inode

__all__ = [
    "ConntrackReader",
    "ConntrackSource",
    "entry_from_message",
]

_NETLINK_NETFILTER = 12
# include/uapi/linux/netfilter/nfnetlink.h, nfnetlink_conntrack.h, linux/netlink.h
_NFNL_SUBSYS_CTNETLINK = 1
_IPCTNL_MSG_CT_NEW, _IPCTNL_MSG_CT_GET = 0, 1
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_PROTO_NUMBERS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP, "sctp": 132}
_PROTO_NAMES = {number: name for name, number in _PROTO_NUMBERS.items()} | {1: "icmp", 58: "icmpv6"}
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
_DEFAULT_LIMIT = 65536  # entries kept per namespace and dump: a table larger than this is cut, and counted


class ConntrackSource(Protocol):
    """What `conn`'s tracker asks: the entries holding these tuples, in every namespace it can see."""

    def lookup(self, flows: Iterable[FlowTuple]) -> list[ConntrackEntry]: ...


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


def _request(flow: FlowTuple | None, sequence: int) -> bytes:
    """IPCTNL_MSG_CT_GET: a dump of the whole table (flow None, any family), or the entry holding `flow`."""
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple, nfct_msg

    if flow is None:
        message = nfct_msg()
        family, flags = socket.AF_UNSPEC, _NLM_F_REQUEST | _NLM_F_DUMP
    else:
        family = socket.AF_INET6 if ":" in flow.src[0] else socket.AF_INET
        looked_up = NFCTAttrTuple(
            family=family,
            saddr=flow.src[0],
            daddr=flow.dst[0],
            proto=_PROTO_NUMBERS[flow.proto],
            sport=flow.src[1],
            dport=flow.dst[1],
        )
        message = nfct_msg.create_from(tuple_orig=looked_up)
        flags = _NLM_F_REQUEST
    message["nfgen_family"] = family
    message["header"]["type"] = (_NFNL_SUBSYS_CTNETLINK << 8) | _IPCTNL_MSG_CT_GET
    message["header"]["flags"] = flags
    message["header"]["sequence_number"] = sequence
    message.encode()
    return bytes(message.data)


def _replies(sock: socket.socket, sequence: int, dump: bool) -> Iterator[Any]:
    """The ctnetlink messages answering request `sequence`; ENOENT (no such entry) ends it quietly."""
    from pyroute2.netlink.nfnetlink.nfctsocket import nfct_msg

    while True:
        data = sock.recv(1 << 20)
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, _, seq, _ = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size:
                return
            chunk = data[offset : offset + length]
            offset += (length + 3) & ~3
            if seq != sequence:
                continue  # a late answer to an earlier request that timed out
            if kind == _NLMSG_DONE:
                return
            if kind == _NLMSG_ERROR:
                code = -struct.unpack_from("=i", chunk, _HEADER.size)[0]
                if code in (0, errno.ENOENT):
                    return
                raise OSError(code, os.strerror(code))
            if kind & 0xFF == _IPCTNL_MSG_CT_NEW:
                message = nfct_msg(chunk)
                message.decode()
                yield message
                if not dump:
                    return


class ConntrackReader:
    """Conntrack of every network namespace on the host (or of the ones given), one socket per namespace.

    `problems` keeps one sentence per namespace that could not be read (a namespace without conntrack is not
    a problem: its table is empty). `truncated` counts entries a dump left out past `limit`.
    """

    def __init__(
        self,
        proto: str | None = "tcp",
        names: NetnsNames | None = None,
        namespaces: Iterable[str] | None = None,
        limit: int = _DEFAULT_LIMIT,
        timeout: float = 1.0,
    ) -> None:
        self.proto = proto
        # New namespaces are rare; a rescan of every /proc/PID/ns/net costs ~0.1 s on a busy host.
        self.names = names or NetnsNames(refresh_interval=5.0)
        self._only = tuple(namespaces) if namespaces is not None else None
        self.limit = limit
        self.timeout = timeout
        self._sockets: dict[int, socket.socket] = {}
        self._sequence = 0
        self._lock = threading.Lock()
        self.problems: dict[int, str] = {}
        self.truncated = 0
        self.requests = 0

    # -- namespaces ------------------------------------------------------------------------------------
    def _namespaces(self) -> list[tuple[int, str | None, str]]:
        """(inode, file to enter or None for our own, label) for every namespace to read."""
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

    def _socket(self, inode: int, path: str | None) -> socket.socket:
        sock = self._sockets.get(inode)
        if sock is None:
            if path is None:
                sock = socket.socket(
                    socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_NETFILTER
                )
            else:
                from pyroute2.netns import create_socket

                # flags=0: never create the namespace file if it is gone.
                sock = create_socket(
                    netns=path,
                    family=socket.AF_NETLINK,
                    socket_type=socket.SOCK_RAW,
                    proto=_NETLINK_NETFILTER,
                    flags=0,
                )
            sock.settimeout(self.timeout)
            sock.bind((0, 0))
            self._sockets[inode] = sock
        return sock

    def _ask(self, inode: int, path: str | None, where: str, flow: FlowTuple | None) -> list[ConntrackEntry]:
        sock = self._socket(inode, path)
        self._sequence += 1
        self.requests += 1
        sock.send(_request(flow, self._sequence))
        entries: list[ConntrackEntry] = []
        for message in _replies(sock, self._sequence, dump=flow is None):
            entry = entry_from_message(message, where)
            if entry is None or (self.proto is not None and entry.original.proto != self.proto):
                continue
            if len(entries) >= self.limit:
                self.truncated += 1
                continue
            entries.append(entry)
        return entries

    def _each_namespace(self, flows: list[FlowTuple | None]) -> list[ConntrackEntry]:
        found: list[ConntrackEntry] = []
        namespaces = self._namespaces()
        for inode, path, where in namespaces:
            try:
                for flow in flows:
                    found.extend(self._ask(inode, path, where, flow))
                self.problems.pop(inode, None)
            except (OSError, TimeoutError) as error:  # gone namespace, no ctnetlink: read as empty
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

    # -- the two reads ---------------------------------------------------------------------------------
    def lookup(self, flows: Iterable[FlowTuple]) -> list[ConntrackEntry]:
        """Entries holding any of `flows` (as original or reply tuple), in every namespace; each one once."""
        wanted: list[FlowTuple | None] = list(dict.fromkeys(flows))
        with self._lock:
            return list(dict.fromkeys(self._each_namespace(wanted)))

    def entries(self) -> list[ConntrackEntry]:
        """Every entry of every namespace (of `proto`, when set)."""
        with self._lock:
            return self._each_namespace([None])

    def close(self) -> None:
        with self._lock:
            for inode in list(self._sockets):
                self._drop_socket(inode)

    def __enter__(self) -> ConntrackReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
