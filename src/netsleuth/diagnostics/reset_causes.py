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

from netsleuth.diagnostics.tcp_session import Trigger
from netsleuth.packet import tcp_flags_text

__all__ = [
    "Cause",
    "ConntrackView",
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
class Cause:
    code: str
    text: str
    check: str

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


def _firewall(facts: ResetFacts) -> Cause:
    prefix = netns_prefix(facts.netns_name)
    check = (
        f"{prefix}iptables-save -c | grep -n -- '--reject-with tcp-reset'; "
        f"{prefix}nft -a list ruleset | grep 'reject with tcp reset'"
    )
    if facts.rule:
        where = f" ({facts.rule_where}, {facts.netns})" if facts.rule_where else f" ({facts.netns})"
        text = (
            f'firewall rule "{facts.rule}"{where} answered {facts.remote}\'s connection to {facts.local} '
            + ("with a TCP reset")
        )
        return Cause("firewall_reject", text, f"remove or narrow the rule; {check}")
    text = (
        f"a netfilter REJECT rule ({facts.netns}) answered {facts.remote}'s connection to {facts.local} with "
        "a TCP reset; the rule itself could not be identified"
    )
    return Cause("firewall_reject", text, check)


def _received(facts: ResetFacts) -> Cause:
    side = f", we are the {facts.side}" if facts.side else ""
    state = facts.state or "unknown state"
    peer_check = (
        "see why the peer sent it: run `netsleuth resets --host "
        f"{facts.remote.rsplit(':', 1)[0].strip('[]')}`"
        " where the peer runs"
    )
    if facts.state == "SYN_SENT":
        return Cause(
            "connection_refused",
            f"{facts.remote} refused the connection from {facts.local}: it answered the SYN with RST "
            "(nothing "
            "listens on that port there, or a firewall rejects it with tcp-reset)",
            f"{peer_check}, or `ss -ltn 'sport = :{facts.remote.rsplit(':', 1)[-1]}'` on the peer",
        )
    if facts.state in ("FIN_WAIT1", "FIN_WAIT2", "CLOSING", "LAST_ACK", "TIME_WAIT"):
        return Cause(
            "peer_reset_while_closing",
            f"the peer {facts.remote} reset the connection to {facts.local} after this side closed it "
            f"({state}{side}{_age(facts)}): the peer had unread data or aborted instead of finishing the "
            "close",
            peer_check,
        )
    queued = ""
    if facts.unread or facts.unsent:
        queued = f"; {facts.unsent} bytes were still unacknowledged, {facts.unread} unread"
    return Cause(
        "peer_reset",
        f"the peer {facts.remote} reset the {state} connection to {facts.local}{side}{_age(facts)}: it "
        "closed "
        f"with unread data, aborted (SO_LINGER 0), crashed, or a middlebox dropped the flow{queued}",
        peer_check,
    )


def _no_socket(facts: ResetFacts) -> Cause:
    prefix = netns_prefix(facts.netns_name)
    trigger = facts.trigger
    if trigger is not None and trigger.flags & _SYN and not trigger.flags & _ACK:
        return Cause(
            "no_listener",
            f"nothing listens on {facts.local} ({facts.netns}): the kernel refused {facts.remote}'s SYN",
            f"{prefix}ss -ltnp 'sport = :{facts.local_port}' — is the service running and bound to this "
            "address and port?",
        )
    return Cause(
        "no_socket",
        f"{_a(_segment(trigger))} from {facts.remote} matched no socket on {facts.local} ({facts.netns}): "
        "the "
        "connection it belongs to is gone here (closed, timed out, the service restarted) or never existed "
        "here (NAT or routing sent it to the wrong host)",
        f"{prefix}ss -tan '( sport = :{facts.local_port} )'; compare with the peer's connection table",
    )


def _non_syn_to_listener(facts: ResetFacts) -> Cause:
    prefix = netns_prefix(facts.netns_name)
    conntrack = facts.conntrack
    if conntrack is not None and not conntrack.loaded:
        evidence = (
            f"{conntrack.text()}, so NAT is not involved: the peer sent a segment for a connection this "
            "host never had or already forgot (e.g. the service restarted)"
        )
    else:
        evidence = (
            "typical when conntrack marked the packet INVALID so NAT/DNAT was skipped and it reached this "
            "listener instead of its real destination"
        )
        if conntrack is not None:
            evidence += f" ({conntrack.text()})"
    return Cause(
        "non_syn_to_listener",
        f"{_a(_segment(facts.trigger))} from {facts.remote} reached the LISTEN socket on {facts.local} "
        f"({facts.netns}), which only accepts SYNs: no connection exists for it; {evidence}",
        f"{prefix}cat /proc/net/stat/nf_conntrack (invalid column); to test the theory, "
        f"{prefix}sysctl -w net.netfilter.nf_conntrack_tcp_be_liberal=1",
    )


def _active(facts: ResetFacts) -> Cause | None:
    """The socket aborted on its own (tcp_send_active_reset): close, disconnect, timers."""
    reason = facts.reason
    prefix = netns_prefix(facts.netns_name)
    if reason == "TCP_ABORT_ON_CLOSE" or (reason is None and facts.unread):
        return Cause(
            "unread_data",
            f"{facts.owner} closed its connection {facts.local} -> {facts.remote} with {facts.unread} bytes "
            "it had not read: Linux then resets instead of closing gracefully (RFC 2525 2.17)",
            "make the application read everything the peer sent before close(), or shutdown(SHUT_WR) and "
            "drain until EOF",
        )
    if reason == "TCP_KEEPALIVE_TIMEOUT":
        return Cause(
            "keepalive_timeout",
            f"keepalive probes from {facts.local} to {facts.remote} went unanswered: the peer or the path is "
            "gone, so the kernel reset the connection",
            f"{prefix}ss -tno state established; check the path to the peer and net.ipv4.tcp_keepalive_*",
        )
    if reason == "TCP_ABORT_ON_MEMORY":
        retried = f" after {facts.retransmits} retransmissions" if facts.retransmits else ""
        return Cause(
            "memory_abort",
            f"the kernel aborted the orphaned connection {facts.local} -> {facts.remote} ({facts.state}, "
            f"already closed by its application){retried}: too many orphans or TCP memory pressure",
            f"{prefix}cat /proc/net/sockstat (orphan, mem) against net.ipv4.tcp_max_orphans and tcp_mem",
        )
    if reason == "TCP_ABORT_ON_LINGER":
        return Cause(
            "fin_wait2_linger",
            f"{facts.owner} set TCP_LINGER2 below zero: the kernel aborts {facts.local} -> {facts.remote} "
            "instead of waiting in FIN_WAIT2",
            "look for setsockopt(TCP_LINGER2) in the application",
        )
    if facts.linger_zero and reason in (None, "TCP_STATE", "TCP_DISCONNECT_WITH_DATA", "NOT_SPECIFIED"):
        dropped = f" and dropped {facts.unsent} unsent bytes" if facts.unsent else ""
        return Cause(
            "linger_zero",
            f"{facts.owner} closed {facts.local} -> {facts.remote} with SO_LINGER {{on, 0}}: an abortive "
            f"close sent RST{dropped}",
            "strace -f -e trace=setsockopt -p PID | grep SO_LINGER: remove l_linger=0 unless the abort is "
            "intended",
        )
    if not facts.accepted and facts.side == "server":
        return Cause(
            "listener_closed",
            f"the listening socket on {facts.local} was closed while the connection from {facts.remote} "
            "waited "
            "in its accept queue: the kernel resets connections nobody accepted",
            f"{prefix}ss -ltn 'sport = :{facts.local_port}' — did the service stop or restart?",
        )
    if reason in (None, "TCP_STATE", "TCP_DISCONNECT_WITH_DATA", "NOT_SPECIFIED"):
        return Cause(
            "abort",
            f"{facts.owner} aborted {facts.local} -> {facts.remote} ({facts.state or 'no state'}): a "
            "disconnect "
            "(connect(AF_UNSPEC)) or a socket destroyed from outside (`ss -K`, SOCK_DESTROY)",
            "strace the application for connect(AF_UNSPEC), or look for tools killing sockets",
        )
    return None


def _answered(facts: ResetFacts) -> Cause:
    """An RST answering a segment that reached a socket."""
    reason = facts.reason
    segment = _segment(facts.trigger)
    state = facts.state or "no socket"
    if facts.state == "LISTEN" and (facts.trigger is None or not facts.trigger.flags & _SYN):
        return _non_syn_to_listener(facts)
    if reason == "TCP_TIMEWAIT_SOCKET" or facts.state == "TIME_WAIT":
        return Cause(
            "time_wait",
            f"{_a(segment)} from {facts.remote} arrived for a connection {facts.local} already closed "
            "(TIME_WAIT): a late retransmission, or the peer reused the ports too soon",
            "look at how the peer closes; net.ipv4.tcp_tw_reuse on the side that connects",
        )
    if reason == "INVALID_SYN":
        return Cause(
            "syn_in_window",
            f"a SYN from {facts.remote} arrived on the existing {state} connection {facts.local}: the peer "
            "restarted the connection with the same ports (it rebooted, or its NAT reused the port)",
            "compare the peer's connection table; check NAT port reuse between the two",
        )
    if reason == "TCP_ABORT_ON_DATA":
        return Cause(
            "data_after_close",
            f"data from {facts.remote} arrived after {facts.owner} closed {facts.local} ({state}): Linux "
            "resets "
            "instead of accepting data nobody will read",
            "the application closed before the peer finished sending: read until EOF, or shutdown(SHUT_WR)",
        )
    detail = _OUT_OF_WINDOW.get(reason or "")
    if detail is not None or (reason is None and facts.state not in (None, "LISTEN")):
        trigger = facts.trigger
        numbers = f" (seq {trigger.seq}, ack {trigger.ack})" if trigger else ""
        because = f": {detail}" if detail else ""
        return Cause(
            "out_of_window",
            f"{_a(segment)} from {facts.remote}{numbers} is outside the window of the {state} connection "
            f"{facts.local}{because}",
            "a stale segment after a port reuse, a middlebox rewriting sequence numbers, or NAT mapping two "
            "connections onto one: capture both sides with tcpdump and compare sequence numbers",
        )
    if reason == "TCP_FLAGS":
        return Cause(
            "bad_flags",
            f"{_a(segment)} from {facts.remote} is not valid for the {state} socket {facts.local}",
            "capture the exchange with tcpdump to see which side breaks the protocol",
        )
    return Cause(
        "unspecified",
        f"the kernel answered a {segment} from {facts.remote} on {facts.local} ({state}) with RST "
        f"(reason {reason or 'not given by this kernel'})",
        "capture the exchange with tcpdump; run with --stack to see where the kernel decided",
    )


def classify_reset(facts: ResetFacts) -> Cause:
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
) -> Cause:
    """A connection the kernel killed without any RST (sock:inet_sk_error_report)."""
    if errno_number == _ETIMEDOUT and state != "SYN_SENT":
        return Cause(
            "retransmit_timeout",
            f"the kernel gave up on {local} -> {remote} after {retransmits} unanswered retransmissions "
            "(ETIMEDOUT): no RST was sent, so the peer may still think the connection is open",
            f"look for drops on the path (`netsleuth drops --host {remote.rsplit(':', 1)[0].strip('[]')}`) "
            "and `ss -ti` retransmit counters; net.ipv4.tcp_retries2 sets how long the kernel tries",
        )
    if errno_number == _ETIMEDOUT:
        return Cause(
            "connect_timeout",
            f"SYNs from {local} to {remote} went unanswered until the kernel gave up (ETIMEDOUT)",
            f"`netsleuth conn --dst {remote}` shows where the SYNs died; net.ipv4.tcp_syn_retries",
        )
    import os

    role = f" ({side})" if side else ""
    return Cause(
        "socket_error",
        f"the kernel reported {os.strerror(errno_number)} on {local} -> {remote}{role} in {state}",
        "the error came from an ICMP message or the local stack: run `netsleuth drops` for the flow",
    )
