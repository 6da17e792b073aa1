"""`route` attached: the kernel's IPv4 and IPv6 route lookups (fib:fib_table_lookup,
fib6:fib6_table_lookup) and their next hops' neighbour resolution (neigh:*: ARP and neighbour discovery),
with the `ip rule`, table and prefix that decided each one, and packets lost to a next hop that never
answered (skb:kfree_skb with a NEIGH_* reason, or freed where a failed neighbour's queue is flushed).

The kernel side (bpf/route.bpf.c) counts every lookup exactly by decision (netns, table, result, addresses,
next hop) and offers events to the ring buffer; this module names them: the namespace, the interfaces and -
read from that namespace's policy routing over rtnetlink (netsleuth.diagnostics.route.policy) - the rule
and the route.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from netsleuth._generated.route_abi import (
    KIND_COUNT,
    STAT_COUNT,
    NeighKind,
    RouteConfigC,
    RouteEventC,
    RouteEventKind,
    RouteGroupC,
    RouteGroupKeyC,
    RouteMaps,
    RouteObject,
    RouteRodata,
)
from netsleuth.bpf.program_session import TP_BTF_THEN_RAW_TP, ProgramSession
from netsleuth.bpf.skeleton import Skeleton, variant_programs
from netsleuth.diagnostics.filter_maps import fill_address_maps, fill_filter_config
from netsleuth.diagnostics.route.policy import (
    ROUTE_TYPES,
    LookupKey,
    PolicyRule,
    PolicySnapshot,
    RouteEntry,
    read_policy,
    table_name,
)
from netsleuth.diagnostics.route.records import (
    NeighRecord,
    RouteConfig,
    RouteDropRecord,
    RouteGroup,
    RouteLookupRecord,
    RouteRecord,
    RouteSummary,
)
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import EnvironmentProblem, NetsleuthError
from netsleuth.kernel.kconfig import thread_size
from netsleuth.packet import proto_name
from netsleuth.spec.records import WallTime
from netsleuth.spec.summary import ClockPart, Summary, TotalsPart

if TYPE_CHECKING:
    from netsleuth.diagnostics.filters import PacketFilter
    from netsleuth.kernel.context import KernelContext
    from netsleuth.kernel.kallsyms import Kallsyms

__all__ = [
    "NEIGH_FREE_SITES",
    "RouteDiagnostic",
    "RouteNamer",
    "lookup_result",
    "neigh_free_sites",
]

_EVENT_SIZE = ctypes.sizeof(RouteEventC)
_POLICY_REFRESH_S = 2.0  # re-read a namespace's rules/routes at most this often when one is missing
_NEIGH_REASONS = ("NEIGH_CREATEFAIL", "NEIGH_FAILED", "NEIGH_QUEUEFULL", "NEIGH_DEAD")
# Where the packets a FAILED neighbour held are freed (route.bpf.c freed_by_failed_neighbour): IPv6's error
# report frees them without a reason, so these locations count as NEIGH_FAILED.
NEIGH_FREE_SITES = ("neigh_invalidate", "ndisc_error_report")
_PROGRAMS = variant_programs(
    RouteObject,
    (
        "route_fib",
        "route_fib6",
        "route_rx",
        "route_ncreate",
        "route_nupdate",
        "route_ntimer",
        "route_ndead",
        "route_drop",
    ),
    [variant.suffix for variant in TP_BTF_THEN_RAW_TP],
)

# The error a reject route gives (net/ipv4/fib_semantics.c fib_props[]; route.bpf.c turns an IPv6 result's
# type into the same codes, as net/ipv6/route.c fib6_prop[] does) -> its `ip route` type.
_REJECT_TYPES = {-errno.EINVAL: 6, -errno.EHOSTUNREACH: 7, -errno.EACCES: 8}
_NEIGH_NAMES = {
    NeighKind.CREATED: "created",
    NeighKind.FAILED: "failed",
    NeighKind.DEAD: "dead",
    NeighKind.RESOLVED: "resolved",
}
_NUD_NAMES = (
    (0x01, "INCOMPLETE"),
    (0x02, "REACHABLE"),
    (0x04, "STALE"),
    (0x08, "DELAY"),
    (0x10, "PROBE"),
    (0x20, "FAILED"),
    (0x40, "NOARP"),
    (0x80, "PERMANENT"),
)


def lookup_result(err: int) -> str:
    """What a lookup's result means: "route", the reject route's type, or "no match" (-EAGAIN, also a
    `throw` route): the rules go on to the next table."""
    if err == 0:
        return "route"
    if err == -errno.EAGAIN:
        return "no match"
    reject = _REJECT_TYPES.get(err)
    if reject is not None:
        return ROUTE_TYPES[reject]
    return errno.errorcode.get(-err, str(err))


def neigh_free_sites(kallsyms: Kallsyms | None = None) -> list[tuple[int, int]]:
    """[start, end) of each core-kernel function that frees a FAILED neighbour's queued packets; a name the
    kernel lacks (or a kallsyms that hides addresses) is left out: those drops then go uncounted."""
    from netsleuth.kernel.kallsyms import default_kallsyms

    symbols = kallsyms if kallsyms is not None else default_kallsyms()
    sites = []
    try:
        for name in NEIGH_FREE_SITES:
            sites += [
                (symbol.address, symbol.address + symbol.size)
                for symbol in symbols.symbols_named(name)[:1]
                if symbol.size
            ]
    except EnvironmentProblem:
        return []
    return sites


def nud_text(state: int) -> str:
    return "|".join(name for bit, name in _NUD_NAMES if state & bit) or "NONE"


_KIND_NAMES = {
    RouteEventKind.LOOKUP: "lookup",
    RouteEventKind.MISS: "miss",
    RouteEventKind.NEIGH: "neigh",
    RouteEventKind.DROP: "drop",
}


# -- naming --------------------------------------------------------------------------------------------


class PolicyCache:
    """Each namespace's policy routing, read once and again when a lookup names what the copy lacks (a table
    or rule added while tracing), at most every _POLICY_REFRESH_S seconds."""

    def __init__(self, context: KernelContext) -> None:
        self._context = context
        self._snapshots: dict[int, tuple[float, PolicySnapshot | None]] = {}
        self.problems: dict[int, str] = {}

    def snapshot(self, netns: int, stale: bool = False) -> PolicySnapshot | None:
        now = time.monotonic()
        cached = self._snapshots.get(netns)
        if cached is not None and (not stale or now - cached[0] < _POLICY_REFRESH_S):
            return cached[1]
        from netsleuth.kernel.netns import current_netns_inode

        path = None if netns in (0, current_netns_inode()) else self._context.netns_path(netns)
        snapshot: PolicySnapshot | None
        if netns and path is None and netns != current_netns_inode():
            snapshot = None
            self.problems[netns] = (
                f"{self._context.netns_label(netns)} has no `ip netns` name or process to enter it by: "
                "its rules and routes are not named"
            )
        else:
            try:
                snapshot = read_policy(path)
            except (NetsleuthError, OSError) as error:
                snapshot = None
                self.problems[netns] = (
                    f"cannot read the routing of {self._context.netns_label(netns)}: {error}"
                )
        self._snapshots[netns] = (now, snapshot)
        return snapshot

    def explain(
        self, netns: int, table: int, key: LookupKey, err: int
    ) -> tuple[PolicyRule | None, RouteEntry | None]:
        want = (_REJECT_TYPES[err],) if err in _REJECT_TYPES else (1, 2, 3)
        for stale in (False, True):
            snapshot = self.snapshot(netns, stale)
            if snapshot is None:
                return None, None
            rule = snapshot.rule_for(key, table)
            route = snapshot.route_for(table, key.dst, want) if err != -errno.EAGAIN else None
            found_route = route is not None or err == -errno.EAGAIN
            if rule is not None and found_route:
                return rule, route
        return rule, route

    def ifname(self, netns: int, ifindex: int) -> str | None:
        if not ifindex:
            return None
        snapshot = self.snapshot(netns)
        name = snapshot.ifnames.get(ifindex) if snapshot is not None else None
        if name is None and snapshot is not None:
            refreshed = self.snapshot(netns, stale=True)
            name = refreshed.ifnames.get(ifindex) if refreshed is not None else None
        return name or f"if{ifindex}"


def _address(family: int, raw: Any) -> str:
    data = bytes(raw)
    if family == 6:
        return str(ipaddress.IPv6Address(data[:16]))
    return str(ipaddress.IPv4Address(data[:4]))


class RouteNamer:
    """Raw kernel events -> named records, on the run's KernelContext."""

    def __init__(self, context: KernelContext, reasons: dict[int, str]) -> None:
        self.context = context
        self.policy = PolicyCache(context)
        self._reasons = reasons

    def record(self, event: RouteEventC) -> RouteRecord:
        context = self.context
        when = WallTime(context.wall_time(event.time_ns))
        netns_name = context.netns_name(event.netns)
        if event.kind == RouteEventKind.NEIGH:
            return NeighRecord(
                time=when,
                netns=event.netns,
                netns_name=netns_name,
                family=event.family,
                event=_NEIGH_NAMES.get(NeighKind(event.neigh_kind), str(event.neigh_kind))
                if event.neigh_kind in NeighKind._value2member_map_
                else str(event.neigh_kind),
                address=_address(event.family, event.daddr),
                dev=event.ifname.decode(errors="replace"),
                state=nud_text(event.nud_state),
            )
        if event.kind == RouteEventKind.DROP:
            return RouteDropRecord(
                time=when,
                netns=event.netns,
                netns_name=netns_name,
                reason=self._reasons.get(event.reason, str(event.reason)),
                src=_address(event.family, event.saddr) if event.family else None,
                dst=_address(event.family, event.daddr) if event.family else None,
                proto=proto_name(event.l4proto) if event.l4proto else None,
                dev=event.ifname.decode(errors="replace"),
            )
        family = 6 if event.family == 6 else 4
        src = _address(family, event.saddr)
        dst = _address(family, event.daddr)
        key = LookupKey(dst, src, event.iif, event.oif, event.mark, event.l4proto, event.sport, event.dport)
        rule, route = self.policy.explain(event.netns, event.table, key, event.err)
        in_task = bool(event.in_task)
        return RouteLookupRecord(
            time=when,
            netns=event.netns,
            netns_name=netns_name,
            table=event.table,
            table_name=table_name(event.table),
            family=family,
            result=lookup_result(event.err),
            err=event.err,
            src=src,
            dst=dst,
            proto=proto_name(event.l4proto) if event.l4proto else None,
            sport=event.sport or None,
            dport=event.dport or None,
            iif=self.policy.ifname(event.netns, event.iif),
            oif=self.policy.ifname(event.netns, event.oif),
            mark=event.mark,
            gateway=_address(event.gw_family, event.gw) if event.gw_family else None,
            dev=event.ifname.decode(errors="replace") or None,
            rule=rule.text if rule is not None else None,
            route=route.text if route is not None else None,
            pid=event.pid if in_task else None,
            comm=event.comm.decode(errors="replace") if in_task else None,
            cpu=event.cpu,
        )


# -- the session ---------------------------------------------------------------------------------------


class RouteDiagnostic:
    """`route` as a session of the diagnostic model. `packet_filter` is the config's filter already resolved
    on this host (diagnose's, shared by its watches); by default the config's own is resolved now, so a
    namespace or pod this host does not have is an error before anything loads."""

    def __init__(
        self,
        config: RouteConfig,
        context: KernelContext | None = None,
        packet_filter: PacketFilter | None = None,
    ) -> None:
        from netsleuth.kernel.context import KernelContext

        self.config = config
        self._context = context or KernelContext()
        self._own_context = context is None
        self._programs = ProgramSession(
            RouteObject,
            _PROGRAMS,
            mirrors=(("route_event", RouteEventC), ("route_group", RouteGroupC)),
        )
        try:
            self.packet_filter = packet_filter or config.packet_filter(self._context.netns_names)
        except BaseException:
            self.close()
            raise
        self._reasons: dict[int, str] = {}
        self._namer: RouteNamer | None = None
        self._start_notes: list[str] = []

    @property
    def attach_kind(self) -> str:
        return self._programs.attach_kind

    def _kernel_config(self) -> RouteConfigC:
        cfg = RouteConfigC()
        cfg.thread_size = thread_size()
        fill_filter_config(cfg, self.packet_filter)
        cfg.sample_every = self.config.sample
        cfg.errors_only = int(self.config.failed)
        failed_reason = next((value for value, name in self._reasons.items() if name == "NEIGH_FAILED"), 0)
        if failed_reason:
            cfg.neigh_failed_reason = failed_reason
            for site, (start, end) in enumerate(neigh_free_sites()[: len(cfg.neigh_free_start)]):
                cfg.neigh_free_start[site] = start
                cfg.neigh_free_end[site] = end
        if not self.config.summary:
            emitted = [RouteEventKind.LOOKUP, RouteEventKind.NEIGH, RouteEventKind.DROP]
            if self.config.misses:
                emitted.append(RouteEventKind.MISS)
            cfg.emit_mask = sum(1 << kind for kind in emitted)
        return cfg

    def start(self) -> None:
        from netsleuth.bpf import features
        from netsleuth.bpf.features import require_tracepoints
        from netsleuth.kernel.reasons import load_drop_reasons

        family = self.packet_filter.family
        lookups = {4: ["fib_table_lookup"], 6: ["fib6_table_lookup"]}.get(family or 0, ["fib_table_lookup"])
        require_tracepoints([*lookups, "neigh_create", "neigh_update", "neigh_timer_handler"])
        programs = list(_PROGRAMS)
        # -4/-6 leave the other family's lookup program out (cfg.family would only count its lookups as
        # seen). Without either, a kernel built without IPv6 has no fib6 tracepoint: IPv4 is followed, and
        # the summary says so.
        if family == 4:
            programs.remove("route_fib6")
        elif family == 6:
            programs.remove("route_fib")
        elif not features.tracepoint("fib6_table_lookup"):
            programs.remove("route_fib6")
            self._start_notes.append("IPv6 lookups not followed: this kernel has no fib6:fib6_table_lookup")
        if not features.drop_reasons():
            programs.remove("route_drop")  # no drop reasons before 5.17: drops are not told apart
        else:
            reasons = load_drop_reasons()
            for name in _NEIGH_REASONS:
                value = reasons.value(name)
                if value is not None:
                    self._reasons[value] = name
        self._programs.start(
            programs, (RouteRodata.cfg, self._kernel_config()), self._fill_maps, RouteMaps.events
        )
        self._context.prepare(self.packet_filter.netns)
        self._namer = RouteNamer(self._context, self._reasons)

    def _fill_maps(self, route: Skeleton[RouteMaps]) -> None:
        fill_address_maps(route.maps, self.packet_filter)
        reasons = route.maps.neigh_reasons
        for value in self._reasons:
            reasons.update(value.to_bytes(4, "little"), b"\x01")

    @property
    def namer(self) -> RouteNamer:
        if self._namer is None:
            raise NetsleuthError("the route programs are not attached: start() first")
        return self._namer

    def _decode(self, records: list[bytes]) -> list[RouteRecord]:
        namer = self.namer
        return [namer.record(RouteEventC.from_buffer_copy(raw[:_EVENT_SIZE])) for raw in records]

    def poll(self, timeout_ms: int) -> list[RouteRecord]:
        return self._decode(self._programs.poll(timeout_ms))

    def drain(self) -> list[RouteRecord]:
        """The run's last events: the programs stop first (every caller drains once, at its end), so the
        totals and groups read after it are final and agree."""
        return self._decode(self._programs.last_drain())

    def kind_totals(self) -> dict[str, EventTotals]:
        """Exact kernel counts per kind: lookups that decided, table misses, neighbour events, drops."""
        sums = self._programs.counter_sums(RouteMaps.route_stats, KIND_COUNT * STAT_COUNT)
        return {
            _KIND_NAMES[RouteEventKind(kind)]: EventTotals(*sums[kind * STAT_COUNT : (kind + 1) * STAT_COUNT])
            for kind in range(KIND_COUNT)
        }

    def totals(self) -> EventTotals:
        # Table misses are bookkeeping of the rules' walk, not decisions: they count only with --misses.
        by_kind = self.kind_totals()
        total = by_kind["lookup"] + by_kind["neigh"] + by_kind["drop"]
        return total + by_kind["miss"] if self.config.misses else total

    def raw_groups(self) -> Iterator[tuple[RouteGroupKeyC, RouteGroupC]]:
        for key, value in self._programs.entries(RouteMaps.route_groups):
            yield RouteGroupKeyC.from_buffer_copy(key), RouteGroupC.from_buffer_copy(value)

    def groups(self) -> list[RouteGroup]:
        if not self._programs.started:
            return []
        namer = self.namer
        groups = [
            RouteGroup(
                kind=_KIND_NAMES[RouteEventKind(key.kind)],
                count=value.count,
                first_time=WallTime(self._context.wall_time(value.first_ns)),
                last_time=WallTime(self._context.wall_time(value.last_ns)),
                example=namer.record(value.example),
            )
            for key, value in self.raw_groups()
            if self.config.misses or key.kind != RouteEventKind.MISS
        ]
        return sorted(groups, key=lambda group: -group.count)

    def summary(self, interrupted: bool) -> RouteSummary:
        self._programs.stop()  # one read of stopped counters: the total is the groups' sum (+ ungrouped)
        by_kind = self.kind_totals()
        return RouteSummary(
            diagnostic="route",
            **Summary.totals_fields(sum(by_kind.values(), EventTotals())),
            by_kind={kind: TotalsPart.of(totals) for kind, totals in by_kind.items()},
            attach=self.attach_kind,
            interrupted=interrupted,
            clock=ClockPart(**self._context.clock.to_json()),
            problems=tuple(self.notes()),
            groups=tuple(self.groups()),
        )

    def program_fds(self) -> dict[str, int]:
        return self._programs.program_fds()

    def notes(self) -> list[str]:
        policy_notes = list(self._namer.policy.problems.values()) if self._namer is not None else []
        return self._start_notes + policy_notes

    def close(self) -> None:
        self._programs.close()
        if self._own_context:
            self._context.close()
