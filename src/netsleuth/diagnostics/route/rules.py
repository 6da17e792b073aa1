"""`diagnose`'s route watch: the route programs for the diagnosis window (counting only), then verdicts on
reject routes and next hops that never resolved.

- "packets to 198.18.5.9 from netns X hit blackhole route 198.18.5.0/24 in table 100 (ip rule 1000: from
  198.18.3.0/24 lookup 100)": from the kernel's lookup groups whose result is a reject route, named by the
  namespace's policy routing (netsleuth.diagnostics.route.policy).
- "next hop 198.18.3.9 never answered ARP: 37 packets dropped": from neighbour entries the kernel marked
  FAILED, and the NEIGH_* drops of packets whose route goes through that hop (or to it, on-link).

Both hold for IPv6 alike (fib6:fib6_table_lookup, neighbour discovery): "hit blackhole route 2001:db8:5::/64",
"next hop 2001:db8:3::9 never answered neighbour solicitation"; the fixes then say `ip -6`, since `ip rule`
and `ip route show` without it act on IPv4 only.

`diagnose_verdicts` is route's part of `diagnose` (its spec's DiagnoseWatch); `neighbour_drops_explained` and
`is_neighbour_drop` let diagnose count the NEIGH_* drops a next-hop verdict names once (diagnose.correlate).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from netsleuth.spec.diagnose import Watched, WatchInputs, Window
from netsleuth.spec.verdict import Severity, Verdict

if TYPE_CHECKING:
    from netsleuth.diagnostics.drops.records import DropGroup
    from netsleuth.diagnostics.route.records import RouteGroup, RouteSummary
    from netsleuth.diagnostics.route.session import RouteDiagnostic

__all__ = [
    "diagnose_verdicts",
    "is_neighbour_drop",
    "neighbour_drops_explained",
    "open_watch",
    "route_verdicts",
]

_REJECTS = {"blackhole", "unreachable", "prohibit"}
_NEIGH_REASONS = {"NEIGH_FAILED", "NEIGH_QUEUEFULL", "NEIGH_DEAD", "NEIGH_CREATEFAIL"}


@dataclass(frozen=True)
class _Hop:
    netns: int
    netns_name: str | None
    dev: str
    address: str


def _label(netns_name: str | None, netns: int) -> str:
    return f"netns {netns_name or netns}"


def _enter(netns_name: str | None) -> str:
    return f"ip netns exec {netns_name} " if netns_name else ""


def _ip(address: str) -> str:
    """`ip` for an IPv4 address, `ip -6` for an IPv6 one (`ip rule`/`ip route show` default to IPv4)."""
    return "ip -6" if ":" in address else "ip"


def _reject_verdicts(groups: Sequence[RouteGroup], seconds: float) -> list[Verdict]:
    from netsleuth.diagnostics.route.records import RouteLookupRecord

    by_decision: dict[tuple[int, int, str, str | None, str | None], list[RouteGroup]] = defaultdict(list)
    for group in groups:
        example = group.example
        if group.kind == "lookup" and isinstance(example, RouteLookupRecord) and example.result in _REJECTS:
            by_decision[(example.netns, example.table, example.dst, example.route, example.rule)].append(
                group
            )
    verdicts = []
    for (netns, table, dst, route, rule), members in by_decision.items():
        example = members[0].example
        assert isinstance(example, RouteLookupRecord)
        count = sum(group.count for group in members)
        where = _label(example.netns_name, netns)
        prefix = route.split(" ", 1)[1].split(" ")[0] if route and " " in route else (route or "?")
        rule_text = f" (ip rule {rule})" if rule else ""
        cause = (
            f"packets to {dst} from {where} hit {example.result} route {prefix} in table {example.table_name}"
            f"{rule_text}: {count} lookup(s) refused"
        )
        evidence: dict[str, Any] = {
            "lookups": count,
            "rate_per_s": round(count / seconds, 2) if seconds > 0 else None,
            "route": route,
            "rule": rule,
            "example": f"{example.proto or 'ip'} {example.src} > {example.dst}",
        }
        if example.comm:
            evidence["process"] = {"comm": example.comm, "pid": example.pid}
        enter = _enter(example.netns_name) + _ip(dst)
        fixes = []
        if route:
            fixes.append(f"{enter} route del {route} table {table}   # if this traffic should be routed")
        if rule:
            fixes.append(f"{enter} rule del pref {rule.split(':', 1)[0]}   # if the rule should not steer it")
        fixes.append(f"{enter} route get {dst} from {example.src}   # what the kernel decides now")
        verdicts.append(
            Verdict(
                category="route-reject",
                severity=Severity.CRITICAL,
                cause=cause,
                evidence=evidence,
                fix=tuple(fixes),
                events=count,
                cause_code="route_reject",
                netns=netns,
                saddr=example.src or None,
                daddr=dst,
            )
        )
    return verdicts


def is_neighbour_drop(group: DropGroup) -> bool:
    """A drop the next-hop verdicts account for: a NEIGH_* reason, or IPv6's reasonless free of a failed
    neighbour's queue (NOT_SPECIFIED at neigh_invalidate or ndisc_error_report, which route counts as
    NEIGH_FAILED)."""
    from netsleuth.diagnostics.route.session import NEIGH_FREE_SITES

    if group.reason in _NEIGH_REASONS:
        return True
    return group.reason == "NOT_SPECIFIED" and group.location.split("+", 1)[0] in NEIGH_FREE_SITES


def _hop_verdicts(groups: Sequence[RouteGroup]) -> tuple[list[Verdict], int]:
    """Failed next hops with the packets lost behind them; also how many NEIGH drops they explain."""
    from netsleuth.diagnostics.route.records import NeighRecord, RouteDropRecord, RouteLookupRecord

    failures: dict[_Hop, int] = defaultdict(int)
    gateways: dict[tuple[int, str], set[str]] = defaultdict(set)  # (netns, destination) -> hops used
    drops: list[tuple[RouteDropRecord, int]] = []
    for group in groups:
        example = group.example
        if isinstance(example, NeighRecord) and example.event in ("failed", "dead"):
            failures[_Hop(example.netns, example.netns_name, example.dev, example.address)] += group.count
        elif isinstance(example, RouteLookupRecord) and example.gateway:
            gateways[(example.netns, example.dst)].add(example.gateway)
        elif isinstance(example, RouteDropRecord):
            drops.append((example, group.count))
    dropped: dict[_Hop, int] = defaultdict(int)
    destinations: dict[_Hop, set[str]] = defaultdict(set)
    explained = 0
    for drop, count in drops:
        candidates = [
            hop
            for hop in failures
            if hop.netns == drop.netns
            and (hop.address == drop.dst or hop.address in gateways.get((drop.netns, drop.dst or ""), ()))
        ]
        if not candidates:
            # No lookup of this destination seen in the window (a route cached in a socket): a single failed
            # hop on the packet's device is the one it waited for.
            candidates = [hop for hop in failures if hop.netns == drop.netns and hop.dev == drop.dev]
        if len(candidates) == 1:
            dropped[candidates[0]] += count
            destinations[candidates[0]].add(drop.dst or "?")
            explained += count
    verdicts = []
    for hop, failed in failures.items():
        lost = dropped.get(hop, 0)
        protocol = "ARP" if ":" not in hop.address else "neighbour solicitation"
        cause = f"next hop {hop.address} never answered {protocol}"
        cause += f": {lost} packet(s) dropped" if lost else f" ({failed} time(s))"
        cause += f" (dev {hop.dev}, {_label(hop.netns_name, hop.netns)})"
        enter = _enter(hop.netns_name) + _ip(hop.address)
        verdicts.append(
            Verdict(
                category="next-hop-unresolved",
                severity=Severity.CRITICAL if lost else Severity.WARNING,
                cause=cause,
                evidence={
                    "drops": lost,
                    "resolution_failures": failed,
                    "destinations": sorted(destinations.get(hop, ())),
                    "device": hop.dev,
                },
                fix=(
                    f"check that {hop.address} is up and on the same link as {hop.dev}: "
                    f"{enter} neigh show {hop.address}",
                    f"{enter} route show table all via {hop.address}   # the routes through it",
                ),
                events=lost or failed,
                cause_code="neighbour_unresolved",
                netns=hop.netns,
                daddr=hop.address,  # the hop the packets waited for
            )
        )
    return verdicts, explained


def route_verdicts(groups: Sequence[RouteGroup], seconds: float) -> tuple[list[Verdict], int]:
    """Verdicts on reject routes and failed next hops, and how many NEIGH_* drops the latter explain."""
    hop_verdicts, explained = _hop_verdicts(groups)
    return _reject_verdicts(groups, seconds) + hop_verdicts, explained


def open_watch(inputs: WatchInputs) -> RouteDiagnostic:
    """The route programs for diagnose's window, counting only. --pid/--comm select the process whose
    lookups matter; the route programs take the same filters as diagnose."""
    from netsleuth.diagnostics.route.records import RouteConfig
    from netsleuth.diagnostics.route.session import RouteDiagnostic

    return RouteDiagnostic(RouteConfig(summary=True), inputs.context, inputs.packet_filter)


def diagnose_verdicts(watched: Watched, window: Window) -> list[Verdict]:
    """route's part of `diagnose`: reject routes and failed next hops counted over the window."""
    summary: RouteSummary = watched.summary
    verdicts, _ = route_verdicts(summary.groups, window.seconds)
    return verdicts


def neighbour_drops_explained(summary: RouteSummary) -> bool:
    """Whether the window's next-hop verdicts name the packets lost behind a failed hop: then the NEIGH_*
    drops (`is_neighbour_drop`) are theirs, not a drop verdict's too."""
    return route_verdicts(summary.groups, 0.0)[1] > 0
