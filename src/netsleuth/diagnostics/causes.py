"""The cause catalogue: every cause netsleuth names, once, keyed by a stable code.

Doctor findings, diagnose verdicts, tcp queue records and reset/abort records all say *why* through an entry
here and carry its code in their JSON (`cause_code`), so the same problem reads the same and can be joined
wherever it is seen (an accept-queue overflow is a doctor finding from TcpExt.ListenOverflows, a drop verdict
from TCP_LISTEN_OVERFLOW, a full listener seen over sock_diag and a `tcp queues` record).

An entry holds what does not depend on the event: a title, `summary` (a clause that follows the event's
facts: "...: 12 connection attempt(s) dropped because <summary>"), `explanation` (the paragraph a report
prints), and `checks`/`fixes`/`remedy` (commands and advice). Text with `{name}` fields is a template the
caller fills with the event's facts (`explain`, `checks_for`, `fixes_for`).

Codes are snake_case and never change meaning; the reset codes are those `resets --json` has always
printed as `cause_code`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CATALOGUE", "Cause", "cause"]


@dataclass(frozen=True)
class Cause:
    code: str
    title: str
    summary: str = ""
    explanation: str = ""
    checks: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    remedy: str = ""  # the fixes in one line, after a check: "accept faster, or raise ..."

    def explain(self, **facts: Any) -> str:
        return self.explanation.format(**facts)

    def checks_for(self, **facts: Any) -> tuple[str, ...]:
        return tuple(check.format(**facts) for check in self.checks)

    def fixes_for(self, **facts: Any) -> tuple[str, ...]:
        return tuple(fix.format(**facts) for fix in self.fixes)

    def to_json(self) -> dict[str, object]:
        return {
            "code": self.code,
            "title": self.title,
            "summary": self.summary,
            "explanation": self.explanation,
            "checks": list(self.checks),
            "fixes": list(self.fixes),
            "remedy": self.remedy,
        }


_ENTRIES = (
    # -- queues and buffers ----------------------------------------------------------------------------
    Cause(
        "listen_overflow",
        "accept queue overflow",
        summary="the application does not accept() fast enough",
        explanation=(
            "Clients completed the handshake but the server's accept queue was full, so the kernel dropped "
            "the connection (clients see SYN retries and 1 s/3 s stalls). The queue is min(the backlog the "
            "application passes to listen(), net.core.somaxconn = {somaxconn}): raise somaxconn, make sure "
            "the application asks for a large backlog, and check that it accepts fast enough (`ss -ltn`: "
            "Recv-Q near Send-Q). `netsleuth drops` names the socket."
        ),
        checks=("ss -ltn 'sport = :{port}' (Recv-Q waiting, Send-Q backlog)",),
        fixes=(
            "make {comm} accept connections faster (more workers, no blocking before accept())",
            "raise its listen() backlog and net.core.somaxconn (now {somaxconn})",
        ),
        remedy="accept faster, or raise the listen() backlog and net.core.somaxconn",
    ),
    Cause(
        "syn_queue_full",
        "SYN queue full",
        summary="the half-open (SYN) queue was full and SYN cookies were not used",
        explanation=(
            "New connection requests were dropped because the half-open (SYN) queue was full and SYN "
            "cookies were not used. Raise tcp_max_syn_backlog, keep net.ipv4.tcp_syncookies = 1."
        ),
    ),
    Cause(
        "listen_drop",
        "segment dropped by a listener",
        summary="a listening socket dropped a handshake segment",
        checks=("nstat -az TcpExtListenDrops TcpExtListenOverflows TcpExtTCPReqQFullDrop",),
    ),
    Cause(
        "rcvbuf",
        "socket receive buffer full",
        summary="it reads slower than they arrive",
        explanation=(
            "Datagrams were dropped because a UDP socket's receive buffer was full: the application does "
            "not keep up with bursts (DNS, syslog, metrics, QUIC). Sockets get {default_key} unless they ask "
            "for more with SO_RCVBUF, capped by {max_key}. `netsleuth drops` shows which socket."
        ),
        checks=("ss -nmp 'sport = :{port}' (rb = receive buffer)",),
        fixes=(
            "make {comm} read faster, or give its socket a larger SO_RCVBUF",
            "allow larger buffers (net.core.rmem_max is {rmem_max})",
        ),
        remedy="read faster or raise SO_RCVBUF / net.core.rmem_max",
    ),
    Cause(
        "sndbuf",
        "socket send buffer full",
        explanation=(
            "Datagrams were dropped because a UDP socket's send buffer was full: the application does not "
            "keep up with bursts (DNS, syslog, metrics, QUIC). Sockets get {default_key} unless they ask for "
            "more with SO_SNDBUF, capped by {max_key}. `netsleuth drops` shows which socket."
        ),
    ),
    Cause(
        "tcp_receive_full",
        "TCP receive queue or backlog full",
        summary="the application reads too slowly",
        explanation=(
            "Segments arrived for sockets whose receive buffer was full (the application reads too slowly, "
            "or the buffer limit is small for the bandwidth-delay product); they are dropped and "
            "retransmitted. A larger tcp_rmem maximum lets autotuning grow the window; a slow reader needs "
            "fixing in the app."
        ),
        checks=("ss -tnmi 'sport = :{port}' (rb/rmem, rcv_space)", "nstat -az TcpExtTCPRcvQDrop"),
    ),
    Cause(
        "socket_backlog",
        "socket backlog overflow",
        summary="the socket's backlog overflowed while its owner held the socket locked (busy in a syscall)",
    ),
    Cause(
        "zero_window",
        "data sent into a zero window",
        summary="the receiver advertised a zero window: it is not reading",
    ),
    Cause(
        "socket_memory",
        "protocol memory limit",
        summary="the protocol's memory (net.ipv4.tcp_mem / udp_mem) ran out",
        checks=("cat /proc/net/sockstat; compare with net.ipv4.tcp_mem / udp_mem",),
    ),
    Cause(
        "cpu_backlog",
        "per-CPU input backlog full",
        summary="dropped before the stack could process them",
        explanation=(
            "Packets handed to a CPU's input queue (RPS, veth, tunnels, netif_rx drivers) were refused "
            "because the queue already held net.core.netdev_max_backlog = {backlog} packets. Doubling it "
            "absorbs bursts (RHEL network tuning guide, 'softnet_stat column 2'); if drops continue, the CPU "
            "is simply too busy."
        ),
        fixes=(
            "sysctl -w net.core.netdev_max_backlog={backlog}",
            "spread receive work over more CPUs (RSS queues, or RPS: "
            "echo f > /sys/class/net/DEV/queues/rx-0/rps_cpus)",
        ),
    ),
    # -- routing, firewall, conntrack ------------------------------------------------------------------
    Cause(
        "rp_filter",
        "reverse-path filter drop",
        summary="the route back to the source leaves through another interface",
        explanation=(
            "Packets arrived on an interface that is not the one this host would use to reach their "
            "source, and strict reverse-path filtering (rp_filter = 1) dropped them. With asymmetric or "
            "policy routing that is legitimate traffic: loose mode (2) keeps spoofing protection for "
            "unroutable sources."
        ),
        fixes=("sysctl -w net.ipv4.conf.{device}.rp_filter=2",),
        remedy="loose mode, for asymmetric routing",
    ),
    Cause(
        "firewall_drop",
        "dropped by a firewall rule",
        fixes=("if the drop is intended, fix the client that keeps sending this traffic",),
    ),
    Cause(
        "firewall_reject",
        "rejected by a firewall rule with a TCP reset",
        explanation="{rejecter} answered {remote}'s connection to {local} with a TCP reset{unidentified}",
        checks=(
            "{prefix}iptables-save -c | grep -n -- '--reject-with tcp-reset'; "
            "{prefix}nft -a list ruleset | grep 'reject with tcp reset'",
        ),
        fixes=("remove or narrow the rule",),
    ),
    Cause(
        "conntrack_full",
        "conntrack table full",
        explanation=(
            "When the table is full the kernel drops the first packet of every new flow ('nf_conntrack: "
            "table full, dropping packet' in dmesg). Raise nf_conntrack_max (each entry costs ~300 bytes of "
            "kernel memory), shorten timeouts for short-lived flows, or exempt high-volume traffic with "
            "NOTRACK."
        ),
    ),
    Cause(
        "conntrack_invalid",
        "conntrack marks packets INVALID",
        summary=(
            "typical when conntrack marked the packet INVALID so NAT/DNAT was skipped and it reached this "
            "listener instead of its real destination"
        ),
        explanation=(
            "Conntrack could not match these packets to a known flow state, usually TCP segments outside "
            "the window it expects (after retransmits, asymmetric routing, or a middlebox rewriting sequence "
            "numbers). INVALID packets skip NAT and are often dropped by `ct state invalid drop` rules or "
            "answered with a RST from a listener (seed 001). "
        ),
    ),
    # -- TCP resets and aborts: `explanation` is the record's sentence, `checks[0]` its check ---------------
    # Facts (tcp/reset_causes.py): local, remote, netns ("netns NAME"), owner, port (local), prefix (what
    # runs a command in the namespace), state, a_segment ("an ACK segment"), segment ("ACK segment"), and the
    # case's own (unread, dropped, retried, numbers, because, reason, side, age, queued, peer_check...).
    Cause(
        "no_listener",
        "nothing listens on the port",
        explanation="nothing listens on {local} ({netns}): the kernel refused {remote}'s SYN",
        checks=(
            "{prefix}ss -ltnp 'sport = :{port}' — is the service running and bound to this address and port?",
        ),
        fixes=(
            "start the service on that port, or point the client at the port the service really uses",
            "ss -ltnup",
        ),
    ),
    Cause(
        "no_socket",
        "segment for a connection that does not exist here",
        explanation=(
            "{a_segment} from {remote} matched no socket on {local} ({netns}): the connection it belongs to "
            "is gone here (closed, timed out, the service restarted) or never existed here (NAT or routing "
            "sent it to the wrong host)"
        ),
        checks=("{prefix}ss -tan '( sport = :{port} )'; compare with the peer's connection table",),
    ),
    Cause(
        "non_syn_to_listener",
        "non-SYN segment to a listening socket",
        explanation=(
            "{a_segment} from {remote} reached the LISTEN socket on {local} ({netns}), which only accepts "
            "SYNs: no connection exists for it; {evidence}"
        ),
        checks=(
            "{prefix}cat /proc/net/stat/nf_conntrack (invalid column); to test the theory, "
            "{prefix}sysctl -w net.netfilter.nf_conntrack_tcp_be_liberal=1",
        ),
    ),
    Cause(
        "unread_data",
        "closed with unread data",
        explanation=(
            "{owner} closed its connection {local} -> {remote} with {unread} bytes it had not read: Linux "
            "then resets instead of closing gracefully (RFC 2525 2.17)"
        ),
        checks=(
            "make the application read everything the peer sent before close(), or shutdown(SHUT_WR) and "
            "drain until EOF",
        ),
    ),
    Cause(
        "linger_zero",
        "abortive close (SO_LINGER 0)",
        explanation=(
            "{owner} closed {local} -> {remote} with SO_LINGER {{on, 0}}: an abortive close sent RST{dropped}"
        ),
        checks=(
            "strace -f -e trace=setsockopt -p PID | grep SO_LINGER: remove l_linger=0 unless the abort is "
            "intended",
        ),
    ),
    Cause(
        "listener_closed",
        "listener closed with connections not yet accepted",
        explanation=(
            "the listening socket on {local} was closed while the connection from {remote} waited in its "
            "accept queue: the kernel resets connections nobody accepted"
        ),
        checks=("{prefix}ss -ltn 'sport = :{port}' — did the service stop or restart?",),
    ),
    Cause(
        "keepalive_timeout",
        "keepalive timeout",
        explanation=(
            "keepalive probes from {local} to {remote} went unanswered: the peer or the path is gone, so the "
            "kernel reset the connection"
        ),
        checks=(
            "{prefix}ss -tno state established; check the path to the peer and net.ipv4.tcp_keepalive_*",
        ),
    ),
    Cause(
        "memory_abort",
        "orphaned connection aborted for memory",
        explanation=(
            "the kernel aborted the orphaned connection {local} -> {remote} ({socket_state}, already closed "
            "by its application){retried}: too many orphans or TCP memory pressure"
        ),
        checks=("{prefix}cat /proc/net/sockstat (orphan, mem) against net.ipv4.tcp_max_orphans and tcp_mem",),
    ),
    Cause(
        "fin_wait2_linger",
        "TCP_LINGER2 below zero",
        explanation=(
            "{owner} set TCP_LINGER2 below zero: the kernel aborts {local} -> {remote} instead of waiting in "
            "FIN_WAIT2"
        ),
        checks=("look for setsockopt(TCP_LINGER2) in the application",),
    ),
    Cause(
        "abort",
        "connection aborted by its application or from outside",
        explanation=(
            "{owner} aborted {local} -> {remote} ({known_state}): a disconnect (connect(AF_UNSPEC)) or a "
            "socket destroyed from outside (`ss -K`, SOCK_DESTROY)"
        ),
        checks=("strace the application for connect(AF_UNSPEC), or look for tools killing sockets",),
    ),
    Cause(
        "time_wait",
        "segment for a connection in TIME_WAIT",
        explanation=(
            "{a_segment} from {remote} arrived for a connection {local} already closed (TIME_WAIT): a late "
            "retransmission, or the peer reused the ports too soon"
        ),
        checks=("look at how the peer closes; net.ipv4.tcp_tw_reuse on the side that connects",),
    ),
    Cause(
        "syn_in_window",
        "SYN on an existing connection",
        explanation=(
            "a SYN from {remote} arrived on the existing {state} connection {local}: the peer restarted the "
            "connection with the same ports (it rebooted, or its NAT reused the port)"
        ),
        checks=("compare the peer's connection table; check NAT port reuse between the two",),
    ),
    Cause(
        "data_after_close",
        "data after close",
        explanation=(
            "data from {remote} arrived after {owner} closed {local} ({state}): Linux resets instead of "
            "accepting data nobody will read"
        ),
        checks=(
            "the application closed before the peer finished sending: read until EOF, or shutdown(SHUT_WR)",
        ),
    ),
    Cause(
        "out_of_window",
        "segment outside the window",
        explanation=(
            "{a_segment} from {remote}{numbers} is outside the window of the {state} connection "
            "{local}{because}"
        ),
        checks=(
            "a stale segment after a port reuse, a middlebox rewriting sequence numbers, or NAT mapping two "
            "connections onto one: capture both sides with tcpdump and compare sequence numbers",
        ),
    ),
    Cause(
        "bad_flags",
        "segment not valid for the socket's state",
        explanation="{a_segment} from {remote} is not valid for the {state} socket {local}",
        checks=("capture the exchange with tcpdump to see which side breaks the protocol",),
    ),
    Cause(
        "unspecified",
        "reset without a known cause",
        explanation=(
            "the kernel answered a {segment} from {remote} on {local} ({state}) with RST (reason {reason})"
        ),
        checks=("capture the exchange with tcpdump; run with --stack to see where the kernel decided",),
    ),
    Cause(
        "connection_refused",
        "connection refused by the peer",
        explanation=(
            "{remote} refused the connection from {local}: it answered the SYN with RST (nothing listens on "
            "that port there, or a firewall rejects it with tcp-reset)"
        ),
        checks=("{peer_check}, or `ss -ltn 'sport = :{remote_port}'` on the peer",),
    ),
    Cause(
        "peer_reset",
        "reset by the peer",
        explanation=(
            "the peer {remote} reset the {state} connection to {local}{side}{age}: it closed with unread "
            "data, aborted (SO_LINGER 0), crashed, or a middlebox dropped the flow{queued}"
        ),
        checks=("{peer_check}",),
    ),
    Cause(
        "peer_reset_while_closing",
        "reset by the peer while closing",
        explanation=(
            "the peer {remote} reset the connection to {local} after this side closed it "
            "({state}{side}{age}): the peer had unread data or aborted instead of finishing the close"
        ),
        checks=("{peer_check}",),
    ),
    Cause(
        "retransmit_timeout",
        "retransmission timeout",
        explanation=(
            "the kernel gave up on {local} -> {remote} after {retransmits} unanswered retransmissions "
            "(ETIMEDOUT): no RST was sent, so the peer may still think the connection is open"
        ),
        checks=(
            "look for drops on the path (`netsleuth drops --host {remote_host}`) and `ss -ti` retransmit "
            "counters; net.ipv4.tcp_retries2 sets how long the kernel tries",
        ),
    ),
    Cause(
        "connect_timeout",
        "connect timeout",
        explanation="SYNs from {local} to {remote} went unanswered until the kernel gave up (ETIMEDOUT)",
        checks=("`netsleuth conn --dst {remote}` shows where the SYNs died; net.ipv4.tcp_syn_retries",),
    ),
    Cause(
        "socket_error",
        "socket error",
        explanation="the kernel reported {error} on {local} -> {remote}{role} in {socket_state}",
        checks=(
            "the error came from an ICMP message or the local stack: run `netsleuth drops` for the flow",
        ),
    ),
)

# -- causes only `diagnose` names (its DNS, routing, softirq and generic verdicts) ---------------------------
_VERDICT_ENTRIES = (
    Cause(
        "kernel_drop",
        "dropped by the kernel for a reason without a verdict of its own",
        summary="the kernel freed the packet with this drop reason",
        fixes=("netsleuth drops --reason {reason} --stack --netns {netns}   # the full path of each drop",),
    ),
    Cause(
        "retransmits",
        "TCP retransmissions",
        summary="packets or ACKs are being lost on the path",
        fixes=("netsleuth tcp retrans --summary   # per-flow counts, with state and SYN/TLP kinds",),
    ),
    Cause(
        "dns_no_answer",
        "DNS queries unanswered, nothing dropped on this host",
        summary="the loss is on the path or at the server",
    ),
    Cause("dns_servfail", "DNS server failure (SERVFAIL)", summary="the server could not resolve the name"),
    Cause("dns_refused", "DNS query refused (REFUSED)", summary="the server does not serve these clients"),
    Cause("dns_nxdomain", "NXDOMAIN storm", summary="a process keeps asking for names that do not exist"),
    Cause(
        "dns_search_amplification",
        "search-list amplification",
        summary="the resolver tries the search list before the name itself (fewer dots than ndots)",
    ),
    Cause(
        "route_reject",
        "a blackhole, unreachable or prohibit route",
        summary="the routing lookup ended in a route that refuses the packet",
    ),
    Cause(
        "neighbour_unresolved",
        "next hop never resolved",
        summary="the next hop never answered ARP or neighbour solicitation",
    ),
    Cause(
        "net_rx_budget",
        "NET_RX softirq stopped on its budget",
        summary="net_rx_action ran out of netdev_budget packets or netdev_budget_usecs with packets left",
    ),
)

# -- doctor's findings about devices, queues and interrupts, as `diagnose` verdicts (path:<rule>) -----------
_PATH_ENTRIES = (
    Cause("device_drops", "a device drops packets"),
    Cause("device_errors", "a device reports errors"),
    Cause("rx_nohandler", "packets for no protocol handler"),
    Cause("ring_exhaustion", "NIC ring too small for bursts"),
    Cause("irq_pileup", "one CPU takes a device's interrupts"),
    Cause("irq_numa", "interrupts on another NUMA node"),
    Cause("softirq_skew", "softirq work piles up on one CPU"),
    Cause("queues_vs_cpus", "fewer receive queues than CPUs"),
    Cause("rps_single_queue", "a single-queue device without RPS"),
    Cause("rps_on_multiqueue", "RPS on a multi-queue device"),
    Cause("xps_off", "transmit queues without XPS"),
    Cause("coalesce_off", "interrupt coalescing off"),
    Cause("coalesce_high", "interrupt coalescing delays packets"),
    Cause("gro_off", "GRO off"),
    Cause("lro_forwarding", "LRO on a forwarding device"),
    Cause("tunnel_tso", "a tunnel without segmentation offload"),
    Cause("bond_slave_offload", "bond members with different offloads"),
    Cause("tunnel_mtu", "tunnel MTU larger than its path allows"),
    Cause("veth_mtu", "veth ends with different MTUs"),
)

CATALOGUE: dict[str, Cause] = {entry.code: entry for entry in (*_ENTRIES, *_VERDICT_ENTRIES, *_PATH_ENTRIES)}


def cause(code: str) -> Cause:
    """The catalogue entry; a KeyError for an unknown code is a programming error, caught by the tests."""
    return CATALOGUE[code]
