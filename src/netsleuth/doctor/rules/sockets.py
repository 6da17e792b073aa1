"""Socket-level losses from /proc/net/snmp and /proc/net/netstat (the counters `nstat` shows).

- ListenOverflows: the accept queue (min(listen() backlog, net.core.somaxconn)) was full when a handshake
  completed (tcp_v4_syn_recv_sock); ListenDrops counts those plus other SYN-time drops.
- TCPReqQFullDrop: the SYN queue (tcp_max_syn_backlog) was full and syncookies were off.
- TCPBacklogDrop / TCPRcvQDrop: a socket's backlog or receive queue had no room (sk_rcvbuf).
- UDP RcvbufErrors / SndbufErrors: a datagram did not fit the socket buffer (net.core.rmem_*/wmem_*).
netdata tcp_listen.conf / udp_errors.conf alarm on any sustained rate of these; so do we, per second.
"""

from __future__ import annotations

from netsleuth.diagnostics.causes import cause
from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import combine, sysctl_fix
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window

__all__ = ["RULES"]

MIN_EVENTS = 3  # a couple of events in a window can be one unlucky burst
CRITICAL_PER_S = 5.0  # netdata tcp_listen.conf goes critical above 5/s
MIN_SOMAXCONN = 4096  # the kernel default since 5.4 (commit 19f92a030ca6)
MIN_RMEM_MAX = 8 * 1024 * 1024


def _severity(rate: float) -> Severity:
    return Severity.CRITICAL if rate >= CRITICAL_PER_S else Severity.WARNING


def check_listen_queue(window: Window) -> Verdict:
    findings: list[Finding] = []
    overflows = window.netstat_delta("TcpExt.ListenOverflows")
    drops = window.netstat_delta("TcpExt.ListenDrops")
    somaxconn = window.after.sysctl_int("net.core.somaxconn") or 4096
    syn_backlog = window.after.sysctl_int("net.ipv4.tcp_max_syn_backlog") or 1024
    if overflows >= MIN_EVENTS:
        rate = window.per_second(overflows)
        fix = combine(
            sysctl_fix("net.core.somaxconn", max(somaxconn * 2, MIN_SOMAXCONN)),
            sysctl_fix("net.ipv4.tcp_max_syn_backlog", max(syn_backlog * 2, MIN_SOMAXCONN)),
        )
        findings.append(
            Finding(
                id="listen-overflow",
                severity=_severity(rate),
                subject="TCP listeners",
                title=f"accept queues overflowing: {rate:.1f} connections/s dropped",
                evidence={
                    "ListenOverflows_per_s": round(rate, 1),
                    "ListenDrops_per_s": round(window.per_second(drops), 1),
                    "somaxconn": somaxconn,
                    "tcp_max_syn_backlog": syn_backlog,
                },
                explanation=cause("listen_overflow").explain(somaxconn=somaxconn),
                fix_commands=fix.commands,
                persistent=fix.persistent,
                actions=fix.actions,
                cause_code="listen_overflow",
            )
        )
    syn_full = window.netstat_delta("TcpExt.TCPReqQFullDrop")
    if syn_full >= MIN_EVENTS:
        rate = window.per_second(syn_full)
        fix = sysctl_fix("net.ipv4.tcp_max_syn_backlog", max(syn_backlog * 2, MIN_SOMAXCONN))
        findings.append(
            Finding(
                id="syn-queue-full",
                severity=_severity(rate),
                subject="TCP listeners",
                title=f"SYN queue full: {rate:.1f} SYNs/s dropped",
                evidence={"TCPReqQFullDrop_per_s": round(rate, 1), "tcp_max_syn_backlog": syn_backlog},
                explanation=cause("syn_queue_full").explain(),
                fix_commands=fix.commands,
                persistent=fix.persistent,
                actions=fix.actions,
                cause_code="syn_queue_full",
            )
        )
    return findings, "TCP accept/SYN queues: no overflow"


def check_tcp_receive(window: Window) -> Verdict:
    backlog = window.netstat_delta("TcpExt.TCPBacklogDrop")
    rcvq = window.netstat_delta("TcpExt.TCPRcvQDrop")
    if backlog + rcvq < MIN_EVENTS:
        return [], "TCP receive: no segment dropped for a full socket backlog or receive queue"
    tcp_rmem = window.after.sysctls.get("net.ipv4.tcp_rmem", "4096 131072 6291456").split()
    new_max = max(int(tcp_rmem[2]) * 2, 16 * 1024 * 1024) if len(tcp_rmem) == 3 else 16 * 1024 * 1024
    value = f"{tcp_rmem[0]} {tcp_rmem[1]} {new_max}" if len(tcp_rmem) == 3 else f"4096 131072 {new_max}"
    fix = sysctl_fix("net.ipv4.tcp_rmem", value)
    rate = window.per_second(backlog + rcvq)
    finding = Finding(
        id="tcp-receive-drops",
        severity=_severity(rate),
        subject="TCP sockets",
        title=f"TCP segments dropped at full sockets: {rate:.1f}/s",
        evidence={
            "TCPBacklogDrop_per_s": round(window.per_second(backlog), 1),
            "TCPRcvQDrop_per_s": round(window.per_second(rcvq), 1),
            "tcp_rmem": " ".join(tcp_rmem),
        },
        explanation=cause("tcp_receive_full").explain(),
        fix_commands=fix.commands,
        persistent=fix.persistent,
        actions=fix.actions,
        cause_code="tcp_receive_full",
    )
    return [finding], ""


def check_udp_buffers(window: Window) -> Verdict:
    findings: list[Finding] = []
    for direction, counter, max_key, default_key, code in (
        ("receive", "RcvbufErrors", "net.core.rmem_max", "net.core.rmem_default", "rcvbuf"),
        ("send", "SndbufErrors", "net.core.wmem_max", "net.core.wmem_default", "sndbuf"),
    ):
        errors = window.netstat_delta(f"Udp.{counter}") + window.netstat_delta(f"Udp6.{counter}")
        if errors < MIN_EVENTS:
            continue
        rate = window.per_second(errors)
        current_max = window.after.sysctl_int(max_key) or 212992
        current_default = window.after.sysctl_int(default_key) or 212992
        new_max = max(current_max * 4, MIN_RMEM_MAX)
        fix = combine(
            sysctl_fix(max_key, new_max), sysctl_fix(default_key, max(current_default * 4, 1024 * 1024))
        )
        findings.append(
            Finding(
                id=f"udp-{'rcvbuf' if direction == 'receive' else 'sndbuf'}-errors",
                severity=_severity(rate),
                subject="UDP sockets",
                title=f"UDP {direction} buffer full: {rate:.1f} datagrams/s dropped",
                evidence={
                    f"{counter}_per_s": round(rate, 1),
                    max_key: current_max,
                    default_key: current_default,
                },
                explanation=cause(code).explain(default_key=default_key, max_key=max_key),
                fix_commands=fix.commands,
                persistent=fix.persistent,
                actions=fix.actions,
                cause_code=code,
            )
        )
    return findings, "UDP: no datagram dropped for a full socket buffer"


RULES = [
    Rule("listen-queue", check_listen_queue),
    Rule("tcp-receive", check_tcp_receive),
    Rule("udp-buffers", check_udp_buffers),
]
