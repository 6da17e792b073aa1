"""`tcp life | states | retrans | connlat | queues`: records for the tcp object's non-reset kinds.

- life (like tcplife): a connection's whole life, emitted when it reaches CLOSE: owner, endpoints, duration,
  bytes (tcpi_bytes_acked / tcpi_bytes_received, sequence space as `ss -i` shows them);
- states (like tcpstates): every transition with the time spent in the previous state;
- retrans (like tcpretrans): SYN, SYN-ACK, tail-loss-probe, timeout and fast retransmits with per-flow counts;
- connlat (like tcpconnlat): connect() to ESTABLISHED per process and destination, and failed connects with
  their errno (SYN_SENT -> CLOSE; sk_err is set by tcp_done_with_error before the state changes);
- queues: accept-queue overflows (the listener, its backlog and somaxconn), receive-buffer and memory drops
  with the owning process, and the TcpExt counters that show SYN-queue pressure and cookies.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from netsleuth._generated.tcp_abi import (
    TCP_REASON_SYN_ACCEPT_QUEUE_FULL,
    EventKind,
    RetransKind,
)
from netsleuth.diagnostics.attribution import Owner, owner_json, owner_text, tcp_owner_facts
from netsleuth.diagnostics.causes import cause
from netsleuth.diagnostics.reset_causes import duration_text, netns_prefix
from netsleuth.diagnostics.schema import SCHEMA_VERSIONS
from netsleuth.diagnostics.tcp_context import endpoint_text, iso_time
from netsleuth.diagnostics.tcp_names import errno_name, errno_text
from netsleuth.diagnostics.tcp_session import RawTcpEvent, RawTcpGroup
from netsleuth.doctor.procfs import parse_mib
from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.context import KernelContext
from netsleuth.kernel.netns_exec import read_file_in_netns
from netsleuth.kernel.pods import Pod
from netsleuth.kernel.reasons import DropReasons
from netsleuth.packet import tcp_flags_text

__all__ = [
    "NETSTAT_COUNTERS",
    "SUBCOMMAND_KINDS",
    "ConnectRecord",
    "LifeRecord",
    "NetstatReader",
    "QueueRecord",
    "RetransRecord",
    "StateRecord",
    "TcpEventEnricher",
    "TcpGroupRecord",
]

SUBCOMMAND_KINDS: dict[str, frozenset[EventKind]] = {
    "life": frozenset({EventKind.LIFE}),
    "states": frozenset({EventKind.STATE}),
    "retrans": frozenset({EventKind.RETRANS, EventKind.SYNACK_RETRANS}),
    "connlat": frozenset({EventKind.CONNECT}),
    "queues": frozenset({EventKind.SOCK_DROP, EventKind.RCVQ_FULL, EventKind.MEM_LIMIT}),
}
RETRANS_KIND_NAMES = {
    RetransKind.SYN: "syn",
    RetransKind.TLP: "tlp",
    RetransKind.TIMEOUT: "timeout",
    RetransKind.FAST: "fast",
    RetransKind.OTHER: "other",
}
# TcpExt counters (include/uapi/linux/snmp.h, /proc/net/netstat) that tell about listen and buffer pressure
# where no tracepoint does: SYNs dropped for a full accept queue are consumed, not freed as drops
# (net/ipv4/tcp_input.c tcp_conn_request), and SYN cookies have no tracepoint.
NETSTAT_COUNTERS = (
    "ListenOverflows",
    "ListenDrops",
    "SyncookiesSent",
    "SyncookiesRecv",
    "SyncookiesFailed",
    "TCPReqQFullDoCookies",
    "TCPReqQFullDrop",
    "TCPBacklogDrop",
    "TCPRcvQDrop",
    "PruneCalled",
    "RcvPruned",
    "OfoPruned",
    "TCPOFODrop",
    "TCPZeroWindowDrop",
    "TCPMemoryPressures",
)
_OWN_REASONS = {
    TCP_REASON_SYN_ACCEPT_QUEUE_FULL: "SYN_ACCEPT_QUEUE_FULL",
}
_SOCKET_PROTOCOLS = {6: "TCP", 17: "UDP", 136: "UDP-Lite", 1: "ICMP", 58: "ICMPv6", 255: "raw"}


def _base_json(
    kind: str, when: float, raw: RawTcpEvent, owner: Owner, netns_name: str | None, pod: Pod | None = None
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": kind,
        "v": SCHEMA_VERSIONS[kind],
        "time": iso_time(when),
        "family": raw.family,
        "proto": "tcp",
        "saddr": raw.laddr,
        "sport": raw.lport,
        "daddr": raw.raddr,
        "dport": raw.rport,
        **owner_json(owner),
        "netns": raw.netns,
        "netns_name": netns_name,
    }
    if pod is not None:
        data["pod"] = pod.to_json()
    return data


@dataclass(frozen=True)
class LifeRecord:
    time: float
    raw: RawTcpEvent
    owner: Owner
    netns_name: str | None
    duration_s: float
    bytes_acked: int
    bytes_received: int
    last_state: str | None

    @property
    def local(self) -> str:
        return endpoint_text(self.raw.laddr, self.raw.lport)

    @property
    def remote(self) -> str:
        return endpoint_text(self.raw.raddr, self.raw.rport)

    pod: Pod | None = None  # the Kubernetes pod whose network namespace this is

    def to_json(self) -> dict[str, Any]:
        return {
            **_base_json("life", self.time, self.raw, self.owner, self.netns_name, self.pod),
            "side": self.raw.side,
            "duration_s": self.duration_s,
            "bytes_acked": self.bytes_acked,
            "bytes_received": self.bytes_received,
            "last_state": self.last_state,
            # Opened before the trace: duration_s counts from the trace's start, a lower bound.
            **({"born_before_trace": True} if self.raw.born_before_trace else {}),
        }


@dataclass(frozen=True)
class StateRecord:
    time: float
    raw: RawTcpEvent
    owner: Owner
    netns_name: str | None
    old_state: str | None
    new_state: str | None
    previous_s: float | None  # time spent in old_state; None when its start was not seen
    error: int | None

    pod: Pod | None = None  # the Kubernetes pod whose network namespace this is

    def to_json(self) -> dict[str, Any]:
        return {
            **_base_json("state", self.time, self.raw, self.owner, self.netns_name, self.pod),
            "old_state": self.old_state,
            "new_state": self.new_state,
            "previous_state_s": self.previous_s,
            "errno": errno_name(self.error) if self.error else None,
            "side": self.raw.side,
        }


@dataclass(frozen=True)
class RetransRecord:
    time: float
    raw: RawTcpEvent
    owner: Owner
    netns_name: str | None
    kind: str  # syn | synack | tlp | timeout | fast | other
    state: str | None
    flow_count: int  # retransmits of this flow seen so far in this run
    congestion: str | None

    pod: Pod | None = None  # the Kubernetes pod whose network namespace this is

    def to_json(self) -> dict[str, Any]:
        raw = self.raw
        data = {
            **_base_json("retrans", self.time, raw, self.owner, self.netns_name, self.pod),
            "kind": self.kind,
            "state": self.state,
            "flow_count": self.flow_count,
            "congestion_state": self.congestion,
            # One record is one retransmitted skb; TCP sends GSO skbs, so it can be several segments.
            "segments": raw.segs,
        }
        if self.kind == "synack":
            data["synack_retransmits"] = raw.value1
        else:
            data.update(
                {
                    "total_retrans": raw.value1,
                    "srtt_us": raw.value2,
                    "cwnd": raw.value3,
                    "unanswered": raw.retransmits,
                    "error": raw.reason or None,
                }
            )
        return data


@dataclass(frozen=True)
class ConnectRecord:
    time: float
    raw: RawTcpEvent
    owner: Owner
    netns_name: str | None
    latency_s: float
    error: int  # 0: connected

    pod: Pod | None = None  # the Kubernetes pod whose network namespace this is

    def to_json(self) -> dict[str, Any]:
        return {
            **_base_json("connect", self.time, self.raw, self.owner, self.netns_name, self.pod),
            "latency_ms": self.latency_s * 1e3,
            "ok": self.error == 0,
            "errno": errno_name(self.error) if self.error else None,
        }


@dataclass(frozen=True)
class QueueRecord:
    time: float
    raw: RawTcpEvent
    owner: Owner
    netns_name: str | None
    what: str  # accept_queue_overflow | listen_drop | receive_buffer | socket_backlog | memory | ...
    reason: str | None  # the drop reason, when a drop
    text: str
    check: str
    somaxconn: int | None = None
    state: str | None = None
    cause_code: str | None = None  # netsleuth.diagnostics.causes

    pod: Pod | None = None  # the Kubernetes pod whose network namespace this is

    def to_json(self) -> dict[str, Any]:
        raw = self.raw
        data = {
            **_base_json("queue", self.time, raw, self.owner, self.netns_name, self.pod),
            "what": self.what,
            "reason": self.reason,
            "state": self.state,
            "text": self.text,
            "check": self.check,
            "cause_code": self.cause_code,
            "queued": raw.backlog,
            "limit": raw.max_backlog,
        }
        if self.what in ("accept_queue_overflow", "listen_drop"):
            data.update({"backlog": raw.max_backlog, "somaxconn": self.somaxconn, "syn_queue": raw.syn_queue})
        if raw.trigger is not None:
            data["tcp_flags"] = tcp_flags_text(raw.trigger.flags)
        return data


TcpRecord = LifeRecord | StateRecord | RetransRecord | ConnectRecord | QueueRecord


@dataclass(frozen=True)
class TcpGroupRecord:
    """An exact in-kernel count of one kind of event, with its totals and an example."""

    kind: EventKind
    count: int
    sum1: int
    sum2: int
    sum3: int
    max1: int
    example: TcpRecord
    segs: int = 0  # retransmits: segments (count is skbs); TcpRetransSegs counts segments

    # What the kernel summed per kind (tcp.bpf.c): life sums durations (ns) and bytes acked/received,
    # connect sums latencies (ns), state sums the time spent in the previous state (ns).
    @property
    def mean_duration_s(self) -> float:
        return self.sum1 / self.count / 1e9

    @property
    def max_duration_s(self) -> float:
        return self.max1 / 1e9

    @property
    def bytes_acked(self) -> int:
        return self.sum2

    @property
    def bytes_received(self) -> int:
        return self.sum3

    @property
    def mean_latency_ms(self) -> float:
        return self.sum1 / self.count / 1e6

    @property
    def max_latency_ms(self) -> float:
        return self.max1 / 1e6

    @property
    def mean_previous_state_s(self) -> float:
        return self.sum1 / self.count / 1e9

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"count": self.count, "example": self.example.to_json()}
        if self.kind == EventKind.LIFE:
            data.update(
                {
                    "mean_duration_s": self.mean_duration_s,
                    "max_duration_s": self.max_duration_s,
                    "bytes_acked": self.bytes_acked,
                    "bytes_received": self.bytes_received,
                }
            )
        elif self.kind == EventKind.CONNECT:
            data.update({"mean_latency_ms": self.mean_latency_ms, "max_latency_ms": self.max_latency_ms})
        elif self.kind == EventKind.STATE:
            data["mean_previous_state_s"] = self.mean_previous_state_s
        elif self.kind in (EventKind.RETRANS, EventKind.SYNACK_RETRANS):
            data["segments"] = self.segs
        return data


@dataclass
class NetstatReader:
    """TcpExt counters of a namespace (read from inside it) and their growth since `start`."""

    netns_path: str | None
    path: str = "/proc/self/net/netstat"
    _start: dict[str, int] = field(default_factory=dict)

    def read(self) -> dict[str, int]:
        try:
            text = read_file_in_netns(self.path, self.netns_path)
        except EnvironmentProblem:
            return {}
        counters = parse_mib(text or "")
        return {
            name.removeprefix("TcpExt."): value
            for name, value in counters.items()
            if name.startswith("TcpExt.")
        }

    def start(self) -> None:
        self._start = self.read()

    def growth(self) -> dict[str, int]:
        now = self.read()
        return {name: now[name] - self._start.get(name, 0) for name in NETSTAT_COUNTERS if name in now}


def _sysctl_in(netns_path: str | None, path: str) -> int | None:
    try:
        text = read_file_in_netns(path, netns_path)
    except EnvironmentProblem:
        return None
    return int(text.strip()) if text and text.strip().lstrip("-").isdigit() else None


class TcpEventEnricher:
    """RawTcpEvents of the tcp subcommands' kinds -> records. One per run (holds per-flow counts, caches)."""

    def __init__(self, context: KernelContext | None = None, drop_reasons: DropReasons | None = None) -> None:
        self.context = context or KernelContext()
        self.drop_reasons = drop_reasons
        self._flow_counts: collections.Counter[tuple[object, ...]] = collections.Counter()
        self._somaxconn: dict[int, int | None] = {}

    def somaxconn(self, netns: int) -> int | None:
        if netns not in self._somaxconn:
            path = self.context.netns_path(netns)
            self._somaxconn[netns] = _sysctl_in(path, "/proc/sys/net/core/somaxconn")
        return self._somaxconn[netns]

    def enrich(self, raw: RawTcpEvent, count_flows: bool = True) -> TcpRecord | None:
        record = self._enrich(raw, count_flows)
        pod = self.context.pod(raw.netns) if record is not None else None
        return dataclasses.replace(record, pod=pod) if record is not None and pod is not None else record

    def _enrich(self, raw: RawTcpEvent, count_flows: bool) -> TcpRecord | None:
        context = self.context
        names = context.names
        when = context.wall_time(raw.monotonic_ns)
        netns_name = context.netns_name(raw.netns)
        if raw.kind == EventKind.LIFE:
            return LifeRecord(
                when,
                raw,
                context.owner(tcp_owner_facts(raw)),
                netns_name,
                raw.value1 / 1e9,
                raw.value2,
                raw.value3,
                names.state(raw.old_state),
            )
        if raw.kind == EventKind.STATE:
            owner = context.owner(
                tcp_owner_facts(raw, task_acts_on_socket=names.state(raw.old_state) == "CLOSE")
            )
            return StateRecord(
                when,
                raw,
                owner,
                netns_name,
                names.state(raw.old_state),
                names.state(raw.state),
                raw.value1 / 1e9 if raw.value1 else None,
                raw.reason or None,
            )
        if raw.kind == EventKind.CONNECT:
            return ConnectRecord(
                when, raw, context.owner(tcp_owner_facts(raw)), netns_name, raw.value1 / 1e9, raw.reason
            )
        if raw.kind in (EventKind.RETRANS, EventKind.SYNACK_RETRANS):
            flow = (raw.netns, raw.laddr, raw.lport, raw.raddr, raw.rport)
            if count_flows:
                self._flow_counts[flow] += 1
            synack = raw.kind == EventKind.SYNACK_RETRANS
            return RetransRecord(
                when,
                raw,
                context.owner(tcp_owner_facts(raw)),
                netns_name,
                "synack" if synack else RETRANS_KIND_NAMES[raw.retrans_kind],
                names.state(raw.state),
                self._flow_counts[flow],
                None if synack else names.ca_state(raw.ca_state),
            )
        if raw.kind in (EventKind.SOCK_DROP, EventKind.RCVQ_FULL, EventKind.MEM_LIMIT):
            return self._queue(raw, when, netns_name)
        return None

    def _queue(self, raw: RawTcpEvent, when: float, netns_name: str | None) -> QueueRecord:
        record = self._queue_record(raw, when, netns_name)
        return dataclasses.replace(record, state=self.context.names.state(raw.state))

    def _queue_record(self, raw: RawTcpEvent, when: float, netns_name: str | None) -> QueueRecord:
        context = self.context
        owner = context.owner(tcp_owner_facts(raw))
        who = owner_text(owner)
        local = endpoint_text(raw.laddr, raw.lport)
        remote = endpoint_text(raw.raddr, raw.rport)
        prefix = netns_prefix(netns_name)
        where = context.netns_label(raw.netns)

        def record(what: str, reason: str | None, text: str, check: str, code: str | None) -> QueueRecord:
            return QueueRecord(when, raw, owner, netns_name, what, reason, text, check, cause_code=code)

        if raw.kind == EventKind.MEM_LIMIT:
            memory = cause("socket_memory")
            direction = "send" if raw.reason == 0 else "receive"
            return record(
                "memory",
                None,
                f"{direction} memory of {local} (owned by {who}) hit the protocol's global limit "
                f"({raw.value1} pages allocated; queued {raw.backlog} of {raw.max_backlog} bytes)",
                prefix + memory.checks[0],
                memory.code,
            )
        if raw.kind == EventKind.RCVQ_FULL:
            rcvbuf = cause("rcvbuf")
            protocol = _SOCKET_PROTOCOLS.get(raw.reason, str(raw.reason))
            return record(
                "receive_buffer",
                None,
                f"the receive queue of the {protocol} socket {local} ({where}) is full "
                f"({raw.backlog} of {raw.max_backlog} bytes): {who} reads too slowly, the packet was dropped",
                f"{prefix}{rcvbuf.checks_for(port=raw.lport)[0]}; {rcvbuf.remedy}",
                rcvbuf.code,
            )
        reason = _OWN_REASONS.get(raw.reason) or (
            self.drop_reasons.name(raw.reason) if self.drop_reasons is not None else str(raw.reason)
        )
        if context.names.state(raw.state) == "LISTEN":
            return self._listener_record(raw, when, netns_name, owner, reason)
        texts = {
            "SOCKET_RCVBUFF": (
                "receive_buffer",
                f"the receive buffer of {local} is full ({raw.backlog} of {raw.max_backlog} bytes): {who} "
                "reads too slowly",
                "tcp_receive_full",
            ),
            "SOCKET_BACKLOG": (
                "socket_backlog",
                f"the backlog of {local} overflowed while {who} held the socket locked (busy in a syscall)",
                "socket_backlog",
            ),
            "PROTO_MEM": (
                "memory",
                f"TCP memory for {local} ran out (net.ipv4.tcp_mem or the socket's tcp_rmem share): the "
                f"segment from {remote} was dropped",
                "socket_memory",
            ),
            "TCP_ZEROWINDOW": (
                "zero_window",
                f"data from {remote} arrived while {local} advertised a zero window: {who} is not reading",
                "zero_window",
            ),
        }
        what, text, code = texts.get(
            reason,
            (
                "out_of_order" if "OFO" in reason else "socket_drop",
                f"{reason} dropped a segment from {remote} for {local} ({who})",
                None,
            ),
        )
        checks = cause("tcp_receive_full").checks_for(port=raw.lport)
        return record(what, reason, f"{text} ({where})", "; ".join(prefix + check for check in checks), code)

    def _listener_record(
        self, raw: RawTcpEvent, when: float, netns_name: str | None, owner: Owner, reason: str
    ) -> QueueRecord:
        """A segment a listening socket dropped: its accept queue full (the SYN refused at
        tcp_conn_request, or the handshake's last ACK at tcp_v4_syn_recv_sock), or another listen drop."""
        who = owner_text(owner)
        local = endpoint_text(raw.laddr, raw.lport)
        remote = endpoint_text(raw.raddr, raw.rport)
        prefix = netns_prefix(netns_name)
        where = self.context.netns_label(raw.netns)
        somaxconn = self.somaxconn(raw.netns)
        segment = tcp_flags_text(raw.trigger.flags) if raw.trigger else "segment"
        full = raw.backlog > raw.max_backlog or reason in ("TCP_LISTEN_OVERFLOW", "SYN_ACCEPT_QUEUE_FULL")
        if full:
            overflow = cause("listen_overflow")
            limit = f"listen() backlog {raw.max_backlog}"
            if somaxconn is not None:
                limit += f", net.core.somaxconn {somaxconn}"
            if reason == "SYN_ACCEPT_QUEUE_FULL":
                lost = f"the SYN from {remote} was discarded, the client will retransmit it"
            else:
                lost = (
                    f"the handshake's last {segment} from {remote} was dropped and new SYNs are ignored, "
                    "so clients retransmit"
                )
            return QueueRecord(
                when,
                raw,
                owner,
                netns_name,
                "accept_queue_overflow",
                reason,
                f"the accept queue of {local} ({where}) is full: {raw.backlog} connections wait for "
                f"{who} to accept() ({limit}); {lost}",
                f"{prefix}{overflow.checks_for(port=raw.lport)[0]}; {overflow.remedy}",
                somaxconn,
                cause_code=overflow.code,
            )
        listen_drop = cause("listen_drop")
        return QueueRecord(
            when,
            raw,
            owner,
            netns_name,
            "listen_drop",
            reason,
            f"a {segment} from {remote} to the listener {local} ({where}, {who}) was dropped: {reason} "
            f"(accept queue {raw.backlog}/{raw.max_backlog}, SYN queue {raw.syn_queue})",
            prefix + listen_drop.checks[0],
            somaxconn,
            cause_code=listen_drop.code,
        )

    def enrich_group(self, group: RawTcpGroup) -> TcpGroupRecord | None:
        example = self.enrich(group.example, count_flows=False)
        if example is None:
            return None
        return TcpGroupRecord(
            group.kind, group.count, group.sum1, group.sum2, group.sum3, group.max1, example, group.segs
        )


def describe(record: TcpRecord) -> str:
    """One line in words, for text output."""
    raw = record.raw
    local, remote = endpoint_text(raw.laddr, raw.lport), endpoint_text(raw.raddr, raw.rport)
    who = owner_text(record.owner)
    if isinstance(record, LifeRecord):
        lived = "at least " if raw.born_before_trace else ""  # opened before the trace
        return (
            f"{who} {local} -> {remote} lived {lived}{duration_text(record.duration_s)}, bytes_acked "
            f"{record.bytes_acked}, bytes_received {record.bytes_received}"
        )
    if isinstance(record, StateRecord):
        spent = f" after {duration_text(record.previous_s)}" if record.previous_s is not None else ""
        error = f" with {errno_name(record.error)}" if record.error else ""
        return f"{local} -> {remote} {record.old_state} -> {record.new_state}{spent}{error}  {who}"
    if isinstance(record, RetransRecord):
        extra = f", congestion {record.congestion}" if record.congestion else ""
        segments = f" ({record.raw.segs} segments)" if record.raw.segs > 1 else ""
        return (
            f"{record.kind} retransmit{segments} {local} -> {remote} in {record.state} (#{record.flow_count} "
            "of this flow"
            f"{extra})  {who}"
        )
    if isinstance(record, ConnectRecord):
        if record.error:
            return f"{who} connect {local} -> {remote} failed after {duration_text(record.latency_s)}: " + (
                errno_text(record.error)
            )
        return f"{who} connect {local} -> {remote} in {duration_text(record.latency_s)}"
    return f"{record.what}: {record.text}\n    check: {record.check}"
