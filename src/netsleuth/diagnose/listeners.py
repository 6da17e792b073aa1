"""Listening sockets whose accept queue is full, from sock_diag (NETLINK_SOCK_DIAG, the interface `ss`
uses): for a LISTEN socket the kernel reports the accept queue length as idiag_rqueue and the backlog as
idiag_wqueue (net/ipv4/tcp_diag.c tcp_diag_get_info).

Why here and not from kfree_skb: a SYN refused because the accept queue is full is *consumed*, not dropped
(tcp_rcv_state_process calls consume_skb after conn_request), so the only kernel traces are the
ListenOverflows/ListenDrops counters and the full queue itself.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from netsleuth.diagnostics.causes import cause as cause_entry
from netsleuth.diagnostics.drops.rules import LISTEN_OVERFLOW_FINDINGS, listen_overflow_fix
from netsleuth.kernel.netns_exec import call_in_netns
from netsleuth.kernel.process import SocketOwners
from netsleuth.spec.verdict import Severity, Verdict

__all__ = ["FullListener", "full_listeners", "listener_verdicts"]

_TCP_LISTEN = 10


@dataclass(frozen=True)
class FullListener:
    address: str
    port: int
    queued: int
    backlog: int
    inode: int


def _read() -> list[FullListener]:
    from pyroute2 import DiagSocket

    found = []
    with DiagSocket() as diag:
        diag.bind()
        for family in (socket.AF_INET, socket.AF_INET6):
            for message in diag.get_sock_stats(family=family, states=1 << _TCP_LISTEN):
                queued, backlog = message.get("idiag_rqueue"), message.get("idiag_wqueue")
                # The queue counts as full at backlog + 1 (sk_acceptq_is_full: ack_backlog > max_ack_backlog).
                if backlog is not None and queued is not None and queued > backlog:
                    found.append(
                        FullListener(
                            str(message.get("idiag_src")),
                            int(message.get("idiag_sport")),
                            int(queued),
                            int(backlog),
                            int(message.get("idiag_inode")),
                        )
                    )
    return found


def full_listeners(netns: str | None) -> list[FullListener]:
    """Listeners with a full accept queue now, in `netns` (a name or path) or this process's namespace."""
    return call_in_netns(netns, _read)


def listener_verdicts(
    listeners: list[FullListener],
    overflows: int,
    somaxconn: str | None,
    netns_name: str | None,
    netns: int | None = None,
) -> list[Verdict]:
    """One verdict per full listener in the namespace diagnose watched (`netns_name`, inode `netns`), naming
    the process that owns it (by socket inode)."""
    owners = SocketOwners()
    why = cause_entry("listen_overflow").summary
    verdicts = []
    for listener in listeners:
        owner = owners.owner(listener.inode)
        who = f"{owner.comm}[{owner.pid}]" if owner else "an unknown process"
        where = f" (netns {netns_name})" if netns_name else ""
        cause = (
            f"the accept queue of {who} listening on port {listener.port}{where} is full "
            f"({listener.queued} waiting, backlog {listener.backlog}): {overflows} connection attempt(s) "
            f"were refused because {why}"
        )
        evidence = {
            "listen_overflows": overflows,
            "address": listener.address,
            "port": listener.port,
            "queued": listener.queued,
            "backlog": listener.backlog,
            "somaxconn": somaxconn,
            "process": {"pid": owner.pid, "comm": owner.comm} if owner else None,
        }
        severity = Severity.CRITICAL if overflows else Severity.WARNING
        verdicts.append(
            Verdict(
                category="listen-overflow",
                severity=severity,
                cause=cause,
                evidence=evidence,
                fix=listen_overflow_fix(owner.comm if owner else None, somaxconn, netns_name),
                events=overflows,
                absorbed_findings=LISTEN_OVERFLOW_FINDINGS,
                cause_code="listen_overflow",
                netns=netns,
                # Where the refused connections were going: none for a wildcard listener (any address here).
                daddr=None if ipaddress.ip_address(listener.address).is_unspecified else listener.address,
            )
        )
    return verdicts
