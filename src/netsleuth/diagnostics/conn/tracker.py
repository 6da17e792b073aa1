"""`conn`: one timeline per connection, joined from the tcp events (state changes, retransmits, resets,
errors) and the drops engine, ending in a one-line verdict.

The join key is the connection's pair of endpoints, the same whichever side (or namespace) reports it, so a
SYN dropped by a firewall in the server's namespace lands on the client's connection. A socket's events are
first joined by socket address: connect() changes the state before the kernel picks the local port
(net/ipv4/tcp_ipv4.c tcp_v4_connect: tcp_set_state(SYN_SENT), then inet_hash_connect()), so its first event
has no port yet. Drops and resets that arrive before their connection is known wait a few seconds for it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from netsleuth._generated.tcp_abi import EventKind, RetransKind
from netsleuth.diagnostics.attribution import Owner, owner_json, owner_text, tcp_owner_facts
from netsleuth.diagnostics.conn.records import ConnRecord, FlowPart, NatHopPart, TimelineEntry
from netsleuth.diagnostics.drops.records import DropRecord
from netsleuth.diagnostics.filters import IpNetwork
from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple, NatHop, NatIndex, NatPath, Placement
from netsleuth.diagnostics.tcp.program import RawTcpEvent
from netsleuth.diagnostics.tcp.records import AbortRecord, ResetRecord, endpoint_text
from netsleuth.diagnostics.tcp.reset_causes import duration_text
from netsleuth.diagnostics.tcp_names import errno_name, errno_number, errno_text
from netsleuth.kernel.conntrack import ConntrackSource
from netsleuth.kernel.context import KernelContext
from netsleuth.spec.records import WallTime

__all__ = [
    "ConnReport",
    "ConnSelector",
    "ConnTracker",
    "Connection",
    "verdict",
]

Endpoint = tuple[str, int]
FlowKey = frozenset[Endpoint]

_ECONNREFUSED, _ECONNRESET, _ETIMEDOUT = 111, 104, 110
# Frees that are part of a normal close (a closed socket's queues purged: net/core/stream.c
# sk_stream_kill_queues), not a cause of anything.
_BENIGN_DROPS = frozenset({"QUEUE_PURGE"})
_GRACE_S = 0.5  # after the last socket closed, for late drops and the peer's events
_PENDING_S = 10.0  # drops/resets waiting for their connection to be known
_NAT_READ_EVERY_S = 0.5  # conntrack is read at most this often, and only while something waits for it
_NAT_TRIES = 3  # reads that may place a waiting flow before it is left to expire
_NAT_MAX_HOPS = 4  # NATs in a row followed by lookups (each round asks every namespace)
# Flows asked per read: each costs one lookup per namespace, so a storm of failing connects cannot turn into
# a storm of netlink requests; the rest wait for the next read.
_NAT_FLOWS_PER_READ = 16  # ~0.13 ms per lookup and namespace measured on 6.18: 16 flows x 2 x 12 ns ~ 50 ms


@dataclass(frozen=True)
class ConnSelector:
    """Which connections to report: the server end (--dst ADDR[:PORT], --dport), the client end (--src,
    --sport), either end (--host, --port). Empty: every connection."""

    servers: tuple[IpNetwork, ...] = ()
    server_port: int | None = None
    clients: tuple[IpNetwork, ...] = ()
    client_port: int | None = None
    hosts: tuple[IpNetwork, ...] = ()
    port: int | None = None

    def matches(self, client: Endpoint, server: Endpoint) -> bool:
        def inside(address: str, networks: tuple[IpNetwork, ...]) -> bool:
            import ipaddress

            parsed = ipaddress.ip_address(address)
            return any(parsed.version == network.version and parsed in network for network in networks)

        if self.servers and not inside(server[0], self.servers):
            return False
        if self.server_port is not None and server[1] != self.server_port:
            return False
        if self.clients and not inside(client[0], self.clients):
            return False
        if self.client_port is not None and client[1] != self.client_port:
            return False
        if self.hosts and not (inside(client[0], self.hosts) or inside(server[0], self.hosts)):
            return False
        return self.port is None or self.port in (client[1], server[1])


@dataclass
class _Socket:
    netns: int
    sk: int
    side: str | None = None
    local: Endpoint | None = None
    remote: Endpoint | None = None
    state: str | None = None
    closed: bool = False


@dataclass
class Connection:
    client: Endpoint
    server: Endpoint
    family: int
    first_time: float
    sockets: dict[tuple[int, int], _Socket] = field(default_factory=dict)
    entries: list[TimelineEntry] = field(default_factory=list)
    established_time: float | None = None
    connect_latency: float | None = None
    syn_retransmits: int = 0
    synack_retransmits: int = 0
    retransmits: Counter[str] = field(default_factory=Counter)
    drops: list[DropRecord] = field(default_factory=list)
    resets: list[ResetRecord] = field(default_factory=list)
    aborts: list[AbortRecord] = field(default_factory=list)
    errno: int | None = None
    owner: Owner | None = None
    client_netns: int | None = None
    server_netns: int | None = None
    last_time: float = 0.0
    finished_at: float | None = None  # monotonic, when every socket we saw had closed
    bytes_sent: int | None = None  # client's bytes acked by the server
    bytes_received: int | None = None
    abandoned: bool = False  # the application closed while connecting
    nat: NatPath | None = None  # the NAT hops between client and server, from conntrack (nat_join)
    nat_checked: bool = False  # conntrack was asked for its path once it retried a SYN
    translated: dict[int, Placement] = field(default_factory=dict)  # id(drop/reset) -> where it was seen

    @property
    def key(self) -> FlowKey:
        return frozenset((self.client, self.server))

    @property
    def established(self) -> bool:
        return self.established_time is not None

    def add(self, entry: TimelineEntry) -> None:
        self.entries.append(entry)
        self.last_time = max(self.last_time, entry.time)
        if entry.event == "state":
            # connect()'s first state change has no local port yet and waits for the next event, which
            # creates the connection: that earlier change is where the connection began.
            self.first_time = min(self.first_time, entry.time)


@dataclass(frozen=True)
class ConnReport:
    connection: Connection
    outcome: str
    verdict: str

    def record(self, netns_name: Callable[[int], str | None]) -> ConnRecord:
        """The report as its record; `netns_name` names a namespace by its inode (None: it has no name)."""
        conn = self.connection

        def netns(inode: int | None) -> str | int | None:
            return (netns_name(inode) or inode) if inode else None

        owner: dict[str, Any] = dict(owner_json(conn.owner)) if conn.owner is not None else {}
        return ConnRecord(
            client=endpoint_text(*conn.client),
            server=endpoint_text(*conn.server),
            family=conn.family,
            saddr=conn.client[0],
            sport=conn.client[1],
            daddr=conn.server[0],
            dport=conn.server[1],
            client_netns=netns(conn.client_netns),
            server_netns=netns(conn.server_netns),
            established=conn.established,
            connect_latency_ms=conn.connect_latency * 1e3 if conn.connect_latency is not None else None,
            duration_s=conn.last_time - conn.first_time,
            syn_retransmits=conn.syn_retransmits,
            synack_retransmits=conn.synack_retransmits,
            retransmits=dict(conn.retransmits),
            drops=len(conn.drops),
            resets=len(conn.resets),
            errno=errno_name(conn.errno) if conn.errno else None,
            bytes_sent=conn.bytes_sent,
            bytes_received=conn.bytes_received,
            nat=tuple(nat_hop_part(hop) for hop in conn.nat.hops) if conn.nat else (),
            outcome=self.outcome,
            verdict=self.verdict,
            timeline=tuple(sorted(conn.entries, key=lambda entry: entry.time)),
            **owner,
        )


def _flow_part(flow: FlowTuple) -> FlowPart:
    return FlowPart(src=flow.src[0], sport=flow.src[1], dst=flow.dst[0], dport=flow.dst[1])


def nat_hop_part(hop: NatHop) -> NatHopPart:
    """A NAT hop as a report's `nat` list (and its timeline's `nat` entry) carries it."""
    return NatHopPart(
        kind=hop.kind,
        where=hop.where,
        before=_flow_part(hop.before),
        after=_flow_part(hop.after),
        state=hop.entry.state,
        status=hop.entry.status,
    )


# -- verdict --------------------------------------------------------------------------------------------


def _what(drop: DropRecord, conn: Connection) -> str:
    flags = drop.tcp_flag_names
    placement = conn.translated.get(id(drop))
    # Behind a NAT the endpoints are rewritten: the direction is where the packet sits on the NAT path.
    from_client = not placement.reply if placement else (drop.saddr, drop.sport) == conn.client
    if "SYN" in flags and "ACK" not in flags:
        return "SYNs"
    if "SYN" in flags:
        return "SYN-ACKs"
    if "RST" in flags:
        return "RSTs"
    return "segments from the client" if from_client else "segments from the server"


def _where(drop: DropRecord) -> str:
    rule = drop.rule
    netns = f"netns {drop.netns_name or drop.netns}"
    if rule:
        return f'"{rule}" ({netns})'
    return f"{drop.location.split('+', 1)[0]} ({netns})"


def _reason(drop: DropRecord) -> str:
    """The drop's reason, marked when it was inferred from the location (a kernel without reasons)."""
    return f"{drop.reason} (inferred)" if drop.reason_inferred is True else drop.reason


def drops_text(conn: Connection) -> str | None:
    """`SYNs dropped by NETFILTER_DROP at "-A INPUT ..." (netns b)`, the most frequent kind first."""
    drops = [drop for drop in conn.drops if drop.reason not in _BENIGN_DROPS]
    if not drops:
        return None
    kinds = Counter((_what(drop, conn), _reason(drop), _where(drop)) for drop in drops)
    (what, reason, where), _ = kinds.most_common(1)[0]
    text = f"{what} dropped by {reason} at {where}"
    example = next(
        drop for drop in drops if (_what(drop, conn), _reason(drop), _where(drop)) == (what, reason, where)
    )
    placement = conn.translated.get(id(example))
    if placement is not None and placement.translated:
        # Name the NAT hops the packet went through before it was dropped (reply packets: behind all).
        hops = placement.path.text(None if placement.reply else placement.position)
        text = f"{hops}, then {text}"
    others = len(drops) - kinds[(what, reason, where)]
    if others:
        text += f" (and {others} other drop{'s' if others > 1 else ''})"
    return text


def _retransmit_text(conn: Connection) -> str:
    total = sum(conn.retransmits.values())
    if not total:
        return ""
    kinds = ", ".join(f"{count} {kind}" for kind, count in conn.retransmits.most_common())
    return f"{total} retransmit{'s' if total > 1 else ''} ({kinds})"


def _sent_reset(conn: Connection) -> ResetRecord | None:
    """The reset whose cause we know: the one a traced side sent (stack or firewall)."""
    return next((reset for reset in conn.resets if reset.direction == "sent"), None)


def _refused_text(conn: Connection) -> str:
    """What follows "refused" in a verdict: who refused and why, as far as a traced side knows."""
    sent = _sent_reset(conn)
    if sent is None and conn.nat is not None and conn.nat.hops:
        last = conn.nat.hops[-1].after
        return f": {conn.nat.text()}, then {endpoint_text(*last.dst)} answered the SYN with RST"
    if sent is None:
        return f": {conn.server[0]} answered the SYN with RST"
    netns = f"netns {sent.netns_name or sent.netns}"
    if sent.by_firewall and sent.netfilter and sent.netfilter.get("rule"):
        netfilter = sent.netfilter
        where = f"{netfilter.get('table')}/{netfilter.get('chain')}"
        return f' by firewall rule "{netfilter["rule"]}" ({where}, {netns})'
    if sent.cause_code == "no_listener":
        return f": nothing listens on {endpoint_text(*conn.server)} ({netns})"
    return f": {sent.cause}"


def verdict(conn: Connection, still_running: bool) -> tuple[str, str]:
    """(outcome, one-line verdict) for a connection as far as it was seen."""
    client, server = endpoint_text(*conn.client), endpoint_text(*conn.server)
    dropped = drops_text(conn)
    duration = duration_text(max(0.0, conn.last_time - conn.first_time))
    syns = f"{conn.syn_retransmits} SYN retransmit{'s' if conn.syn_retransmits != 1 else ''}"
    received_rst = any(reset.direction == "received" for reset in conn.resets)
    if not conn.established:
        head = f"connect {client} → {server}"
        if conn.errno == _ECONNREFUSED or (received_rst and conn.errno is None) or _sent_reset(conn):
            return "refused", f"{head} refused{_refused_text(conn)}"
        if conn.errno == _ETIMEDOUT or conn.abandoned or (conn.syn_retransmits and not still_running):
            how = "failed" if conn.errno == _ETIMEDOUT else "abandoned by the application"
            outcome = "timeout" if conn.errno == _ETIMEDOUT else "abandoned"
            if conn.abandoned and conn.owner is not None:
                how = f"abandoned by {owner_text(conn.owner)}"
            text = f"{head} {how} after {syns}"
            if dropped:
                return outcome, f"{text}: {dropped}"
            if conn.nat is not None and conn.nat.hops:
                last = conn.nat.hops[-1].after
                return outcome, (
                    f"{text}: {conn.nat.text()}, then no drop of its packets was seen on this host, so they "
                    f"left it; look along the path to {endpoint_text(*last.dst)}"
                )
            return outcome, (
                f"{text}: no drop of its packets was seen on this host, so they left it; look along the path "
                f"to {conn.server[0]}"
            )
        if conn.errno:
            return "failed", f"{head} failed: {errno_text(conn.errno)}" + (f"; {dropped}" if dropped else "")
        pending = f"{head} still pending after {syns}"
        return "pending", f"{pending}: {dropped}" if dropped else pending
    head = f"connection {client} → {server}"
    latency = (
        f" established in {duration_text(conn.connect_latency)}," if conn.connect_latency is not None else ""
    )
    retransmits = _retransmit_text(conn)
    if conn.resets:
        sent = _sent_reset(conn)
        if sent is not None:
            by = "the client" if (sent.saddr, sent.sport) == conn.client else "the server"
            return "reset", f"{head}{latency} reset by {by} after {duration}: {sent.cause}"
        received = conn.resets[0]
        by = "the server" if (received.daddr, received.dport) == conn.client else "the client"
        text = f"{head}{latency} reset by {by} after {duration} ({received.state})"
        return "reset", f"{text}: {dropped}" if dropped else text
    if conn.errno == _ETIMEDOUT:
        text = f"{head}{latency} timed out after {duration}"
        text += f" and {retransmits}" if retransmits else ""
        return "timeout", f"{text}: {dropped}" if dropped else f"{text}: no drop seen on this host"
    if conn.errno:
        return "failed", f"{head}{latency} failed after {duration}: {errno_text(conn.errno)}"
    details = [part for part in (retransmits, dropped) if part]
    if conn.bytes_sent is not None:
        # tcpi_bytes_acked/received as `ss -i` shows them: sequence space, so SYN and FIN count one each.
        details.insert(0, f"bytes_acked {conn.bytes_sent}, bytes_received {conn.bytes_received}")
    tail = f" ({'; '.join(details)})" if details else ""
    if conn.finished_at is not None:
        return "closed", f"{head}{latency} closed normally after {duration}{tail}"
    return "open", f"{head}{latency} still open after {duration}{tail}"


# -- tracker --------------------------------------------------------------------------------------------


_RETRANS_NAMES = {
    RetransKind.SYN: "SYN",
    RetransKind.TLP: "tail loss probe",
    RetransKind.TIMEOUT: "timeout",
    RetransKind.FAST: "fast",
    RetransKind.OTHER: "other",
}


def _endpoint(address: str | None, port: int) -> Endpoint | None:
    if address is None or not port or address in ("0.0.0.0", "::"):
        return None
    return (address, port)


class ConnTracker:
    """Collects events into connections; `ready()` hands over those that are over (after a grace period)."""

    def __init__(
        self,
        selector: ConnSelector,
        context: KernelContext | None = None,
        clock: Callable[[], float] = time.monotonic,
        grace: float = _GRACE_S,
        conntrack: ConntrackSource | None = None,
    ) -> None:
        """`conntrack`, when given, is asked for NAT entries so packets rewritten by a NAT on this host join
        their connection (diagnostics/nat_join.py); without it the join is by endpoints only."""
        self.selector = selector
        self.conntrack = conntrack
        self.context = context or KernelContext()
        self._clock = clock
        self._grace = grace
        self._connections: dict[FlowKey, Connection] = {}
        self._ignored: set[FlowKey] = set()
        self._unbound: dict[tuple[int, int], list[tuple[RawTcpEvent, TimelineEntry]]] = {}
        self._socket_flow: dict[tuple[int, int], FlowKey] = {}
        self._pending: dict[FlowKey, list[tuple[float, DropRecord | ResetRecord | AbortRecord]]] = {}
        self._done: list[ConnReport] = []
        # Drops and resets that no connection claimed before they stopped waiting (or by the end), kept when
        # asked (`take_unclaimed`): a fleet host's own share of a flow whose socket lives on another host.
        self.keep_unclaimed = False
        self._unclaimed: list[DropRecord | ResetRecord | AbortRecord] = []
        # NAT join: a rewritten pair -> the client's pair and where on the NAT path it was seen.
        self._aliases: dict[FlowKey, tuple[FlowKey, Placement]] = {}
        self._placements: dict[int, Placement] = {}  # id(waiting item) -> its placement
        self._nat_tries: dict[FlowKey, int] = {}
        self._nat_read_at: float | None = None

    # -- input -----------------------------------------------------------------------------------------
    def add_tcp(self, raw: RawTcpEvent, record: ResetRecord | AbortRecord | None = None) -> None:
        """A tcp event; `record` is its reset or abort record when the resets enricher made one."""
        if record is not None:
            self._add_flow_record(record, raw)
            return
        if raw.kind in (EventKind.RESET_SENT, EventKind.RESET_RECEIVED, EventKind.RESET_FIREWALL):
            return
        entry = self._entry(raw)
        socket_key = (raw.netns, raw.sk)
        flow = self._socket_flow.get(socket_key)
        local, remote = _endpoint(raw.laddr, raw.lport), _endpoint(raw.raddr, raw.rport)
        if flow is None and (local is None or remote is None):
            names = self.context.names
            if raw.kind == EventKind.STATE and names.state(raw.old_state) == "CLOSE":
                if names.state(raw.state) == "SYN_SENT":  # connect(): the port comes with the next event
                    self._unbound[socket_key] = [(raw, entry)]
                else:  # a listener, or a socket closing: nothing of a connection to keep
                    self._unbound.pop(socket_key, None)
            elif raw.kind == EventKind.STATE and names.state(raw.state) == "CLOSE":
                self._unbound.pop(socket_key, None)
            return
        if flow is None:
            assert local is not None and remote is not None
            names = self.context.names
            birth = socket_key in self._unbound or (
                raw.kind == EventKind.STATE and names.state(raw.old_state) in ("CLOSE", "LISTEN")
            )
            conn = self._connection_for(raw, local, remote, birth)
            if conn is None:
                self._unbound.pop(socket_key, None)
                return
            flow = conn.key
            self._socket_flow[socket_key] = flow
            for earlier, earlier_entry in self._unbound.pop(socket_key, []):
                self._apply(conn, earlier, earlier_entry)
        conn = self._connections.get(flow)
        if conn is None:
            return
        self._apply(conn, raw, entry)

    def add_drop(self, drop: DropRecord) -> None:
        if drop.proto != "tcp" or drop.saddr is None or drop.daddr is None:
            return
        source, destination = (drop.saddr, drop.sport or 0), (drop.daddr, drop.dport or 0)
        key = self._through_nat(frozenset((source, destination)), drop)
        conn = self._connections.get(key)
        if conn is None:
            if key not in self._ignored:
                self._pending.setdefault(key, []).append((self._clock(), drop))
            return
        self._attach(conn, drop)

    # -- internals -------------------------------------------------------------------------------------
    def _add_flow_record(self, record: ResetRecord | AbortRecord, raw: RawTcpEvent) -> None:
        local, remote = _endpoint(raw.laddr, raw.lport), _endpoint(raw.raddr, raw.rport)
        if local is None or remote is None:
            return
        key = self._through_nat(frozenset((local, remote)), record)
        conn = self._connections.get(key)
        if conn is None:
            if key not in self._ignored:
                self._pending.setdefault(key, []).append((self._clock(), record))
            return
        self._attach(conn, record)

    def _through_nat(self, key: FlowKey, item: DropRecord | ResetRecord | AbortRecord) -> FlowKey:
        """The client's pair for a pair a NAT rewrote (known from an earlier conntrack read), else `key`."""
        alias = self._aliases.get(key)
        if alias is None:
            return key
        self._placements[id(item)] = alias[1]
        return alias[0]

    def _note_nat(self, conn: Connection, path: NatPath, time: float) -> None:
        """Keep the longest NAT path seen for the connection; each new hop becomes a timeline entry, dated by
        the first packet seen past it (the translation happened then), however late conntrack was read."""
        known = len(conn.nat.hops) if conn.nat else 0
        if len(path.hops) <= known:
            conn.entries = [
                msgspec.structs.replace(entry, time=WallTime(time))
                if entry.event == "nat" and entry.time > time
                else entry
                for entry in conn.entries
            ]
            return
        conn.nat = path
        for hop in path.hops[known:]:
            state = f", {hop.entry.state}" if hop.entry.state else ""
            conntrack = f"conntrack {hop.entry.original.text()} ⇄ {hop.entry.reply.text()}{state}"
            part = nat_hop_part(hop)
            conn.add(
                TimelineEntry(
                    time=WallTime(time),
                    event="nat",
                    netns=hop.where.removeprefix("netns "),
                    text=f"{hop.text()} ({conntrack})",
                    kind=part.kind,
                    where=part.where,
                    before=part.before,
                    after=part.after,
                    state=part.state,
                    status=part.status,
                )
            )

    def _needs_nat_check(self, conn: Connection) -> bool:
        """A connection that failed to connect and whose NAT path (if any) was never looked up."""
        failed = conn.syn_retransmits or conn.resets or conn.errno
        return (
            self.conntrack is not None
            and not conn.established
            and bool(failed)
            and not conn.nat_checked
            and conn.nat is None
        )

    def _resolve_nat(self, final: bool) -> None:
        """Read conntrack (rate-limited, only while something waits) and join what a NAT rewrote: waiting
        drops/resets whose pair is a translated form of a connection's pair, and connections that failed to
        connect (SYNs retried, refused), whose path then names the NAT hop they went through."""
        if self.conntrack is None:
            return
        self.conntrack.poll()  # entries that died since the last step are remembered, not missed
        now = self._clock()
        waiting = [
            key
            for key in self._pending
            if len(key) == 2 and key not in self._aliases and self._nat_tries.get(key, 0) < _NAT_TRIES
        ]
        stuck = [conn for conn in self._connections.values() if self._needs_nat_check(conn)]
        # Selected connections first: drops of other flows (anywhere on the host) must not crowd them out.
        stuck = stuck[:_NAT_FLOWS_PER_READ]
        waiting = waiting[: _NAT_FLOWS_PER_READ - len(stuck)]
        if not waiting and not stuck:
            return
        if not final and self._nat_read_at is not None and now - self._nat_read_at < _NAT_READ_EVERY_S:
            return
        self._nat_read_at = now
        asked: set[FlowTuple] = set()
        for key in waiting:
            first, second = sorted(key)
            asked.update((FlowTuple("tcp", first, second), FlowTuple("tcp", second, first)))
        asked.update(FlowTuple("tcp", conn.client, conn.server) for conn in stuck)
        index = NatIndex(self._nat_entries(asked))
        # Waiting packets first: they date the NAT hop; a stuck connection's path found without one is dated
        # by its last event.
        for key in waiting:
            self._nat_tries[key] = self._nat_tries.get(key, 0) + 1
            first, second = sorted(key)
            placement = index.place(FlowTuple("tcp", first, second))
            if placement is None or not placement.translated:
                continue
            original = placement.path.original.pair
            self._aliases[key] = (original, placement)
            items = self._pending.pop(key)
            for _, item in items:
                self._placements[id(item)] = placement
            joined = self._connections.get(original)
            if joined is not None:
                for _, item in items:
                    self._attach(joined, item)
            elif original not in self._ignored:
                self._pending.setdefault(original, []).extend(items)
        for conn in stuck:
            conn.nat_checked = True
            path = index.path(FlowTuple("tcp", conn.client, conn.server))
            if path.hops:
                self._note_nat(conn, path, conn.last_time)

    def _nat_entries(self, flows: set[FlowTuple]) -> list[ConntrackEntry]:
        """The entries holding `flows`, and the hops before and after them (a NAT chain), by lookups."""
        assert self.conntrack is not None
        found: dict[ConntrackEntry, None] = {}
        asked: set[FlowTuple] = set()
        for _ in range(_NAT_MAX_HOPS):
            flows -= asked
            if not flows:
                break
            asked |= flows
            new = [entry for entry in self.conntrack.lookup(sorted(flows, key=repr)) if entry not in found]
            found.update(dict.fromkeys(new))
            # A hop before holds our original tuple as its reply (reversed); a hop after holds our translated
            # tuple as its original.
            flows = {
                flow
                for entry in new
                if entry.is_nat
                for flow in (entry.original.reversed(), entry.translated)
            }
        return list(found)

    def _attach(self, conn: Connection, item: DropRecord | ResetRecord | AbortRecord) -> None:
        placement = self._placements.pop(id(item), None)
        if placement is not None:
            conn.translated[id(item)] = placement
            self._note_nat(conn, placement.path, item.time)
        if isinstance(item, DropRecord):
            conn.drops.append(item)
            flags = f" [{item.tcp_flags}]" if isinstance(item.tcp_flags, str) else ""
            where = _where(item)
            text = (
                f"dropped{flags} {endpoint_text(item.saddr, item.sport)} > "
                f"{endpoint_text(item.daddr, item.dport)}: {_reason(item)} at {where}"
            )
            conn.add(
                TimelineEntry(
                    time=item.time,
                    event="drop",
                    netns=item.netns_name or str(item.netns),
                    text=text,
                    reason=item.reason,
                    location=item.location,
                    netfilter=item.netfilter or None,
                    reason_inferred=True if item.reason_inferred is True else msgspec.UNSET,
                    tcp_flags=item.tcp_flags,  # the fleet merge places a dropped RST after its reset
                )
            )
        elif isinstance(item, ResetRecord):
            conn.resets.append(item)
            what = "RST sent by firewall" if item.by_firewall else f"RST {item.direction}"
            conn.add(
                TimelineEntry(
                    time=item.time,
                    event="reset",
                    netns=item.netns_name or str(item.netns),
                    text=f"{what} ({item.state or 'no socket'}): {item.cause}",
                    direction=item.direction,
                    cause_code=item.cause_code,
                    reason=item.reason,
                )
            )
        else:
            conn.aborts.append(item)
            conn.errno = conn.errno or errno_number(item.errno)
            conn.add(
                TimelineEntry(
                    time=item.time,
                    event="abort",
                    netns=item.netns_name or str(item.netns),
                    text=item.cause,
                    errno=item.errno,
                    cause_code=item.cause_code,
                )
            )

    def _connection_for(
        self, raw: RawTcpEvent, local: Endpoint, remote: Endpoint, birth: bool
    ) -> Connection | None:
        """The connection a socket belongs to; `birth` says the socket was just born (connect(), or cloned
        from its listener), which is the only way a connection on already-known ports starts anew."""
        key = frozenset((local, remote))
        conn = self._connections.get(key)
        if conn is not None and birth:
            known = conn.sockets.get((raw.netns, raw.sk))
            # Ports and even the socket's memory are reused at once on loopback (TIME_WAIT reuse): a birth on
            # a finished connection, on a closed socket, or on an end that already has a socket (its close
            # was sampled away under overload) starts a new connection; the old one is reported now.
            same_end = known is None and any(other.local == local for other in conn.sockets.values())
            if conn.finished_at is not None or (known is not None and known.closed) or same_end:
                self._done.append(self._report(self._connections.pop(key), still_running=True))
                conn = None
        if conn is not None:
            return conn
        if key in self._ignored:  # the selector decides on the endpoints alone: the same answer again
            return None
        client, server = self._roles(raw, local, remote)
        if not self.selector.matches(client, server):
            self._ignored.add(key)
            self._pending.pop(key, None)
            return None
        self._ignored.discard(key)
        conn = Connection(client, server, raw.family, self.context.wall_time(raw.monotonic_ns))
        self._connections[key] = conn
        for _, item in self._pending.pop(key, []):
            self._attach(conn, item)
        return conn

    def _roles(self, raw: RawTcpEvent, local: Endpoint, remote: Endpoint) -> tuple[Endpoint, Endpoint]:
        """(client, server): the socket's side when the tracker saw it start, else the state, else ports."""
        side = raw.side
        state = self.context.names.state(raw.state)
        if side is None and state == "SYN_SENT":
            side = "client"
        if side is None and state in ("SYN_RECV", "NEW_SYN_RECV"):
            side = "server"
        if side == "client":
            return local, remote
        if side == "server":
            return remote, local
        return (local, remote) if local[1] > remote[1] else (remote, local)

    def _entry(self, raw: RawTcpEvent) -> TimelineEntry:
        context = self.context
        names = context.names
        netns = context.netns_name(raw.netns) or str(raw.netns)
        when = WallTime(context.wall_time(raw.monotonic_ns))
        if raw.kind == EventKind.STATE:
            old, new = names.state(raw.old_state), names.state(raw.state)
            spent = f" after {duration_text(raw.value1 / 1e9)}" if raw.value1 else ""
            text = f"{old} → {new}{spent}"
            if new == "CLOSE" and raw.reason:
                text += f" with {errno_name(raw.reason)}"
            if old == "CLOSE" and new == "SYN_SENT" and raw.in_task:
                text += f" (connect() by {raw.comm}[{raw.pid}])"
            return TimelineEntry(
                time=when, event="state", netns=netns, text=text, old_state=old, new_state=new
            )
        if raw.kind == EventKind.RETRANS:
            kind = _RETRANS_NAMES[raw.retrans_kind]
            state = names.state(raw.state)
            srtt = f", srtt {raw.value2} us" if raw.value2 else ""
            return TimelineEntry(
                time=when,
                event="retransmit",
                netns=netns,
                text=f"{kind} retransmit in {state} (retransmits so far {raw.value1}{srtt})",
                kind=kind,
                state=state,
            )
        if raw.kind == EventKind.SYNACK_RETRANS:
            return TimelineEntry(
                time=when, event="synack_retransmit", netns=netns, text=f"SYN-ACK retransmit #{raw.value1}"
            )
        if raw.kind == EventKind.ERROR:
            return TimelineEntry(
                time=when,
                event="error",
                netns=netns,
                text=f"socket error {errno_text(raw.reason)}",
                errno=errno_name(raw.reason),
            )
        kind_name = raw.kind.name.lower()
        return TimelineEntry(time=when, event=kind_name, netns=netns, text=kind_name)

    def _apply(self, conn: Connection, raw: RawTcpEvent, entry: TimelineEntry) -> None:
        names = self.context.names
        socket = conn.sockets.setdefault((raw.netns, raw.sk), _Socket(raw.netns, raw.sk))
        socket.side = raw.side or socket.side
        local = _endpoint(raw.laddr, raw.lport)
        if local is not None:
            socket.local = local
            if local == conn.client:
                conn.client_netns = raw.netns
            elif local == conn.server:
                conn.server_netns = raw.netns
        state = names.state(raw.state)
        if raw.kind == EventKind.STATE:
            old = names.state(raw.old_state)
            socket.state = state
            if raw.in_task and old == "CLOSE" and state == "SYN_SENT" and conn.owner is None:
                conn.owner = self.context.owner(tcp_owner_facts(raw, task_acts_on_socket=True))
            if state == "ESTABLISHED" and conn.established_time is None:
                conn.established_time = entry.time
                if old == "SYN_SENT" and raw.value1:
                    conn.connect_latency = raw.value1 / 1e9
            if state == "CLOSE":
                socket.closed = True
                # The socket's memory may come back at once as a new socket: find its connection afresh.
                self._socket_flow.pop((raw.netns, raw.sk), None)
                if raw.reason:
                    conn.errno = conn.errno or raw.reason
                elif old == "SYN_SENT" and not conn.established and not conn.errno:
                    # CLOSE straight from SYN_SENT with no error: the application gave up (close()).
                    conn.abandoned = not any(r.direction == "received" for r in conn.resets)
                if socket.local == conn.client and raw.value2:
                    conn.bytes_sent, conn.bytes_received = raw.value2, raw.value3
            if all(known.closed for known in conn.sockets.values()):
                conn.finished_at = self._clock()
            else:
                conn.finished_at = None
        elif raw.kind == EventKind.RETRANS:
            if raw.retrans_kind == RetransKind.SYN:
                conn.syn_retransmits += 1
            else:
                conn.retransmits[_RETRANS_NAMES[raw.retrans_kind]] += 1
        elif raw.kind == EventKind.SYNACK_RETRANS:
            conn.synack_retransmits += 1
        elif raw.kind == EventKind.ERROR:
            conn.errno = raw.reason
        if conn.owner is None and socket.local == conn.client:
            owner = self.context.owner(tcp_owner_facts(raw))
            if owner.pid is not None:
                conn.owner = owner
        conn.add(entry)

    # -- output ----------------------------------------------------------------------------------------
    def ready(self) -> list[ConnReport]:
        """Connections over for at least the grace period (and pending items too old to wait for)."""
        self._resolve_nat(final=False)
        now = self._clock()
        done = [
            key
            for key, conn in self._connections.items()
            if conn.finished_at is not None and now - conn.finished_at >= self._grace
        ]
        if any(self._needs_nat_check(self._connections[key]) for key in done):
            self._resolve_nat(final=True)  # its verdict is final: ask now, whatever the rate limit
        for key, items in list(self._pending.items()):
            fresh = [(seen, item) for seen, item in items if now - seen < _PENDING_S]
            if fresh:
                self._pending[key] = fresh
            else:
                del self._pending[key]
                self._nat_tries.pop(key, None)
                if self.keep_unclaimed:
                    self._unclaimed.extend(item for _, item in items)
                for _, item in items:
                    self._placements.pop(id(item), None)
        reports, self._done = self._done, []
        return reports + [self._report(self._connections.pop(key), still_running=True) for key in done]

    def flush(self) -> list[ConnReport]:
        """Every connection seen, at the end of the run."""
        self._resolve_nat(final=True)
        reports, self._done = self._done, []
        reports += [self._report(conn, still_running=False) for conn in self._connections.values()]
        self._connections.clear()
        if self.keep_unclaimed:
            self._unclaimed.extend(item for items in self._pending.values() for _, item in items)
            self._pending.clear()
        return reports

    def take_unclaimed(self) -> list[DropRecord | ResetRecord | AbortRecord]:
        """The unclaimed drops and resets kept since the last call (see `keep_unclaimed`)."""
        items, self._unclaimed = self._unclaimed, []
        return items

    def _report(self, conn: Connection, still_running: bool) -> ConnReport:
        for socket_key, flow in list(self._socket_flow.items()):
            if flow == conn.key:
                del self._socket_flow[socket_key]
        # A later connection on the same ports may be translated elsewhere: its aliases are learned anew.
        for alias, (original, _) in list(self._aliases.items()):
            if original == conn.key:
                del self._aliases[alias]
                self._nat_tries.pop(alias, None)
        outcome, text = verdict(conn, still_running=still_running and conn.finished_at is None)
        return ConnReport(conn, outcome, text)
