"""Conntrack entries read over netlink (NETLINK_NETFILTER, the ctnetlink subsystem `conntrack -L` uses), in
every network namespace on the host, as `nat_join.ConntrackEntry` tagged with where they were read.

Read-only: a dump (IPCTNL_MSG_CT_GET with NLM_F_DUMP) or a lookup (IPCTNL_MSG_CT_GET with one tuple) changes
nothing. Each namespace gets its own netlink socket, created inside it once (pyroute2's create_socket forks a
child that enters the namespace and hands the socket back, so this process never changes namespace) and kept
for every later read. Requests and replies are encoded and parsed here with struct, straight over that
socket: through pyroute2's asyncio socket layer a request cost ~10 ms here, a direct one ~0.1 ms.

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
from typing import Protocol

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
_NLA_F_NESTED = 0x8000
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_NLA_HEADER = struct.Struct("=HH")  # struct nlattr
# include/uapi/linux/netfilter/nfnetlink_conntrack.h: enum ctattr_type, ctattr_tuple, ctattr_ip,
# ctattr_l4proto, ctattr_protoinfo, ctattr_protoinfo_tcp.
_CTA_TUPLE_ORIG, _CTA_TUPLE_REPLY, _CTA_STATUS, _CTA_PROTOINFO, _CTA_MARK = 1, 2, 3, 4, 8
_CTA_TUPLE_IP, _CTA_TUPLE_PROTO = 1, 2
_CTA_IP_V4_SRC, _CTA_IP_V4_DST, _CTA_IP_V6_SRC, _CTA_IP_V6_DST = 1, 2, 3, 4
_CTA_PROTO_NUM, _CTA_PROTO_SRC_PORT, _CTA_PROTO_DST_PORT, _CTA_PROTO_ICMP_ID = 1, 2, 3, 4
_CTA_PROTOINFO_TCP, _CTA_PROTOINFO_TCP_STATE = 1, 1
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


def _attrs(data: bytes, offset: int, end: int) -> dict[int, tuple[int, int]]:
    """Netlink attributes in data[offset:end]: type (NLA_F_NESTED and byte-order bits cleared) -> (start,
    end) of its payload. Parsed here with struct: ~40 us an entry against ~110 us for pyroute2's generic
    nfct_msg decoder (measured on the recorded fixture)."""
    found: dict[int, tuple[int, int]] = {}
    while offset + 4 <= end:
        length, kind = _NLA_HEADER.unpack_from(data, offset)
        if length < 4 or offset + length > end:
            break
        found[kind & _NLA_TYPE_MASK] = (offset + 4, offset + length)
        offset += (length + 3) & ~3
    return found


def _tuple(data: bytes, span: tuple[int, int] | None) -> tuple[FlowTuple, int] | None:
    """A CTA_TUPLE_* payload -> (flow, protocol number)."""
    if span is None:
        return None
    parts = _attrs(data, *span)
    ip, proto = parts.get(_CTA_TUPLE_IP), parts.get(_CTA_TUPLE_PROTO)
    if ip is None or proto is None:
        return None
    addresses, ports = _attrs(data, *ip), _attrs(data, *proto)
    if _CTA_IP_V4_SRC in addresses and _CTA_IP_V4_DST in addresses:
        family, src_span, dst_span = socket.AF_INET, addresses[_CTA_IP_V4_SRC], addresses[_CTA_IP_V4_DST]
    elif _CTA_IP_V6_SRC in addresses and _CTA_IP_V6_DST in addresses:
        family, src_span, dst_span = socket.AF_INET6, addresses[_CTA_IP_V6_SRC], addresses[_CTA_IP_V6_DST]
    else:
        return None
    src = socket.inet_ntop(family, data[src_span[0] : src_span[1]])
    dst = socket.inet_ntop(family, data[dst_span[0] : dst_span[1]])
    number_span = ports.get(_CTA_PROTO_NUM)
    number = data[number_span[0]] if number_span else 0

    def port(kind: int) -> int:
        span = ports.get(kind)
        return int(struct.unpack_from("!H", data, span[0])[0]) if span else 0

    sport = port(_CTA_PROTO_SRC_PORT) or port(_CTA_PROTO_ICMP_ID)
    name = _PROTO_NAMES.get(number, str(number))
    return FlowTuple(name, (src, sport), (dst, port(_CTA_PROTO_DST_PORT))), number


def _be32(data: bytes, span: tuple[int, int] | None) -> int:
    return int(struct.unpack_from("!I", data, span[0])[0]) if span else 0


def entry_from_message(data: bytes, where: str) -> ConntrackEntry | None:
    """One ctnetlink message (struct nlmsghdr + nfgenmsg + attributes, as read from the socket) -> an entry;
    None for anything without both tuples."""
    if len(data) < _HEADER.size + 4:
        return None
    length = min(_HEADER.unpack_from(data, 0)[0], len(data))
    family = data[_HEADER.size]
    attrs = _attrs(data, _HEADER.size + 4, length)
    original = _tuple(data, attrs.get(_CTA_TUPLE_ORIG))
    reply = _tuple(data, attrs.get(_CTA_TUPLE_REPLY))
    if original is None or reply is None:
        return None
    state: str | None = None
    protoinfo = attrs.get(_CTA_PROTOINFO)
    tcp = _attrs(data, *protoinfo).get(_CTA_PROTOINFO_TCP) if protoinfo else None
    state_span = _attrs(data, *tcp).get(_CTA_PROTOINFO_TCP_STATE) if tcp else None
    if state_span is not None:
        number = data[state_span[0]]
        state = _TCP_STATES[number] if number < len(_TCP_STATES) else str(number)
    return ConntrackEntry(
        where=where,
        original=original[0],
        reply=reply[0],
        family=6 if family == socket.AF_INET6 else 4,
        state=state,
        status=status_names(_be32(data, attrs.get(_CTA_STATUS))),
        mark=_be32(data, attrs.get(_CTA_MARK)),
    )


def _attr(kind: int, payload: bytes, nested: bool = False) -> bytes:
    """One netlink attribute (struct nlattr), padded to 4 bytes."""
    header = struct.pack("=HH", 4 + len(payload), kind | (_NLA_F_NESTED if nested else 0))
    return header + payload + b"\0" * (-len(payload) % 4)


def _tuple_attrs(flow: FlowTuple) -> bytes:
    """CTA_TUPLE_ORIG for `flow` (include/uapi/linux/netfilter/nfnetlink_conntrack.h enum ctattr_tuple,
    ctattr_ip, ctattr_l4proto), encoded by hand with struct, like the replies are parsed."""
    v6 = ":" in flow.src[0]
    family = socket.AF_INET6 if v6 else socket.AF_INET
    src, dst = socket.inet_pton(family, flow.src[0]), socket.inet_pton(family, flow.dst[0])
    addresses = _attr(3 if v6 else 1, src) + _attr(4 if v6 else 2, dst)  # CTA_IP_V{4,6}_{SRC,DST}
    ports = (
        _attr(1, bytes([_PROTO_NUMBERS[flow.proto]]))  # CTA_PROTO_NUM
        + _attr(2, struct.pack("!H", flow.src[1]))  # CTA_PROTO_SRC_PORT
        + _attr(3, struct.pack("!H", flow.dst[1]))  # CTA_PROTO_DST_PORT
    )
    inner = _attr(1, addresses, nested=True) + _attr(2, ports, nested=True)  # CTA_TUPLE_IP, _PROTO
    return _attr(1, inner, nested=True)  # CTA_TUPLE_ORIG


def _request(flow: FlowTuple | None, sequence: int) -> bytes:
    """IPCTNL_MSG_CT_GET: a dump of the whole table (flow None, any family), or the entry holding `flow`."""
    if flow is None:
        family, flags, attrs = socket.AF_UNSPEC, _NLM_F_REQUEST | _NLM_F_DUMP, b""
    else:
        family = socket.AF_INET6 if ":" in flow.src[0] else socket.AF_INET
        flags, attrs = _NLM_F_REQUEST, _tuple_attrs(flow)
    body = struct.pack("=BBH", family, 0, 0) + attrs  # struct nfgenmsg: family, version, res_id
    kind = (_NFNL_SUBSYS_CTNETLINK << 8) | _IPCTNL_MSG_CT_GET
    return _HEADER.pack(_HEADER.size + len(body), kind, flags, sequence, 0) + body


def _replies(sock: socket.socket, sequence: int, dump: bool) -> Iterator[bytes]:
    """The ctnetlink messages answering request `sequence`; ENOENT (no such entry) ends it quietly."""
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
                yield chunk
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
        warm: bool = True,
    ) -> None:
        """`warm`: open every namespace's socket now, in a background thread, so the first lookup (when a
        connection is failing and the answer matters) does not pay ~0.1 s per namespace for it."""
        self.proto = proto
        # New namespaces are rare; a rescan of every /proc/PID/ns/net costs ~0.1 s on a busy host.
        self.names = names or NetnsNames(refresh_interval=5.0)
        self._only = tuple(namespaces) if namespaces is not None else None
        self.limit = limit
        self.timeout = timeout
        self._sockets: dict[int, socket.socket] = {}
        self._sequence = 0
        self._lock = threading.Lock()
        self._closed = False
        self.problems: dict[int, str] = {}
        self.truncated = 0
        self.requests = 0
        self._warmer: threading.Thread | None = None
        if warm:
            self._warmer = threading.Thread(target=self._warm_up, name="conntrack-sockets", daemon=True)
            self._warmer.start()

    def _warm_up(self) -> None:
        for inode, path, where in self._namespaces():
            with self._lock:
                if self._closed:
                    return
                try:
                    self._socket(inode, path)
                except (OSError, TimeoutError) as error:
                    self.problems[inode] = f"conntrack of {where} unreadable: {error}"

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
            self._closed = True
            for inode in list(self._sockets):
                self._drop_socket(inode)

    def __enter__(self) -> ConntrackReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
