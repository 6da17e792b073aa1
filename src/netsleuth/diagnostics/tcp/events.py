"""`tcp life | states | retrans | connlat | queues`: the tcp object's non-reset kinds named as records.

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
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET

from netsleuth._generated.tcp_abi import (
    TCP_REASON_SYN_ACCEPT_QUEUE_FULL,
    EventKind,
    RetransKind,
)
from netsleuth.diagnostics.attribution import Owner, owner_text, tcp_owner_facts
from netsleuth.diagnostics.causes import cause
from netsleuth.diagnostics.tcp.program import RawTcpEvent, RawTcpGroup
from netsleuth.diagnostics.tcp.records import (
    ConnectRecord,
    LifeRecord,
    QueueRecord,
    RetransRecord,
    StateRecord,
    TcpGroup,
    TcpRecord,
    endpoint_text,
    owner_fields,
)
from netsleuth.diagnostics.tcp.reset_causes import netns_prefix
from netsleuth.diagnostics.tcp_names import errno_name
from netsleuth.doctor.procfs import parse_mib
from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.context import KernelContext
from netsleuth.kernel.netns_exec import read_file_in_netns
from netsleuth.kernel.reasons import DropReasons
from netsleuth.packet import tcp_flags_text
from netsleuth.spec.parts import pod_ref
from netsleuth.spec.records import WallTime

__all__ = [
    "NETSTAT_COUNTERS",
    "SUBCOMMAND_KINDS",
    "NetstatReader",
    "TcpEventEnricher",
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

    def _common(self, raw: RawTcpEvent, owner: Owner) -> dict[str, Any]:
        """The keys every record of the family has: time, endpoints, owner, namespace and pod."""
        context = self.context
        return {
            **owner_fields(owner),
            "time": WallTime(context.wall_time(raw.monotonic_ns)),
            "family": raw.family,
            "saddr": raw.laddr,
            "sport": raw.lport,
            "daddr": raw.raddr,
            "dport": raw.rport,
            "netns": raw.netns,
            "netns_name": context.netns_name(raw.netns),
            "pod": pod_ref(context.pod(raw.netns)),
        }

    def enrich(self, raw: RawTcpEvent, count_flows: bool = True) -> TcpRecord | None:
        context = self.context
        names = context.names
        if raw.kind == EventKind.LIFE:
            return LifeRecord(
                **self._common(raw, context.owner(tcp_owner_facts(raw))),
                side=raw.side,
                duration_s=raw.value1 / 1e9,
                bytes_acked=raw.value2,
                bytes_received=raw.value3,
                last_state=names.state(raw.old_state),
                # Opened before the trace: duration_s counts from the trace's start, a lower bound.
                born_before_trace=True if raw.born_before_trace else UNSET,
            )
        if raw.kind == EventKind.STATE:
            owner = context.owner(
                tcp_owner_facts(raw, task_acts_on_socket=names.state(raw.old_state) == "CLOSE")
            )
            return StateRecord(
                **self._common(raw, owner),
                old_state=names.state(raw.old_state),
                new_state=names.state(raw.state),
                previous_state_s=raw.value1 / 1e9 if raw.value1 else None,
                errno=errno_name(raw.reason) if raw.reason else None,
                side=raw.side,
            )
        if raw.kind == EventKind.CONNECT:
            return ConnectRecord(
                **self._common(raw, context.owner(tcp_owner_facts(raw))),
                latency_ms=raw.value1 / 1e9 * 1e3,
                ok=raw.reason == 0,
                errno=errno_name(raw.reason) if raw.reason else None,
            )
        if raw.kind in (EventKind.RETRANS, EventKind.SYNACK_RETRANS):
            return self._retrans(raw, count_flows)
        if raw.kind in (EventKind.SOCK_DROP, EventKind.RCVQ_FULL, EventKind.MEM_LIMIT):
            return self._queue_record(raw)
        return None

    def _retrans(self, raw: RawTcpEvent, count_flows: bool) -> RetransRecord:
        names = self.context.names
        flow = (raw.netns, raw.laddr, raw.lport, raw.raddr, raw.rport)
        if count_flows:
            self._flow_counts[flow] += 1
        common = self._common(raw, self.context.owner(tcp_owner_facts(raw)))
        state, count = names.state(raw.state), self._flow_counts[flow]
        # One record is one retransmitted skb; TCP sends GSO skbs, so it can be several segments.
        if raw.kind == EventKind.SYNACK_RETRANS:
            return RetransRecord(
                **common,
                kind="synack",
                state=state,
                flow_count=count,
                congestion_state=None,
                segments=raw.segs,
                synack_retransmits=raw.value1,
            )
        return RetransRecord(
            **common,
            kind=RETRANS_KIND_NAMES[raw.retrans_kind],
            state=state,
            flow_count=count,
            congestion_state=names.ca_state(raw.ca_state),
            segments=raw.segs,
            total_retrans=raw.value1,
            srtt_us=raw.value2,
            cwnd=raw.value3,
            unanswered=raw.retransmits,
            error=raw.reason or None,
        )

    def _queue_record(self, raw: RawTcpEvent) -> QueueRecord:
        context = self.context
        owner = context.owner(tcp_owner_facts(raw))
        who = owner_text(owner)
        local = endpoint_text(raw.laddr, raw.lport)
        remote = endpoint_text(raw.raddr, raw.rport)
        prefix = netns_prefix(context.netns_name(raw.netns))
        where = context.netns_label(raw.netns)
        state = context.names.state(raw.state)

        def record(
            what: str, reason: str | None, text: str, check: str, code: str | None, **listener: Any
        ) -> QueueRecord:
            return QueueRecord(
                **self._common(raw, owner),
                what=what,
                reason=reason,
                state=state,
                text=text,
                check=check,
                cause_code=code,
                queued=raw.backlog,
                limit=raw.max_backlog,
                **listener,
                tcp_flags=tcp_flags_text(raw.trigger.flags) if raw.trigger is not None else UNSET,
            )

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
        if state == "LISTEN":
            # A listener's drop: its listen() backlog, somaxconn and SYN queue go with it.
            somaxconn = self.somaxconn(raw.netns)
            listener_what, listener_text, listener_check, listener_code = self._listener_words(
                raw, who, reason, somaxconn
            )
            return record(
                listener_what,
                reason,
                listener_text,
                listener_check,
                listener_code,
                backlog=raw.max_backlog,
                somaxconn=somaxconn,
                syn_queue=raw.syn_queue,
            )
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

    def _listener_words(
        self, raw: RawTcpEvent, who: str, reason: str, somaxconn: int | None
    ) -> tuple[str, str, str, str]:
        """(what, text, check, cause code) of a segment a listening socket dropped: its accept queue full
        (the SYN refused at tcp_conn_request, or the handshake's last ACK at tcp_v4_syn_recv_sock), or
        another listen drop."""
        local = endpoint_text(raw.laddr, raw.lport)
        remote = endpoint_text(raw.raddr, raw.rport)
        prefix = netns_prefix(self.context.netns_name(raw.netns))
        where = self.context.netns_label(raw.netns)
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
            return (
                "accept_queue_overflow",
                f"the accept queue of {local} ({where}) is full: {raw.backlog} connections wait for "
                f"{who} to accept() ({limit}); {lost}",
                f"{prefix}{overflow.checks_for(port=raw.lport)[0]}; {overflow.remedy}",
                overflow.code,
            )
        listen_drop = cause("listen_drop")
        return (
            "listen_drop",
            f"a {segment} from {remote} to the listener {local} ({where}, {who}) was dropped: {reason} "
            f"(accept queue {raw.backlog}/{raw.max_backlog}, SYN queue {raw.syn_queue})",
            prefix + listen_drop.checks[0],
            listen_drop.code,
        )

    def enrich_group(self, group: RawTcpGroup) -> TcpGroup | None:
        """The group's record, with what the kernel summed per kind (tcp.bpf.c): life sums durations (ns)
        and bytes acked/received, connect sums latencies (ns), state the time spent in the previous state
        (ns); retransmits count segments beside skbs."""
        example = self.enrich(group.example, count_flows=False)
        if example is None:
            return None
        count = group.count
        if group.kind == EventKind.LIFE:
            return TcpGroup(
                count=count,
                example=example,
                mean_duration_s=group.sum1 / count / 1e9,
                max_duration_s=group.max1 / 1e9,
                bytes_acked=group.sum2,
                bytes_received=group.sum3,
            )
        if group.kind == EventKind.CONNECT:
            return TcpGroup(
                count=count,
                example=example,
                mean_latency_ms=group.sum1 / count / 1e6,
                max_latency_ms=group.max1 / 1e6,
            )
        if group.kind == EventKind.STATE:
            return TcpGroup(count=count, example=example, mean_previous_state_s=group.sum1 / count / 1e9)
        if group.kind in (EventKind.RETRANS, EventKind.SYNACK_RETRANS):
            return TcpGroup(count=count, example=example, segments=group.segs)
        return TcpGroup(count=count, example=example)
