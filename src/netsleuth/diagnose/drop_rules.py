"""Kernel drop groups (reason x location x netns, exact counts) → verdicts.

The reason names are the running kernel's (read from BTF); the categories below cover the reasons a person
can act on. Anything else still becomes a verdict, named by its reason, so no drop goes unmentioned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from netsleuth.diagnose.verdicts import Severity, Verdict
from netsleuth.diagnostics.causes import cause as cause_entry
from netsleuth.diagnostics.drops_enrich import DropGroup, DropRecord
from netsleuth.firewall.removal import removal_command
from netsleuth.netns_command import in_netns  # re-exported: tcp_rules and listeners import it from here
from netsleuth.render.drops_text import endpoints

__all__ = ["LISTEN_OVERFLOW_FINDINGS", "DropContext", "drop_verdicts", "in_netns", "listen_overflow_fix"]

# Losses that mean data a process was waiting for never arrived.
_LOSS_REASONS = {
    "SOCKET_RCVBUFF",
    "TCP_LISTEN_OVERFLOW",
    "CPU_BACKLOG",
    "SOCKET_BACKLOG",
    "PROTO_MEM",
    "QDISC_DROP",
    "QDISC_OVERLIMIT",
    "QDISC_CONGESTED",
    "FULL_RING",
    "NOMEM",
    "NEIGH_QUEUEFULL",
}
# Drops that are routine housekeeping unless they come at a high rate: unclassified multicast chatter, frames
# for other hosts, and a closing socket purging what it had not read (QUEUE_PURGE; netlink sockets, ours
# included, do that on every close).
_BACKGROUND_REASONS = {
    "NOT_SPECIFIED",
    "OTHERHOST",
    "UNICAST_IN_L2_MULTICAST",
    "IPV6DISABLED",
    "PKT_TOO_SMALL",
    "QUEUE_PURGE",
}
_CRITICAL_RATE = 10.0  # drops/s past which a loss is an outage rather than a blip


@dataclass(frozen=True)
class DropContext:
    """What the verdicts need besides the groups: the window and a few settings read by doctor."""

    seconds: float
    sysctls: dict[str, str]
    resets_by_flow: dict[tuple[str | None, int | None], int]  # (daddr, dport) → RSTs sent for it
    # Where fixes run: this host's namespace inode, and a file to enter an unnamed one (/proc/PID/ns/net).
    # Unset (recorded groups), a drop's fix is placed by its `ip netns` name alone.
    host_netns: int | None = None
    netns_file: Callable[[int], str | None] | None = None


def _fix_netns(group: DropGroup, context: DropContext) -> str | None:
    """The namespace a fix for `group` must run in, as `in_netns` takes it: its `ip netns` name, else a file
    of a process inside it; None for this host's own. A namespace with neither (every process gone) gets its
    inode, so the printed command fails to enter it rather than change the host."""
    if group.netns_name:
        return group.netns_name
    if context.host_netns is None or group.netns in (0, context.host_netns):
        return None
    path = context.netns_file(group.netns) if context.netns_file is not None else None
    return path or str(group.netns)


def _who(example: DropRecord) -> str:
    owner = example.owner
    return f"{owner.comm}[{owner.pid}]" if owner.pid is not None else "no process (kernel)"


def _where(group: DropGroup) -> str:
    netns = f"netns {group.netns_name}" if group.netns_name else f"netns {group.netns}"
    return f"pod {group.pod.ref}, {netns}" if group.pod is not None else netns


def _evidence(group: DropGroup, seconds: float, **extra: Any) -> dict[str, Any]:
    example = group.example
    evidence: dict[str, Any] = {
        "drops": group.count,
        "rate_per_s": round(group.count / seconds, 2) if seconds else None,
        "reason": group.reason,
        "location": group.location,
        "netns": group.netns,
        "netns_name": group.netns_name,
        **({"pod": group.pod.ref} if group.pod is not None else {}),
        "example": endpoints(example.packet),
        "process": None
        if example.owner.pid is None
        else {"pid": example.owner.pid, "comm": example.owner.comm},
    }
    if example.stack:
        evidence["stack_top"] = list(example.stack[:3])
    evidence.update(extra)
    return evidence


def _severity(group: DropGroup, seconds: float, loss: bool) -> Severity:
    rate = group.count / seconds if seconds else group.count
    if group.reason in _BACKGROUND_REASONS:
        return Severity.WARNING if rate >= _CRITICAL_RATE else Severity.INFO
    if loss or rate >= _CRITICAL_RATE:
        return Severity.CRITICAL
    return Severity.WARNING


def _firewall(group: DropGroup, context: DropContext) -> Verdict:
    example, netfilter = group.example, group.example.netfilter or {}
    rule, table, chain, hook = (netfilter.get(key) for key in ("rule", "table", "chain", "hook"))
    packet = endpoints(example.packet)
    if rule:
        cause = (
            f'firewall rule "{rule}" ({table}/{chain}, {hook} hook, {_where(group)}) dropped {group.count} '
            f"packet(s) like {packet} from {_who(example)}"
        )
    else:
        cause = (
            f"the firewall ({hook or 'unknown'} hook, {_where(group)}) dropped {group.count} packet(s) "
            f"like {packet}"
        )
    fix: list[str] = []
    removal = removal_command(netfilter, _fix_netns(group, context)) if rule else None
    if removal is not None:
        fix.append(removal + "   # if this traffic should pass")
    fix.extend(cause_entry("firewall_drop").fixes)
    return Verdict(
        "firewall",
        _severity(group, context.seconds, loss=False),
        cause,
        _evidence(group, context.seconds, netfilter=netfilter),
        tuple(fix),
        group.count,
        cause_code="firewall_drop",
    )


def _no_listener(group: DropGroup, context: DropContext) -> Verdict:
    packet = group.example.packet
    resets = context.resets_by_flow.get((packet.daddr, packet.dport), 0)
    refused = f"; {resets} reset(s) sent back" if resets else ""
    cause = (
        f"nothing listens on {packet.proto_name} port {packet.dport} of {packet.daddr} ({_where(group)}): "
        f"{group.count} packet(s) refused{refused}"
    )
    start, look = cause_entry("no_listener").fixes
    fix = (start, in_netns(look, _fix_netns(group, context)) + "   # what does listen there")
    return Verdict(
        "no-listener",
        _severity(group, context.seconds, loss=False),
        cause,
        _evidence(group, context.seconds, resets_sent=resets),
        fix,
        group.count,
        cause_code="no_listener",
    )


def _listen_overflow(group: DropGroup, context: DropContext) -> Verdict:
    example = group.example
    somaxconn = context.sysctls.get("net.core.somaxconn")
    why = cause_entry("listen_overflow").summary
    cause = (
        f"the accept queue of {_who(example)} listening on port {example.packet.dport} ({_where(group)}) "
        f"is full: {group.count} connection attempt(s) dropped because {why}"
    )
    return Verdict(
        "listen-overflow",
        _severity(group, context.seconds, loss=True),
        cause,
        _evidence(group, context.seconds, somaxconn=somaxconn),
        listen_overflow_fix(example.owner.comm, somaxconn, _fix_netns(group, context)),
        group.count,
        LISTEN_OVERFLOW_FINDINGS,
        cause_code="listen_overflow",
    )


LISTEN_OVERFLOW_FINDINGS = ("listen-overflow", "syn-queue-full")  # doctor findings of the same cause


def listen_overflow_fix(comm: str | None, somaxconn: str | None, netns_name: str | None) -> tuple[str, ...]:
    """The fix of a full accept queue, seen as drops or as a full listener."""
    faster, larger = cause_entry("listen_overflow").fixes_for(
        comm=comm or "the application", somaxconn=somaxconn
    )
    # Twice the current limit, at least the default since 5.4: what doctor's listen-overflow fix sets.
    current = int(somaxconn) if somaxconn and somaxconn.isdigit() else 0
    wanted = max(2 * current, 4096)
    return (faster, f"{larger}: " + in_netns(f"sysctl -w net.core.somaxconn={wanted}", netns_name))


def _udp_rcvbuf(group: DropGroup, context: DropContext) -> Verdict:
    example = group.example
    rmem_max = context.sysctls.get("net.core.rmem_max")
    rcvbuf = cause_entry("rcvbuf")
    cause = (
        f"the receive buffer of {_who(example)} on {example.packet.proto_name} port {example.packet.dport} "
        f"({_where(group)}) overflowed: {group.count} datagram(s) dropped because {rcvbuf.summary}"
    )
    faster, larger = rcvbuf.fixes_for(comm=example.owner.comm or "the receiver", rmem_max=rmem_max)
    fix = (
        faster,
        f"{larger}: "
        + in_netns(
            "sysctl -w net.core.rmem_max=26214400 net.core.rmem_default=26214400", _fix_netns(group, context)
        ),
    )
    return Verdict(
        "udp-rcvbuf",
        _severity(group, context.seconds, loss=True),
        cause,
        _evidence(group, context.seconds, rmem_max=rmem_max),
        fix,
        group.count,
        ("udp-rcvbuf-errors",),
        cause_code=rcvbuf.code,
    )


def _cpu_backlog(group: DropGroup, context: DropContext) -> Verdict:
    backlog = context.sysctls.get("net.core.netdev_max_backlog")
    cpu_backlog = cause_entry("cpu_backlog")
    cause = (
        f"the per-CPU input backlog overflowed (netdev_max_backlog={backlog}): {group.count} packet(s) "
        f"{cpu_backlog.summary} (CPU {group.example.cpu} in the example)"
    )
    return Verdict(
        "cpu-backlog",
        _severity(group, context.seconds, loss=True),
        cause,
        _evidence(group, context.seconds, netdev_max_backlog=backlog),
        cpu_backlog.fixes_for(backlog=max(2 * int(backlog or 1000), 2000)),
        group.count,
        ("backlog-drops",),
        cause_code=cpu_backlog.code,
    )


def _rp_filter(group: DropGroup, context: DropContext) -> Verdict:
    packet = group.example.packet
    rp_filter = cause_entry("rp_filter")
    cause = (
        f"reverse-path filtering dropped {group.count} packet(s) from {packet.saddr} "
        f"on {group.example.ifname} ({_where(group)}): {rp_filter.summary}"
    )
    [loose] = rp_filter.fixes_for(device=group.example.ifname or "all")
    return Verdict(
        "rp-filter",
        _severity(group, context.seconds, loss=False),
        cause,
        _evidence(group, context.seconds),
        (in_netns(loose, _fix_netns(group, context)) + f"   # {rp_filter.remedy}",),
        group.count,
        ("rp-filter-drops",),
        cause_code=rp_filter.code,
    )


def _generic(group: DropGroup, context: DropContext) -> Verdict:
    loss = group.reason in _LOSS_REASONS
    cause = (
        f"the kernel dropped {group.count} packet(s) with reason {group.reason} at {group.location} "
        f"({_where(group)}), e.g. {endpoints(group.example.packet)}"
    )
    kernel_drop = cause_entry("kernel_drop")
    return Verdict(
        f"drop:{group.reason}",
        _severity(group, context.seconds, loss),
        cause,
        _evidence(group, context.seconds),
        kernel_drop.fixes_for(reason=group.reason, netns=group.netns),
        group.count,
        cause_code=kernel_drop.code,
    )


_RULES = {
    "NETFILTER_DROP": _firewall,
    "NO_SOCKET": _no_listener,
    "TCP_LISTEN_OVERFLOW": _listen_overflow,
    "SOCKET_RCVBUFF": _udp_rcvbuf,
    "CPU_BACKLOG": _cpu_backlog,
    "IP_RPFILTER": _rp_filter,
}


def drop_verdicts(groups: Iterable[DropGroup], context: DropContext) -> list[Verdict]:
    """One verdict per group: groups already separate reason, location and netns, which is what a person
    fixes one at a time (a rule, a listener, a buffer)."""
    return [_inferred(group, _RULES.get(group.reason, _generic)(group, context)) for group in groups]


def _inferred(group: DropGroup, verdict: Verdict) -> Verdict:
    """A reason inferred from the drop location (a kernel before 5.17 gives none) is said to be one in the
    cause and the evidence, and a fix never selects it with --reason (refused when reasons are inferred)."""
    if not group.reason_inferred:
        return verdict
    named = f" with reason {group.reason}"
    if named in verdict.cause:
        cause = verdict.cause.replace(named, f"{named} (inferred from the drop location)", 1)
    else:
        cause = f"{verdict.cause} (drop reason {group.reason} inferred from the drop location)"
    return dataclasses.replace(
        verdict,
        cause=cause,
        evidence={**verdict.evidence, "reason_inferred": True},
        fix=tuple(line.replace(f"--reason {group.reason} ", "") for line in verdict.fix),
    )
