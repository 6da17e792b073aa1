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

import os
from dataclasses import dataclass

from netsleuth.diagnostics.causes import cause
from netsleuth.diagnostics.tcp.program import Trigger
from netsleuth.diagnostics.tcp.records import ConntrackView
from netsleuth.packet import tcp_flags_text

__all__ = [
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


def _explained(code: str, facts: ResetFacts, **case: object) -> ResetCause:
    """The catalogue's sentence and check for `code`, filled with this reset's facts."""
    entry = cause(code)
    words: dict[str, object] = {
        "local": facts.local,
        "remote": facts.remote,
        "netns": facts.netns,
        "owner": facts.owner,
        "port": facts.local_port,
        "prefix": netns_prefix(facts.netns_name),
        "state": facts.state or "no socket",
        "socket_state": facts.state,
        "segment": _segment(facts.trigger),
        "a_segment": _a(_segment(facts.trigger)),
        **case,
    }
    return ResetCause(code, entry.explain(**words), entry.checks_for(**words)[0])


def _firewall(facts: ResetFacts) -> ResetCause:
    if facts.rule:
        where = f" ({facts.rule_where}, {facts.netns})" if facts.rule_where else f" ({facts.netns})"
        named = _explained(
            "firewall_reject", facts, rejecter=f'firewall rule "{facts.rule}"{where}', unidentified=""
        )
        return ResetCause(named.code, named.text, f"{cause(named.code).fixes[0]}; {named.check}")
    return _explained(
        "firewall_reject",
        facts,
        rejecter=f"a netfilter REJECT rule ({facts.netns})",
        unidentified="; the rule itself could not be identified",
    )


def _received(facts: ResetFacts) -> ResetCause:
    host, port = facts.remote.rsplit(":", 1)[0], facts.remote.rsplit(":", 1)[-1]
    case: dict[str, object] = {
        "state": facts.state or "unknown state",
        "side": f", we are the {facts.side}" if facts.side else "",
        "age": _age(facts),
        "peer_check": f"see why the peer sent it: run `netsleuth resets --host {host.strip('[]')}` where the "
        "peer runs",
        "remote_port": port,
    }
    if facts.state == "SYN_SENT":
        return _explained("connection_refused", facts, **case)
    if facts.state in ("FIN_WAIT1", "FIN_WAIT2", "CLOSING", "LAST_ACK", "TIME_WAIT"):
        return _explained("peer_reset_while_closing", facts, **case)
    queued = ""
    if facts.unread or facts.unsent:
        queued = f"; {facts.unsent} bytes were still unacknowledged, {facts.unread} unread"
    return _explained("peer_reset", facts, queued=queued, **case)


def _no_socket(facts: ResetFacts) -> ResetCause:
    trigger = facts.trigger
    if trigger is not None and trigger.flags & _SYN and not trigger.flags & _ACK:
        return _explained("no_listener", facts)
    return _explained("no_socket", facts)


def _non_syn_to_listener(facts: ResetFacts) -> ResetCause:
    conntrack = facts.conntrack
    if conntrack is not None and not conntrack.loaded:
        evidence = (
            f"{conntrack.text()}, so NAT is not involved: the peer sent a segment for a connection this "
            "host never had or already forgot (e.g. the service restarted)"
        )
    else:
        evidence = cause("conntrack_invalid").summary
        if conntrack is not None:
            evidence += f" ({conntrack.text()})"
    return _explained("non_syn_to_listener", facts, evidence=evidence)


_NO_REASON = (None, "TCP_STATE", "TCP_DISCONNECT_WITH_DATA", "NOT_SPECIFIED")


def _active(facts: ResetFacts) -> ResetCause | None:
    """The socket aborted on its own (tcp_send_active_reset): close, disconnect, timers."""
    reason = facts.reason
    if reason == "TCP_ABORT_ON_CLOSE" or (reason is None and facts.unread):
        return _explained("unread_data", facts, unread=facts.unread)
    if reason == "TCP_KEEPALIVE_TIMEOUT":
        return _explained("keepalive_timeout", facts)
    if reason == "TCP_ABORT_ON_MEMORY":
        retried = f" after {facts.retransmits} retransmissions" if facts.retransmits else ""
        return _explained("memory_abort", facts, retried=retried)
    if reason == "TCP_ABORT_ON_LINGER":
        return _explained("fin_wait2_linger", facts)
    if facts.linger_zero and reason in _NO_REASON:
        dropped = f" and dropped {facts.unsent} unsent bytes" if facts.unsent else ""
        return _explained("linger_zero", facts, dropped=dropped)
    if not facts.accepted and facts.side == "server":
        return _explained("listener_closed", facts)
    if reason in _NO_REASON:
        return _explained("abort", facts, known_state=facts.state or "no state")
    return None


def _answered(facts: ResetFacts) -> ResetCause:
    """An RST answering a segment that reached a socket."""
    reason = facts.reason
    if facts.state == "LISTEN" and (facts.trigger is None or not facts.trigger.flags & _SYN):
        return _non_syn_to_listener(facts)
    if reason == "TCP_TIMEWAIT_SOCKET" or facts.state == "TIME_WAIT":
        return _explained("time_wait", facts)
    if reason == "INVALID_SYN":
        return _explained("syn_in_window", facts)
    if reason == "TCP_ABORT_ON_DATA":
        return _explained("data_after_close", facts)
    detail = _OUT_OF_WINDOW.get(reason or "")
    if detail is not None or (reason is None and facts.state not in (None, "LISTEN")):
        trigger = facts.trigger
        numbers = f" (seq {trigger.seq}, ack {trigger.ack})" if trigger else ""
        because = f": {detail}" if detail else ""
        return _explained("out_of_window", facts, numbers=numbers, because=because)
    if reason == "TCP_FLAGS":
        return _explained("bad_flags", facts)
    return _explained("unspecified", facts, reason=reason or "not given by this kernel")


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
    if errno_number == _ETIMEDOUT:
        code = "connect_timeout" if state == "SYN_SENT" else "retransmit_timeout"
    else:
        code = "socket_error"
    words = {
        "local": local,
        "remote": remote,
        "remote_host": remote.rsplit(":", 1)[0].strip("[]"),
        "retransmits": retransmits,
        "error": os.strerror(errno_number),
        "role": f" ({side})" if side else "",
        "socket_state": state,
    }
    entry = cause(code)
    return ResetCause(code, entry.explain(**words), entry.checks_for(**words)[0])
