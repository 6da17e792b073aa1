"""`resets`: every TCP RST sent (tcp:tcp_send_reset, and REJECT rules' via net:net_dev_queue) or received
(tcp:tcp_receive_reset), plus connections the kernel killed without one (sock:inet_sk_error_report), each
with a plain-words cause (netsleuth.diagnostics.tcp.reset_causes).

`ResetEnricher` turns `RawTcpEvent`s of the reset kinds into `ResetRecord`s: names from the running kernel,
the owning process, the namespace, the firewall rule of a REJECT, conntrack's counters for a non-SYN segment
that reached a listener, and the peer's cause when the peer's RST was seen in this trace too.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET

from netsleuth._generated.tcp_abi import EventKind, SockFlag
from netsleuth.diagnostics.attribution import owner_text, tcp_owner_facts
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.diagnostics.tcp.program import (
    RESET_KINDS,
    RawTcpEvent,
    RawTcpGroup,
    TcpSessionConfig,
    Trigger,
)
from netsleuth.diagnostics.tcp.records import (
    AbortRecord,
    ConntrackView,
    ResetGroup,
    ResetRecord,
    TriggerPart,
    endpoint_text,
    owner_fields,
)
from netsleuth.diagnostics.tcp.reset_causes import ResetFacts, classify_abort, classify_reset
from netsleuth.diagnostics.tcp_names import errno_name
from netsleuth.doctor.procfs import parse_conntrack_stat
from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.context import KernelContext
from netsleuth.kernel.netns_exec import read_file_in_netns
from netsleuth.packet import PacketTuple, tcp_flags_text
from netsleuth.spec.parts import pod_ref
from netsleuth.spec.records import WallTime

__all__ = [
    "RESET_KINDS",
    "ConntrackReader",
    "ResetEnricher",
    "resets_session_config",
]

_DIRECTION = {
    EventKind.RESET_SENT: "sent",
    EventKind.RESET_RECEIVED: "received",
    EventKind.RESET_FIREWALL: "sent",
}
# Errors that come with a received RST (reported as such) rather than a silent abort.
_RST_ERRNOS = frozenset({111, 104, 32})  # ECONNREFUSED, ECONNRESET, EPIPE
_SENT_KINDS = frozenset({EventKind.RESET_SENT, EventKind.RESET_FIREWALL})
_ACK = 0x10
_SYN = 0x02
_PEER_MEMORY = 256
_CONNTRACK_MAX_AGE = 1.0


def resets_session_config(
    packet_filter: PacketFilter, summary_only: bool, stack: bool, sample_every: int
) -> TcpSessionConfig:
    kinds = RESET_KINDS | {EventKind.ERROR}
    return TcpSessionConfig(
        packet_filter=packet_filter,
        emit=frozenset() if summary_only else kinds,
        group=kinds,
        stack=frozenset(RESET_KINDS) if stack else frozenset(),
        sample_every=sample_every,
    )


@dataclass
class ConntrackReader:
    """conntrack counters of a namespace, read from inside it; the first reading is the baseline."""

    max_age: float = _CONNTRACK_MAX_AGE
    _cache: dict[str | None, tuple[float, ConntrackView]] = field(default_factory=dict)
    _baseline: dict[str | None, int] = field(default_factory=dict)

    def _read(self, netns_path: str | None) -> ConntrackView:
        try:
            stat = read_file_in_netns("/proc/self/net/stat/nf_conntrack", netns_path)
            liberal = read_file_in_netns("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal", netns_path)
        except EnvironmentProblem:
            return ConntrackView(loaded=False)
        if stat is None:
            return ConntrackView(loaded=False)
        invalid = parse_conntrack_stat(stat).get("invalid")
        delta = None
        if invalid is not None:
            baseline = self._baseline.setdefault(netns_path, invalid)
            delta = invalid - baseline
        be_liberal = int(liberal.strip()) if liberal and liberal.strip().isdigit() else None
        return ConntrackView(True, invalid, delta, be_liberal)

    def view(self, netns_path: str | None) -> ConntrackView:
        now = time.monotonic()
        cached = self._cache.get(netns_path)
        if cached is None or now - cached[0] > self.max_age:
            cached = (now, self._read(netns_path))
            self._cache[netns_path] = cached
        return cached[1]


def _flow_key(saddr: str | None, sport: int, daddr: str | None, dport: int) -> tuple[object, ...]:
    return (saddr, sport, daddr, dport)


class ResetEnricher:
    """Turns raw reset/abort events into records. One per run; pass the run's shared `context` (without
    one it makes its own and closes it)."""

    def __init__(
        self,
        context: KernelContext | None = None,
        *,
        want_stack: bool = False,
        explain_firewall: bool = True,
        conntrack: ConntrackReader | None = None,
    ) -> None:
        self.context = context or KernelContext()
        self._own_context = context is None
        self.want_stack = want_stack
        self.explain_firewall = explain_firewall
        self.conntrack = conntrack or ConntrackReader()
        # Causes of RSTs sent in this trace, by the RST's packet, for the receiving side's record.
        self._sent: OrderedDict[tuple[object, ...], str] = OrderedDict()

    @property
    def firewall_problems(self) -> list[str]:
        return list(self.context.firewall_problems.values())

    def prepare(self, netns: int | None) -> None:
        """Baselines now: conntrack's invalid counter and the firewall counters of the traced namespace."""
        self.context.prepare(netns)
        self.conntrack.view(self.context.netns_path(netns))
        if self.explain_firewall and netns:
            self.context.matcher(netns)

    # -- records ---------------------------------------------------------------------------------------
    def enrich(self, raw: RawTcpEvent) -> ResetRecord | AbortRecord | None:
        """None for events that are not a reset or a silent abort (an error that came with an RST)."""
        if raw.kind == EventKind.ERROR:
            return self._abort(raw)
        if raw.kind in RESET_KINDS:
            return self._reset(raw)
        return None

    def enrich_pairs(
        self, raws: list[RawTcpEvent]
    ) -> list[tuple[RawTcpEvent, ResetRecord | AbortRecord | None]]:
        """A batch in time order, each event with its record (None: not a reset or silent abort). Sent RSTs
        are enriched first: an abortive close fires tcp_send_reset after transmitting (net/ipv4/
        tcp_output.c tcp_send_active_reset), so across veth the peer's receive event can come first, and its
        record should still name the cause."""
        ordered = sorted(raws, key=lambda raw: raw.monotonic_ns)
        records: dict[int, ResetRecord | AbortRecord | None] = {}
        for index, raw in sorted(enumerate(ordered), key=lambda item: item[1].kind not in _SENT_KINDS):
            records[index] = self.enrich(raw)
        return [(raw, records[index]) for index, raw in enumerate(ordered)]

    def enrich_many(self, raws: list[RawTcpEvent]) -> list[ResetRecord | AbortRecord]:
        return [record for _, record in self.enrich_pairs(raws) if record is not None]

    def _abort(self, raw: RawTcpEvent) -> AbortRecord | None:
        if raw.reason in _RST_ERRNOS:
            return None
        context = self.context
        local = endpoint_text(raw.laddr, raw.lport)
        remote = endpoint_text(raw.raddr, raw.rport)
        # sk_error_report() runs after tcp_done(): the state that failed is the one before CLOSE.
        closed = raw.state is not None and context.names.state(raw.state) == "CLOSE"
        state = context.names.state(raw.old_state if closed and raw.old_state is not None else raw.state)
        cause = classify_abort(raw.reason, state, local, remote, raw.retransmits, raw.side)
        return AbortRecord(
            **owner_fields(context.owner(tcp_owner_facts(raw))),
            time=WallTime(context.wall_time(raw.monotonic_ns)),
            errno=errno_name(raw.reason),
            state=state,
            cause=cause.text,
            cause_code=cause.code,
            check=cause.check,
            family=raw.family,
            saddr=raw.laddr,
            sport=raw.lport,
            daddr=raw.raddr,
            dport=raw.rport,
            local=local,
            remote=remote,
            retransmits=raw.retransmits,
            netns=raw.netns,
            netns_name=context.netns_name(raw.netns),
            side=raw.side,
            pod=pod_ref(context.pod(raw.netns)),
        )

    def _firewall_rule(
        self, raw: RawTcpEvent, trigger_flags: int
    ) -> tuple[dict[str, Any] | None, str | None, str | None]:
        from netsleuth.firewall import hook_from_stack

        hook = hook_from_stack(self.context.function_names(raw.frames), raw.family)
        netfilter: dict[str, Any] = {"hook": hook, "table": None, "chain": None, "rule": None}
        if hook is None or not self.explain_firewall:
            return netfilter, None, None
        # The rejected segment went the other way: from the RST's destination to its source.
        rejected = PacketTuple(
            raw.family, 6, raw.raddr, raw.laddr, raw.rport, raw.lport, trigger_flags, length=0
        )
        verdict = self.context.firewall_verdict(raw.netns, rejected, hook, raw.ifname)
        if verdict is None:
            return netfilter, None, None
        netfilter.update(verdict.to_json())
        return netfilter, verdict.rule, f"{verdict.table}/{verdict.chain}"

    def _reset(self, raw: RawTcpEvent) -> ResetRecord:
        context = self.context
        names = context.names
        direction = _DIRECTION[raw.kind]
        firewall = raw.kind == EventKind.RESET_FIREWALL
        local = endpoint_text(raw.laddr, raw.lport)
        remote = endpoint_text(raw.raddr, raw.rport)
        state = names.state(raw.state)
        reason = names.reset_reason(raw.reason) if raw.kind == EventKind.RESET_SENT else None
        trigger = raw.trigger
        inferred = False
        netfilter = rule = rule_where = None
        if firewall and raw.trigger is not None:
            # nf_reject_ip_tcphdr_put(): an RST with ACK answers a segment without ACK (a SYN, in practice),
            # with ack = its seq + 1; one without ACK carries the rejected segment's ack as its seq.
            rst = raw.trigger
            if rst.flags & _ACK:
                trigger = Trigger(_SYN, (rst.ack - 1) & 0xFFFFFFFF, 0, 0)
            else:
                trigger = Trigger(_ACK, 0, rst.seq, 0)
            inferred = True
            netfilter, rule, rule_where = self._firewall_rule(raw, trigger.flags)
        conntrack = None
        if raw.kind == EventKind.RESET_SENT and state == "LISTEN" and not (trigger and trigger.flags & _SYN):
            conntrack = self.conntrack.view(context.netns_path(raw.netns))
        # Aborts from close()/disconnect run in the closing task's syscall: that task owns the socket.
        owner = context.owner(
            tcp_owner_facts(raw, task_acts_on_socket=raw.kind == EventKind.RESET_SENT and trigger is None)
        )
        netns_name = context.netns_name(raw.netns)
        # A socket older than the trace has the trace's start as born_ns: its age is unknown.
        age = (raw.monotonic_ns - raw.born_ns) / 1e9 if raw.born_ns and not raw.born_before_trace else None
        facts = ResetFacts(
            direction="firewall" if firewall else direction,
            state=state,
            reason=reason,
            trigger=trigger,
            local=local,
            remote=remote,
            local_port=raw.lport,
            netns=context.netns_label(raw.netns),
            netns_name=netns_name,
            owner=owner_text(owner),
            side=raw.side,
            age_seconds=age,
            unread=raw.unread,
            unsent=raw.unsent,
            linger_zero=bool(raw.sock_flags & SockFlag.LINGER_ZERO),
            accepted=bool(raw.sock_flags & SockFlag.HAS_FILE) or not raw.sock_flags & SockFlag.FULL,
            retransmits=raw.retransmits,
            rule=rule,
            rule_where=rule_where,
            conntrack=conntrack,
        )
        cause = classify_reset(facts)
        sent = direction == "sent"
        saddr, sport, daddr, dport = (
            (raw.laddr, raw.lport, raw.raddr, raw.rport)
            if sent
            else (raw.raddr, raw.rport, raw.laddr, raw.lport)
        )
        peer_cause = None
        key = _flow_key(saddr, sport, daddr, dport)
        if sent:
            self._sent[key] = cause.text
            while len(self._sent) > _PEER_MEMORY:
                self._sent.popitem(last=False)
        else:
            peer_cause = self._sent.get(key)
        record_trigger = None
        if trigger is not None:
            record_trigger = TriggerPart(
                flags=tcp_flags_text(trigger.flags),
                seq=trigger.seq,
                ack=trigger.ack,
                len=trigger.length,
                inferred=True if inferred else UNSET,
            )
        return ResetRecord(
            **owner_fields(owner),
            time=WallTime(context.wall_time(raw.monotonic_ns)),
            direction=direction,
            by_firewall=firewall,
            state=state,
            reason=reason,
            reason_code=raw.reason if reason is not None else None,
            trigger=record_trigger,
            cause=cause.text,
            cause_code=cause.code,
            check=cause.check,
            family=raw.family,
            saddr=saddr,
            sport=sport,
            daddr=daddr,
            dport=dport,
            local=local,
            remote=remote,
            netns=raw.netns,
            netns_name=netns_name,
            ifname=raw.ifname or None,
            side=raw.side,
            age_s=age,
            unread=raw.unread,
            unsent=raw.unsent,
            linger_zero=facts.linger_zero,
            netfilter=netfilter if netfilter is not None else UNSET,
            conntrack=conntrack if conntrack is not None else UNSET,
            peer_cause=peer_cause if peer_cause is not None else UNSET,
            stack=context.stack(raw.frames) if self.want_stack and raw.frames else UNSET,
            pod=pod_ref(context.pod(raw.netns)),
        )

    def enrich_group(self, group: RawTcpGroup) -> ResetGroup | None:
        example = self.enrich(group.example)
        return ResetGroup(count=group.count, example=example) if example is not None else None

    def close(self) -> None:
        if self._own_context:
            self.context.close()
