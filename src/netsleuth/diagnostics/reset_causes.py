"""Why a TCP reset happened, in plain words, with the check to run next.

A pure function of the facts the kernel gave (direction, socket state, the kernel's reset reason when it has
one, the segment that triggered the RST, the socket's queues and linger setting) plus context userspace looked
up (the firewall rule, conntrack's counters). Kernel sources for each case:
- net/ipv4/tcp_ipv4.c tcp_v4_rcv(): no socket -> tcp_v4_send_reset(NULL, skb, NO_SOCKET);
  tcp_v4_do_rcv()/tcp_rcv_state_process(): a LISTEN socket answers an ACK with RST (TCP_FLAGS);
- net/ipv4/tcp.c __tcp_close(): unread data -> RST (TCP_ABORT_ON_CLOSE, RFC 2525 2.17); SO_LINGER {1, 0}
  -> tcp_disconnect() -> RST (TCP_STATE); inet_csk_listen_stop() disconnects children nobody accepted
  (TCP_STATE);
- net/ipv4/tcp_timer.c: keepalive exhausted -> RST (TCP_KEEPALIVE_TIMEOUT); orphans out of memory
  (TCP_ABORT_ON_MEMORY); a retransmission timeout kills the socket with ETIMEDOUT and sends no RST;
- net/ipv4/netfilter/nf_reject_ipv4.c nf_send_reset(): REJECT --reject-with tcp-reset / `reject with tcp
  reset`: the RST's ACK flag says whether the rejected segment carried an ACK (RFC 9293 3.10.7.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from netsleuth.diagnostics.causes import cause
from netsleuth.diagnostics.tcp_session import Trigger
from netsleuth.packet import tcp_flags_text

__all__ = [
    "ConntrackView",
    "ResetCause",
    "ResetFacts",
    "classify_abort",
    "classify_reset",
    "duration_text",
    "netns_prefix",
]

_SYN = 0x02
_ACK = 0x10
_OUT_OF_WINDOW = {
    "TCP_INVALID_ACK_SEQUENCE": "it acknowledges data this side never sent",
    "TCP_ACK_UNSENT_DATA": "it acknowledges data this side never sent",
    "TCP_OLD_ACK": "its ACK is older than what was already acknowledged",
    "TCP_TOO_OLD_ACK": "its ACK is far older than what was already acknowledged",
    "TCP_RFC7323_PAWS": "its timestamp is older than the connection's (PAWS, RFC 7323)",
}
_ETIMEDOUT = 110


@dataclass(frozen=True)
class ResetCause:
    """The cause of one reset or abort: its catalogue code (netsleuth.diagnostics.causes), the sentence with
    this event's facts, and the check to run next."""

    code: str
    text: str
    check: str

    def __post_init__(self) -> None:
        cause(self.code)  # every code a record carries is in the catalogue

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "text": self.text, "check": self.check}


@dataclass(frozen=True)
class ConntrackView:
    """conntrack in one namespace: loaded or not, the `invalid` counter (/proc/net/stat/nf_conntrack, summed
    over CPUs), its growth since the trace started, and nf_conntrack_tcp_be_liberal."""

    loaded: bool
    invalid: int | None = None
    invalid_delta: int | None = None
    be_liberal: int | None = None

    def text(self) -> str:
        if not self.loaded:
            return "conntrack is not loaded there"
        delta = f" (+{self.invalid_delta} during this trace)" if self.invalid_delta is not None else ""
        return f"conntrack invalid={self.invalid}{delta}, nf_conntrack_tcp_be_liberal={self.be_liberal}"

    def to_json(self) -> dict[str, object]:
        return {
            "loaded": self.loaded,
            "invalid": self.invalid,
            "invalid_delta": self.invalid_delta,
            "be_liberal": self.be_liberal,
        }


@dataclass(frozen=True)
class ResetFacts:
    direction: str  # "sent" | "received" | "firewall"
    state: str | None  # socket state; None: no socket
    reason: str | None  # the kernel's reset reason; None when this kernel gives none
    trigger: Trigger | None  # sent: the segment answered; None for an active reset (the socket aborted)
    local: str  # endpoint texts
    remote: str
    local_port: int
    netns: str  # "netns NAME"
    netns_name: str | None
    owner: str  # "nginx[123]" or "the kernel"
    side: str | None = None  # "client" | "server"
    age_seconds: float | None = None
    unread: int = 0
    unsent: int = 0
    linger_zero: bool = False
    accepted: bool = True  # a process held the socket (it was accepted or created by one)
    retransmits: int = 0
    rule: str | None = None  # firewall: the rule text
    rule_where: str | None = None  # firewall: "filter/INPUT"
    conntrack: ConntrackView | None = None


def netns_prefix(netns_name: str | None) -> str:
    """What to type before a command to run it in the namespace."""
    return f"ip netns exec {netns_name} " if netns_name else ""


def _segment(trigger: Trigger | None) -> str:
    return f"{tcp_flags_text(trigger.flags)} segment" if trigger else "segment"


def _a(text: str) -> str:
    """`a SYN segment`, `an ACK segment`, `an RST`: the article as the flag names are spoken."""
    return f"an {text}" if text[:1] in "AEIOR" else f"a {text}"


def duration_text(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def _age(facts: ResetFacts) -> str:
    return f", {duration_text(facts.age_seconds)} after it started" if facts.age_seconds is not None else ""


def _firewall(facts: ResetFacts) -> ResetCause:
    prefix = netns_prefix(facts.netns_name)
    entry = cause("firewall_reject")
    check = "; ".join(prefix + command for command in entry.checks)
    if facts.rule:
        where = f" ({facts.rule_where}, {facts.netns})" if facts.rule_where else f" ({facts.netns})"
        text = (
            f'firewall rule "{facts.rule}"{where} answered {facts.remote}\'s connection to {facts.local} '
            "with a TCP reset"
        )
        return ResetCause(entry.code, text, f"{entry.fixes[0]}; {check}")
    text = (
        f"a netfilter REJECT rule ({facts.netns}) answered {facts.remote}'s connection to {facts.local} with "
        "a TCP reset; the rule itself could not be identified"
    )
    return ResetCause(entry.code, text, check)


def _received(facts: ResetFacts) -> ResetCause:
    side = f", we are the {facts.side}" if facts.side else ""
    state = facts.state or "unknown state"
    peer_check = (
        "see why the peer sent it: run `netsleuth resets --host "
        f"{facts.remote.rsplit(':', 1)[0].strip('[]')}`"
        " where the peer runs"
    )
    if facts.state == "SYN_SENT":
        return ResetCause(
            "connection_refused",
            f"{facts.remote} refused the connection from {facts.local}: it answered the SYN with RST "
            f"({cause('connection_refused').summary})",
            f"{peer_check}, or `ss -ltn 'sport = :{facts.remote.rsplit(':', 1)[-1]}'` on the peer",
        )
    if facts.state in ("FIN_WAIT1", "FIN_WAIT2", "CLOSING", "LAST_ACK", "TIME_WAIT"):
        return ResetCause(
            "peer_reset_while_closing",
            f"the peer {facts.remote} reset the connection to {facts.local} after this side closed it "
            f"({state}{side}{_age(facts)}): {cause('peer_reset_while_closing').summary}",
            peer_check,
        )
    queued = ""
    if facts.unread or facts.unsent:
        queued = f"; {facts.unsent} bytes were still unacknowledged, {facts.unread} unread"
    return ResetCause(
        "peer_reset",
        f"the peer {facts.remote} reset the {state} connection to {facts.local}{side}{_age(facts)}: "
        f"{cause('peer_reset').summary}{queued}",
        peer_check,
    )


def _no_socket(facts: ResetFacts) -> ResetCause:
    prefix = netns_prefix(facts.netns_name)
    trigger = facts.trigger
    if trigger is not None and trigger.flags & _SYN and not trigger.flags & _ACK:
        entry = cause("no_listener")
        return ResetCause(
            entry.code,
            f"nothing listens on {facts.local} ({facts.netns}): the kernel refused {facts.remote}'s SYN",
            prefix + entry.checks_for(port=facts.local_port)[0],
        )
    entry = cause("no_socket")
    return ResetCause(
        entry.code,
        f"{_a(_segment(trigger))} from {facts.remote} matched no socket on {facts.local} ({facts.netns}): "
        f"{entry.summary}",
        prefix + entry.checks_for(port=facts.local_port)[0],
    )


def _non_syn_to_listener(facts: ResetFacts) -> ResetCause:
    prefix = netns_prefix(facts.netns_name)
    invalid = cause("conntrack_invalid")
    conntrack = facts.conntrack
    if conntrack is not None and not conntrack.loaded:
        evidence = (
            f"{conntrack.text()}, so NAT is not involved: the peer sent a segment for a connection this "
            "host never had or already forgot (e.g. the service restarted)"
        )
    else:
        evidence = invalid.summary
        if conntrack is not None:
            evidence += f" ({conntrack.text()})"
    return ResetCause(
        "non_syn_to_listener",
        f"{_a(_segment(facts.trigger))} from {facts.remote} reached the LISTEN socket on {facts.local} "
        f"({facts.netns}), which only accepts SYNs: no connection exists for it; {evidence}",
        f"{prefix}{invalid.checks[0]}; to test the theory, {prefix}{invalid.fixes[0]}",
    )


def _active(facts: ResetFacts) -> ResetCause | None:
    """The socket aborted on its own (tcp_send_active_reset): close, disconnect, timers."""
    reason = facts.reason
    prefix = netns_prefix(facts.netns_name)
    if reason == "TCP_ABORT_ON_CLOSE" or (reason is None and facts.unread):
        entry = cause("unread_data")
        return ResetCause(
            entry.code,
            f"{facts.owner} closed its connection {facts.local} -> {facts.remote} with {facts.unread} bytes "
            f"it had not read: {entry.summary}",
            entry.fixes[0],
        )
    if reason == "TCP_KEEPALIVE_TIMEOUT":
        entry = cause("keepalive_timeout")
        return ResetCause(
            entry.code,
            f"keepalive probes from {facts.local} to {facts.remote} went unanswered: {entry.summary}",
            prefix + entry.checks[0],
        )
    if reason == "TCP_ABORT_ON_MEMORY":
        entry = cause("memory_abort")
        retried = f" after {facts.retransmits} retransmissions" if facts.retransmits else ""
        return ResetCause(
            entry.code,
            f"the kernel aborted the orphaned connection {facts.local} -> {facts.remote} ({facts.state}, "
            f"already closed by its application){retried}: {entry.summary}",
            prefix + entry.checks[0],
        )
    if reason == "TCP_ABORT_ON_LINGER":
        return ResetCause(
            "fin_wait2_linger",
            f"{facts.owner} set TCP_LINGER2 below zero: the kernel aborts {facts.local} -> {facts.remote} "
            "instead of waiting in FIN_WAIT2",
            cause("fin_wait2_linger").fixes[0],
        )
    if facts.linger_zero and reason in (None, "TCP_STATE", "TCP_DISCONNECT_WITH_DATA", "NOT_SPECIFIED"):
        entry = cause("linger_zero")
        dropped = f" and dropped {facts.unsent} unsent bytes" if facts.unsent else ""
        return ResetCause(
            entry.code,
            f"{facts.owner} closed {facts.local} -> {facts.remote} with SO_LINGER {{on, 0}}: "
            f"{entry.summary}{dropped}",
            entry.fixes[0],
        )
    if not facts.accepted and facts.side == "server":
        return ResetCause(
            "listener_closed",
            f"the listening socket on {facts.local} was closed while the connection from {facts.remote} "
            f"waited in its accept queue: {cause('listener_closed').summary}",
            f"{prefix}ss -ltn 'sport = :{facts.local_port}' — did the service stop or restart?",
        )
    if reason in (None, "TCP_STATE", "TCP_DISCONNECT_WITH_DATA", "NOT_SPECIFIED"):
        entry = cause("abort")
        return ResetCause(
            entry.code,
            f"{facts.owner} aborted {facts.local} -> {facts.remote} ({facts.state or 'no state'}): "
            f"{entry.summary}",
            entry.checks[0],
        )
    return None


def _answered(facts: ResetFacts) -> ResetCause:
    """An RST answering a segment that reached a socket."""
    reason = facts.reason
    segment = _segment(facts.trigger)
    state = facts.state or "no socket"
    if facts.state == "LISTEN" and (facts.trigger is None or not facts.trigger.flags & _SYN):
        return _non_syn_to_listener(facts)
    if reason == "TCP_TIMEWAIT_SOCKET" or facts.state == "TIME_WAIT":
        entry = cause("time_wait")
        return ResetCause(
            entry.code,
            f"{_a(segment)} from {facts.remote} arrived for a connection {facts.local} already closed "
            f"(TIME_WAIT): {entry.summary}",
            entry.checks[0],
        )
    if reason == "INVALID_SYN":
        entry = cause("syn_in_window")
        return ResetCause(
            entry.code,
            f"a SYN from {facts.remote} arrived on the existing {state} connection {facts.local}: "
            f"{entry.summary}",
            entry.checks[0],
        )
    if reason == "TCP_ABORT_ON_DATA":
        entry = cause("data_after_close")
        return ResetCause(
            entry.code,
            f"data from {facts.remote} arrived after {facts.owner} closed {facts.local} ({state}): "
            f"{entry.summary}",
            entry.fixes[0],
        )
    detail = _OUT_OF_WINDOW.get(reason or "")
    if detail is not None or (reason is None and facts.state not in (None, "LISTEN")):
        trigger = facts.trigger
        numbers = f" (seq {trigger.seq}, ack {trigger.ack})" if trigger else ""
        because = f": {detail}" if detail else ""
        return ResetCause(
            "out_of_window",
            f"{_a(segment)} from {facts.remote}{numbers} is outside the window of the {state} connection "
            f"{facts.local}{because}",
            cause("out_of_window").checks[0],
        )
    if reason == "TCP_FLAGS":
        return ResetCause(
            "bad_flags",
            f"{_a(segment)} from {facts.remote} is not valid for the {state} socket {facts.local}",
            cause("bad_flags").checks[0],
        )
    return ResetCause(
        "unspecified",
        f"the kernel answered a {segment} from {facts.remote} on {facts.local} ({state}) with RST "
        f"(reason {reason or 'not given by this kernel'})",
        cause("unspecified").checks[0],
    )


def classify_reset(facts: ResetFacts) -> ResetCause:
    if facts.direction == "firewall":
        return _firewall(facts)
    if facts.direction == "received":
        return _received(facts)
    if facts.reason == "NO_SOCKET" or (facts.state is None and facts.trigger is not None):
        return _no_socket(facts)
    if facts.trigger is None:
        active = _active(facts)
        if active is not None:
            return active
    return _answered(facts)


def classify_abort(
    errno_number: int, state: str | None, local: str, remote: str, retransmits: int, side: str | None
) -> ResetCause:
    """A connection the kernel killed without any RST (sock:inet_sk_error_report)."""
    if errno_number == _ETIMEDOUT and state != "SYN_SENT":
        return ResetCause(
            "retransmit_timeout",
            f"the kernel gave up on {local} -> {remote} after {retransmits} unanswered retransmissions "
            f"(ETIMEDOUT): {cause('retransmit_timeout').summary}",
            f"look for drops on the path (`netsleuth drops --host {remote.rsplit(':', 1)[0].strip('[]')}`) "
            "and `ss -ti` retransmit counters; net.ipv4.tcp_retries2 sets how long the kernel tries",
        )
    if errno_number == _ETIMEDOUT:
        entry = cause("connect_timeout")
        return ResetCause(
            entry.code,
            f"SYNs from {local} to {remote} went unanswered until the kernel gave up (ETIMEDOUT)",
            f"`netsleuth conn --dst {remote}` shows where the SYNs died; {entry.checks[0]}",
        )
    import os

    role = f" ({side})" if side else ""
    return ResetCause(
        "socket_error",
        f"the kernel reported {os.strerror(errno_number)} on {local} -> {remote}{role} in {state}",
        cause("socket_error").checks[0],
    )
