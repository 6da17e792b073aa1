"""Conntrack entries read over netlink (NETLINK_NETFILTER, the ctnetlink subsystem `conntrack -L` uses), in
every network namespace on the host, as `nat_join.ConntrackEntry` tagged with where they were read.

Read-only: a dump (IPCTNL_MSG_CT_GET with NLM_F_DUMP) or a lookup (IPCTNL_MSG_CT_GET with one tuple) changes
nothing. Each namespace gets its own netlink socket, created inside it once (one forked child enters every
namespace in turn and hands the sockets back, kernel/netns_exec.py sockets_in_netns: ~25 ms for 22
namespaces here, where a fork per namespace took ~0.1 s each; this process never changes namespace) and kept
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
An entry that is confirmed but dies before anyone asks (a RST kills a SYN_SENT entry at once) is caught on
its way out: the reader subscribes to conntrack's destroy events and remembers them for a while.
"""

from __future__ import annotations

import collections
import errno
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple, status_names
from netsleuth.kernel.netns import NetnsNames, current_netns_inode
from netsleuth.kernel.netns_exec import sockets_in_netns

__all__ = [
    "ConntrackReader",
    "ConntrackSource",
    "Namespace",
    "created_ns",
    "entry_from_message",
    "list_namespaces",
    "messages",
    "netlink_sockets",
    "subscribe",
]

_NETLINK_NETFILTER = 12
# include/uapi/linux/netfilter/nfnetlink.h, nfnetlink_conntrack.h, linux/netlink.h
_NFNL_SUBSYS_CTNETLINK = 1
_IPCTNL_MSG_CT_NEW, _IPCTNL_MSG_CT_GET, _IPCTNL_MSG_CT_GET_STATS_CPU = 0, 1, 4
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLA_F_NESTED = 0x8000
_NFNLGRP_CONNTRACK_DESTROY = 3  # include/uapi/linux/netfilter/nfnetlink.h enum nfnetlink_groups
_CTA_STATS_INVALID = 4  # include/uapi/linux/netfilter/nfnetlink_conntrack.h enum ctattr_stats_cpu
_SOL_NETLINK, _NETLINK_ADD_MEMBERSHIP = 270, 1
_SO_RCVBUFFORCE = 33
_EVENT_RCVBUF = 4 << 20
_DESTROYED_KEEP_S = 60.0  # as long as `conn` lets a drop wait for its connection, and then some
_DESTROYED_MAX = 65536  # messages kept; a host destroying more per minute keeps the newest
_DRAIN_MAX = 10000  # datagrams taken per namespace and poll, so one busy namespace cannot stall conn
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_NLA_HEADER = struct.Struct("=HH")  # struct nlattr
# include/uapi/linux/netfilter/nfnetlink_conntrack.h: enum ctattr_type, ctattr_tuple, ctattr_ip,
# ctattr_l4proto, ctattr_protoinfo, ctattr_protoinfo_tcp.
_CTA_TUPLE_ORIG, _CTA_TUPLE_REPLY, _CTA_STATUS, _CTA_PROTOINFO, _CTA_MARK = 1, 2, 3, 4, 8
_CTA_TIMESTAMP, _CTA_TIMESTAMP_START = 20, 1  # enum ctattr_type, enum ctattr_tstamp
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
    """What `conn`'s tracker asks: the entries holding these tuples, in every namespace it can see; `poll` is
    called on every step so entries that die in between are not missed."""

    def lookup(self, flows: Iterable[FlowTuple]) -> list[ConntrackEntry]: ...

    def poll(self) -> None: ...


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


def created_ns(data: bytes) -> int | None:
    """When the kernel created the entry of a ctnetlink message (CTA_TIMESTAMP_START, wall clock in ns), or
    None: the kernel stamps entries only where net.netfilter.nf_conntrack_timestamp is on (off by default;
    netsleuth reads it, never turns it on)."""
    if len(data) < _HEADER.size + 4:
        return None
    length = min(_HEADER.unpack_from(data, 0)[0], len(data))
    stamp = _attrs(data, _HEADER.size + 4, length).get(_CTA_TIMESTAMP)
    start = _attrs(data, *stamp).get(_CTA_TIMESTAMP_START) if stamp else None
    if start is None or start[1] - start[0] < 8:
        return None
    value = int(struct.unpack_from("!Q", data, start[0])[0])
    return value or None


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


def _replies(
    sock: socket.socket, sequence: int, dump: bool, kind: int = _IPCTNL_MSG_CT_NEW
) -> Iterator[bytes]:
    """The ctnetlink messages of `kind` answering request `sequence`; ENOENT (no such entry) ends it
    quietly."""
    while True:
        data = sock.recv(1 << 20)
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, message_kind, _, seq, _ = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size:
                return
            chunk = data[offset : offset + length]
            offset += (length + 3) & ~3
            if seq != sequence:
                continue  # a late answer to an earlier request that timed out
            if message_kind == _NLMSG_DONE:
                return
            if message_kind == _NLMSG_ERROR:
                code = -struct.unpack_from("=i", chunk, _HEADER.size)[0]
                if code in (0, errno.ENOENT):
                    return
                raise OSError(code, os.strerror(code))
            if message_kind & 0xFF == kind:
                yield chunk
                if not dump:
                    return


def _packed_pair(flow: FlowTuple) -> tuple[bytes, bytes]:
    family = socket.AF_INET6 if ":" in flow.src[0] else socket.AF_INET
    return socket.inet_pton(family, flow.src[0]), socket.inet_pton(family, flow.dst[0])


def messages(data: bytes) -> Iterator[bytes]:
    """The netlink messages in one datagram."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length = _HEADER.unpack_from(data, offset)[0]
        if length < _HEADER.size:
            return
        yield data[offset : offset + length]
        offset += (length + 3) & ~3


Namespace = tuple[int, str | None, str]  # (inode, file to enter or None for our own, label)


def netlink_sockets(namespaces: list[Namespace], per_netns: int) -> dict[int, list[socket.socket] | OSError]:
    """`per_netns` NETLINK_NETFILTER sockets made inside each namespace (ours directly, the others by one
    forked child, kernel/netns_exec.py), by inode; a namespace that cannot be entered maps to its error."""
    elsewhere = [path for _, path, _ in namespaces if path is not None]
    made = sockets_in_netns(elsewhere, socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER, per_netns)
    found: dict[int, list[socket.socket] | OSError] = {}
    for inode, path, _ in namespaces:
        if path is None:
            found[inode] = [
                socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_NETFILTER)
                for _ in range(per_netns)
            ]
        else:
            found[inode] = made.get(path, OSError(errno.EIO, "no answer from the namespace helper"))
    return found


def list_namespaces(names: NetnsNames, only: Iterable[str] | None = None) -> list[Namespace]:
    """(inode, file to enter or None for our own, label `netns NAME`) of the namespaces given (`ip netns`
    names or namespace files), or of every namespace on the host."""
    own = current_netns_inode()
    found: dict[int, tuple[str | None, str]] = {}
    if only is not None:
        for given in only:
            full = given if "/" in given else f"/run/netns/{given}"
            inode = os.stat(full).st_ino
            found[inode] = (None if inode == own else full, f"netns {names.name_of(inode) or given}")
    else:
        for inode in sorted(set(names.inodes()) | {own}):
            path = None if inode == own else names.path_of(inode)
            if inode != own and path is None:
                continue
            name = names.name_of(inode)
            found[inode] = (path, f"netns {name or ('host' if inode == own else inode)}")
    return [(inode, path, label) for inode, (path, label) in sorted(found.items())]


def subscribe(sock: socket.socket, groups: Iterable[int]) -> None:
    """Bind `sock` and join conntrack's event groups (enum nfnetlink_groups); non-blocking, with room for a
    burst of events between two reads (root may exceed rmem_max)."""
    sock.bind((0, 0))
    for group in groups:
        sock.setsockopt(_SOL_NETLINK, _NETLINK_ADD_MEMBERSHIP, group)
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, _EVENT_RCVBUF)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _EVENT_RCVBUF)
    sock.setblocking(False)


def _stats_request(sequence: int) -> bytes:
    """IPCTNL_MSG_CT_GET_STATS_CPU: one message per CPU with its counters (ctnetlink_ct_stat_cpu_dump)."""
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, 0)
    kind = (_NFNL_SUBSYS_CTNETLINK << 8) | _IPCTNL_MSG_CT_GET_STATS_CPU
    return _HEADER.pack(_HEADER.size + len(body), kind, _NLM_F_REQUEST | _NLM_F_DUMP, sequence, 0) + body


class ConntrackReader:
    """Conntrack of every network namespace on the host (or of the ones given), one socket per namespace.

    With `watch_destroyed` each namespace also gets a socket subscribed to the entries conntrack destroys
    (NFNLGRP_CONNTRACK_DESTROY): an entry killed before anyone asked for it (a RST kills a SYN_SENT entry at
    once, so a connect refused behind a NAT leaves nothing in the table) is still found by `lookup` for
    `keep_destroyed` seconds. `poll()` drains those sockets; call it often (it costs one recv per namespace
    when nothing happened). The kernel only reports entries created after a listener exists
    (nf_conntrack_events=2, the default) and drops events a full socket cannot take: counted in
    `destroyed_lost`.

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
        watch_destroyed: bool = True,
        keep_destroyed: float = _DESTROYED_KEEP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proto = proto
        # New namespaces are rare; a rescan of every /proc/PID/ns/net costs ~0.1 s on a busy host.
        self.names = names or NetnsNames(refresh_interval=5.0)
        self._only = tuple(namespaces) if namespaces is not None else None
        self.limit = limit
        self.timeout = timeout
        self.watch_destroyed = watch_destroyed
        self.keep_destroyed = keep_destroyed
        self._clock = clock
        self._sockets: dict[int, socket.socket] = {}
        self._events: dict[int, tuple[socket.socket, str]] = {}
        self._destroyed: collections.deque[tuple[float, str, bytes]] = collections.deque(
            maxlen=_DESTROYED_MAX
        )
        self._sequence = 0
        self._lock = threading.Lock()
        self.problems: dict[int, str] = {}
        self.truncated = 0
        self.requests = 0
        # When the kernel created each entry of the last dump, where it stamps them
        # (nf_conntrack_timestamp=1): (where, original, reply) -> wall-clock ns.
        self.created: dict[tuple[str, FlowTuple, FlowTuple], int] = {}
        self.destroyed_lost = 0
        if watch_destroyed:
            # Now, not at the first lookup: the entries worth remembering die while the connection fails.
            with self._lock:
                self._open(self._namespaces())

    # -- namespaces and sockets ------------------------------------------------------------------------
    def _namespaces(self) -> list[Namespace]:
        return list_namespaces(self.names, self._only)

    def _open(self, namespaces: list[Namespace]) -> None:
        """Sockets for the namespaces that have none yet: made inside each by one forked child."""
        per_netns = 2 if self.watch_destroyed else 1
        missing = [(inode, path, where) for inode, path, where in namespaces if inode not in self._sockets]
        made = netlink_sockets(missing, per_netns)
        for inode, _, where in missing:
            socks = made[inode]
            if isinstance(socks, OSError):
                self.problems[inode] = f"conntrack of {where} unreadable: {socks}"
                continue
            try:
                socks[0].settimeout(self.timeout)
                socks[0].bind((0, 0))
                if self.watch_destroyed:
                    subscribe(socks[1], (_NFNLGRP_CONNTRACK_DESTROY,))
                    self._events[inode] = (socks[1], where)
            except OSError as error:
                self.problems[inode] = f"conntrack of {where} unreadable: {error}"
                for sock in socks:
                    sock.close()
                continue
            self._sockets[inode] = socks[0]

    def _ask(self, inode: int, where: str, flow: FlowTuple | None) -> list[ConntrackEntry]:
        sock = self._sockets[inode]
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
            if flow is None and (created := created_ns(message)) is not None:
                self.created[(entry.where, entry.original, entry.reply)] = created
        return entries

    def _readable(self) -> tuple[list[Namespace], list[tuple[int, str]]]:
        """Every namespace to read, and (inode, label) of those with a socket (made now if need be)."""
        namespaces = self._namespaces()
        self._open(namespaces)
        return namespaces, [(inode, where) for inode, _, where in namespaces if inode in self._sockets]

    def _each_namespace(self, flows: list[FlowTuple | None]) -> list[ConntrackEntry]:
        found: list[ConntrackEntry] = []
        namespaces, readable = self._readable()
        for inode, where in readable:
            try:
                for flow in flows:
                    found.extend(self._ask(inode, where, flow))
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
        events = self._events.pop(inode, None)
        if events is not None:
            events[0].close()

    # -- destroyed entries -----------------------------------------------------------------------------
    def _drain(self) -> None:
        now = self._clock()
        for events, where in self._events.values():
            for _ in range(_DRAIN_MAX):
                try:
                    data = events.recv(1 << 16)
                except BlockingIOError:
                    break
                except OSError as error:
                    if error.errno == errno.ENOBUFS:  # the kernel dropped events: say how often
                        self.destroyed_lost += 1
                        continue
                    break
                self._destroyed.append((now, where, data))
        while self._destroyed and now - self._destroyed[0][0] > self.keep_destroyed:
            self._destroyed.popleft()

    def poll(self) -> None:
        """Take in what conntrack destroyed since the last call."""
        with self._lock:
            self._drain()

    def _destroyed_holding(self, flows: list[FlowTuple]) -> list[ConntrackEntry]:
        wanted = set(flows)
        needles = [_packed_pair(flow) for flow in flows]
        found: list[ConntrackEntry] = []
        for _, where, data in self._destroyed:
            # Most messages are other flows: a byte search finds the candidates before any parsing.
            if not any(src in data and dst in data for src, dst in needles):
                continue
            for message in messages(data):
                entry = entry_from_message(message, where)
                if entry is not None and ({entry.original, entry.reply} & wanted):
                    found.append(entry)
        return found

    # -- the two reads ---------------------------------------------------------------------------------
    def lookup(self, flows: Iterable[FlowTuple]) -> list[ConntrackEntry]:
        """Entries holding any of `flows` (as original or reply tuple), in every namespace, live or destroyed
        within `keep_destroyed` seconds; each one once."""
        wanted = list(dict.fromkeys(flows))
        with self._lock:
            self._drain()
            live = self._each_namespace(list(wanted))
            return list(dict.fromkeys(live + self._destroyed_holding(wanted)))

    def entries(self) -> list[ConntrackEntry]:
        """Every entry of every namespace (of `proto`, when set); `created` holds their kernel times."""
        with self._lock:
            self.created = {}
            return self._each_namespace([None])

    def invalid_counts(self) -> dict[str, int]:
        """Each namespace's count of packets conntrack found INVALID (the `invalid` column of
        /proc/net/stat/nf_conntrack, summed over CPUs), by label; a namespace that cannot answer is left out
        and named in `problems`. Counted since the namespace's conntrack started, never reset: compare two
        readings."""
        counts: dict[str, int] = {}
        with self._lock:
            for inode, where in self._readable()[1]:
                try:
                    counts[where] = self._invalid(self._sockets[inode])
                except (OSError, TimeoutError) as error:
                    self.problems[inode] = f"conntrack counters of {where} unreadable: {error}"
        return counts

    def _invalid(self, sock: socket.socket) -> int:
        self._sequence += 1
        self.requests += 1
        sock.send(_stats_request(self._sequence))
        total = 0
        for message in _replies(sock, self._sequence, dump=True, kind=_IPCTNL_MSG_CT_GET_STATS_CPU):
            attrs = _attrs(message, _HEADER.size + 4, len(message))
            total += _be32(message, attrs.get(_CTA_STATS_INVALID))
        return total

    def close(self) -> None:
        with self._lock:
            for inode in list(self._sockets):
                self._drop_socket(inode)
            for events, _ in self._events.values():
                events.close()
            self._events.clear()

    def __enter__(self) -> ConntrackReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
