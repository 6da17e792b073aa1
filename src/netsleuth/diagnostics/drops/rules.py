"""drops' part of `diagnose`: kernel drop groups (reason x location x netns, exact counts) -> verdicts.

The reason names are the running kernel's (read from BTF); the categories below cover the reasons a person
can act on. Anything else still becomes a verdict, named by its reason, so no drop goes unmentioned.

Under `diagnose` the drops object counts in the kernel for the window, leaving out netsleuth's own footprint
(the QUEUE_PURGE drops of its own netlink sockets, `skip_own`); its spec's DiagnoseWatch names the functions
below.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from netsleuth.diagnostics.causes import cause as cause_entry
from netsleuth.diagnostics.drops.records import DropGroup, DropRecord
from netsleuth.diagnostics.drops.view import endpoints
from netsleuth.firewall.removal import removal_command
from netsleuth.netns_command import in_netns
from netsleuth.spec.diagnose import Watched, WatchInputs, Window
from netsleuth.spec.verdict import Severity, Verdict

if TYPE_CHECKING:
    from netsleuth.diagnostics.drops.records import DropsSummary
    from netsleuth.diagnostics.drops.session import DropsDiagnostic

__all__ = [
    "LISTEN_OVERFLOW_FINDINGS",
    "diagnose_verdicts",
    "drop_verdicts",
    "listen_overflow_fix",
    "notes",
    "open_watch",
    "own_drops",
    "progress",
]

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


def _fix_netns(group: DropGroup, window: Window) -> str | None:
    """The namespace a fix for `group` runs in (Window.netns_of_fix)."""
    return window.netns_of_fix(group.netns, group.netns_name)


def _who(example: DropRecord) -> str:
    return f"{example.comm}[{example.pid}]" if example.pid is not None else "no process (kernel)"


def _where(group: DropGroup) -> str:
    netns = f"netns {group.netns_name}" if group.netns_name else f"netns {group.netns}"
    return f"pod {_pod(group)}, {netns}" if group.pod else netns


def _pod(group: DropGroup) -> str | None:
    """The group's pod as NAMESPACE/NAME, None when its namespace is no pod's."""
    return f"{group.pod.namespace}/{group.pod.name}" if group.pod else None


def _evidence(group: DropGroup, seconds: float, **extra: Any) -> dict[str, Any]:
    example = group.example
    evidence: dict[str, Any] = {
        "drops": group.count,
        "rate_per_s": round(group.count / seconds, 2) if seconds else None,
        "reason": group.reason,
        "location": group.location,
        "netns": group.netns,
        "netns_name": group.netns_name,
        **({"pod": _pod(group)} if group.pod else {}),
        "example": endpoints(example),
        "process": None if example.pid is None else {"pid": example.pid, "comm": example.comm},
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


def _verdict(
    group: DropGroup,
    window: Window,
    category: str,
    cause: str,
    fix: Iterable[str],
    cause_code: str,
    *,
    loss: bool = False,
    absorbed: tuple[str, ...] = (),
    firewall_rule: str | None = None,
    **evidence: Any,
) -> Verdict:
    """The verdict of one group: what it concerns is the group's namespace and its example's flow."""
    packet = group.example
    return Verdict(
        category=category,
        severity=_severity(group, window.seconds, loss),
        cause=cause,
        evidence=_evidence(group, window.seconds, **evidence),
        fix=tuple(fix),
        absorbed_findings=absorbed,
        events=group.count,
        cause_code=cause_code,
        netns=group.netns or None,  # 0: the kernel could not tell
        saddr=packet.saddr,
        daddr=packet.daddr,
        firewall_rule=firewall_rule,
    )


def _firewall(group: DropGroup, window: Window) -> Verdict:
    example, netfilter = group.example, group.example.netfilter or {}
    rule, table, chain, hook = (netfilter.get(key) for key in ("rule", "table", "chain", "hook"))
    packet = endpoints(example)
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
    removal = removal_command(netfilter, _fix_netns(group, window)) if rule else None
    if removal is not None:
        fix.append(removal + "   # if this traffic should pass")
    fix.extend(cause_entry("firewall_drop").fixes)
    return _verdict(
        group,
        window,
        "firewall",
        cause,
        fix,
        "firewall_drop",
        firewall_rule=rule or None,
        netfilter=netfilter,
    )


def _no_listener(group: DropGroup, window: Window) -> Verdict:
    packet = group.example
    resets = window.resets_by_flow.get((packet.daddr, packet.dport), 0)
    refused = f"; {resets} reset(s) sent back" if resets else ""
    cause = (
        f"nothing listens on {packet.proto} port {packet.dport} of {packet.daddr} ({_where(group)}): "
        f"{group.count} packet(s) refused{refused}"
    )
    start, look = cause_entry("no_listener").fixes
    fix = (start, in_netns(look, _fix_netns(group, window)) + "   # what does listen there")
    return _verdict(group, window, "no-listener", cause, fix, "no_listener", resets_sent=resets)


def _listen_overflow(group: DropGroup, window: Window) -> Verdict:
    example = group.example
    somaxconn = window.sysctls.get("net.core.somaxconn")
    why = cause_entry("listen_overflow").summary
    cause = (
        f"the accept queue of {_who(example)} listening on port {example.dport} ({_where(group)}) "
        f"is full: {group.count} connection attempt(s) dropped because {why}"
    )
    return _verdict(
        group,
        window,
        "listen-overflow",
        cause,
        listen_overflow_fix(example.comm, somaxconn, _fix_netns(group, window)),
        "listen_overflow",
        loss=True,
        absorbed=LISTEN_OVERFLOW_FINDINGS,
        somaxconn=somaxconn,
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


def _udp_rcvbuf(group: DropGroup, window: Window) -> Verdict:
    example = group.example
    rmem_max = window.sysctls.get("net.core.rmem_max")
    rcvbuf = cause_entry("rcvbuf")
    cause = (
        f"the receive buffer of {_who(example)} on {example.proto} port {example.dport} "
        f"({_where(group)}) overflowed: {group.count} datagram(s) dropped because {rcvbuf.summary}"
    )
    faster, larger = rcvbuf.fixes_for(comm=example.comm or "the receiver", rmem_max=rmem_max)
    fix = (
        faster,
        f"{larger}: "
        + in_netns(
            "sysctl -w net.core.rmem_max=26214400 net.core.rmem_default=26214400", _fix_netns(group, window)
        ),
    )
    return _verdict(
        group,
        window,
        "udp-rcvbuf",
        cause,
        fix,
        rcvbuf.code,
        loss=True,
        absorbed=("udp-rcvbuf-errors",),
        rmem_max=rmem_max,
    )


def _cpu_backlog(group: DropGroup, window: Window) -> Verdict:
    backlog = window.sysctls.get("net.core.netdev_max_backlog")
    cpu_backlog = cause_entry("cpu_backlog")
    cause = (
        f"the per-CPU input backlog overflowed (netdev_max_backlog={backlog}): {group.count} packet(s) "
        f"{cpu_backlog.summary} (CPU {group.example.cpu} in the example)"
    )
    return _verdict(
        group,
        window,
        "cpu-backlog",
        cause,
        cpu_backlog.fixes_for(backlog=max(2 * int(backlog or 1000), 2000)),
        cpu_backlog.code,
        loss=True,
        absorbed=("backlog-drops",),
        netdev_max_backlog=backlog,
    )


def _rp_filter(group: DropGroup, window: Window) -> Verdict:
    packet = group.example
    rp_filter = cause_entry("rp_filter")
    cause = (
        f"reverse-path filtering dropped {group.count} packet(s) from {packet.saddr} "
        f"on {group.example.ifname} ({_where(group)}): {rp_filter.summary}"
    )
    [loose] = rp_filter.fixes_for(device=group.example.ifname or "all")
    return _verdict(
        group,
        window,
        "rp-filter",
        cause,
        (in_netns(loose, _fix_netns(group, window)) + f"   # {rp_filter.remedy}",),
        rp_filter.code,
        absorbed=("rp-filter-drops",),
    )


def _generic(group: DropGroup, window: Window) -> Verdict:
    loss = group.reason in _LOSS_REASONS
    cause = (
        f"the kernel dropped {group.count} packet(s) with reason {group.reason} at {group.location} "
        f"({_where(group)}), e.g. {endpoints(group.example)}"
    )
    kernel_drop = cause_entry("kernel_drop")
    return _verdict(
        group,
        window,
        f"drop:{group.reason}",
        cause,
        kernel_drop.fixes_for(reason=group.reason, netns=group.netns),
        kernel_drop.code,
        loss=loss,
    )


_RULES = {
    "NETFILTER_DROP": _firewall,
    "NO_SOCKET": _no_listener,
    "TCP_LISTEN_OVERFLOW": _listen_overflow,
    "SOCKET_RCVBUFF": _udp_rcvbuf,
    "CPU_BACKLOG": _cpu_backlog,
    "IP_RPFILTER": _rp_filter,
}


def drop_verdicts(groups: Iterable[DropGroup], window: Window) -> list[Verdict]:
    """One verdict per group: groups already separate reason, location and netns, which is what a person
    fixes one at a time (a rule, a listener, a buffer)."""
    return [_inferred(group, _RULES.get(group.reason, _generic)(group, window)) for group in groups]


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
    return msgspec.structs.replace(
        verdict,
        cause=cause,
        evidence={**verdict.evidence, "reason_inferred": True},
        fix=tuple(line.replace(f"--reason {group.reason} ", "") for line in verdict.fix),
    )


def diagnose_verdicts(watched: Watched, window: Window) -> list[Verdict]:
    """drops' part of `diagnose`: a verdict per drop group the kernel counted over the window."""
    summary: DropsSummary = watched.summary
    return drop_verdicts(summary.groups, window)


def open_watch(inputs: WatchInputs) -> DropsDiagnostic:
    from netsleuth.diagnostics.drops.program import DropsProgramConfig
    from netsleuth.diagnostics.drops.session import DropsDiagnostic

    # Counted in the kernel (no events), netsleuth's own netlink sockets' purges left out (skip_own).
    config = DropsProgramConfig(packet_filter=inputs.packet_filter, summary_only=True, skip_own=True)
    return DropsDiagnostic(config, inputs.context, reasons=inputs.drop_reasons)


def progress(session: DropsDiagnostic) -> str:
    return f"{session.totals().matched} drops"


def own_drops(session: DropsDiagnostic) -> int:
    return session.raw.own_drops()


def notes(session: DropsDiagnostic) -> list[str]:
    notes = []
    own = session.raw.own_drops()
    if own:
        notes.append(
            f"{own} QUEUE_PURGE drop(s) of netsleuth's own netlink sockets (the unread replies its firewall "
            "reads left when they closed) are not counted as this host's"
        )
    if not session.raw.own_marked:
        notes.append(
            "netsleuth's own netlink drops cannot be told apart on this kernel (that needs "
            "sock:sock_send_length and typed tracepoints, Linux 6.3): QUEUE_PURGE verdicts may hold some"
        )
    return notes
