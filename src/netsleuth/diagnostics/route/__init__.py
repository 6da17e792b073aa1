"""`route`: the kernel's IPv4 and IPv6 route lookups (fib:fib_table_lookup, fib6:fib6_table_lookup) and
their next hops' neighbour resolution (neigh:*: ARP and neighbour discovery), with the `ip rule`, table and
prefix that decided each one, and packets lost to a next hop that never answered (bpf/route.bpf.c).

Every filter of a packet applies, in the kernel; `--failed` keeps only reject routes, failed or dead next
hops and their drops, `--misses` adds the tables the rules tried without a match.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from netsleuth.diagnostics.route.records import (
    NeighRecord,
    RouteConfig,
    RouteDropRecord,
    RouteLookupRecord,
    RouteSummary,
)
from netsleuth.spec.diagnose import DiagnoseWatch, lazy
from netsleuth.spec.diagnostic import DiagnosticSpec
from netsleuth.spec.scope import ScopeTraits

if TYPE_CHECKING:
    from netsleuth.diagnostics.model import DiagnosticSession
    from netsleuth.diagnostics.route.view import RouteView
    from netsleuth.kernel.context import KernelContext

__all__ = ["DIAGNOSTIC"]


def _open(config: RouteConfig, context: KernelContext | None) -> DiagnosticSession:
    from netsleuth.diagnostics.route.session import RouteDiagnostic

    return RouteDiagnostic(config, context)


def _view(_config: RouteConfig) -> RouteView:
    from netsleuth.diagnostics.route.view import RouteView

    return RouteView()


DIAGNOSTIC: DiagnosticSpec[RouteConfig] = DiagnosticSpec(
    name="route",
    help="the kernel's route lookups: ip rule, table, prefix, next hop and whether its neighbour resolved",
    config=RouteConfig,
    records=(RouteLookupRecord, NeighRecord, RouteDropRecord, RouteSummary),
    open=_open,
    objects=("route",),
    # Lookups, neighbours and drops carry their namespace and addresses: both scopes are kept in the kernel
    # (the namespace and the "either address" filters) and checked on every record.
    scope=ScopeTraits(netns_field="netns", address_field="host"),
    view=_view,
    needs=("can_trace", "btf", "raw_tp", "ring_buffer"),  # tp_btf, or raw_tp where it is missing
    diagnose=DiagnoseWatch(
        watched="routing",
        open=lazy("netsleuth.diagnostics.route.rules", "open_watch"),
        rules=lazy("netsleuth.diagnostics.route.rules", "diagnose_verdicts"),
    ),
)
