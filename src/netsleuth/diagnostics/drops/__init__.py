"""`drops`: every packet the kernel frees with a drop reason (tracepoint skb:kfree_skb, bpf/drops.bpf.c) -
why (the kernel's drop reason), where (the function), whose (the process that really owns the packet), in
which namespace, pod and device, and for a firewall's drop which rule.

Every filter of a packet applies in the kernel, and --reason/--exclude-reason select the kernel's reasons
there too; totals are exact whatever is sampled or lost on the way. On a terminal, `--pcap FILE` also writes
the packets as pcapng and `--vmlinux PATH` adds source lines (cli.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from netsleuth.diagnostics.drops.records import DropRecord, DropsConfig, DropsSummary
from netsleuth.spec.collectors import ExporterCollector
from netsleuth.spec.diagnose import DiagnoseWatch, lazy
from netsleuth.spec.diagnostic import CliRun, DiagnosticSpec
from netsleuth.spec.scope import ScopeTraits

if TYPE_CHECKING:
    import argparse

    from netsleuth.diagnostics.drops.session import DropsDiagnostic
    from netsleuth.diagnostics.drops.view import DropsView
    from netsleuth.kernel.context import KernelContext

__all__ = ["DIAGNOSTIC"]


def _open(config: DropsConfig, context: KernelContext | None) -> DropsDiagnostic:
    from netsleuth.diagnostics.drops.session import open_drops

    return open_drops(config, context)


def _view(_config: DropsConfig) -> DropsView:
    from netsleuth.diagnostics.drops.view import DropsView

    return DropsView()


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from netsleuth.diagnostics.drops.cli import add_arguments

    add_arguments(parser)


def _run(config: DropsConfig, args: argparse.Namespace) -> int:
    from netsleuth.diagnostics.drops.cli import run

    return run(config, args)


_RULES = "netsleuth.diagnostics.drops.rules"  # its part of `diagnose`
_COLLECTOR = "netsleuth.diagnostics.drops.collector"  # its part of the agent's exporter

DIAGNOSTIC: DiagnosticSpec[DropsConfig] = DiagnosticSpec(
    name="drops",
    help="every dropped packet: why (kernel drop reason), where, whose, and which firewall rule",
    config=DropsConfig,
    records=(DropRecord, DropsSummary),
    open=_open,
    objects=("drops",),
    # Drops carry their namespace and addresses: both scopes are kept in the kernel (the namespace and the
    # "either address" filters) and checked on every record.
    # A fleet session of drops ships this host's conntrack entries of its flows (the join across a DNAT).
    scope=ScopeTraits(netns_field="netns", address_field="host", joins_conntrack=True),
    view=_view,
    cli=CliRun(add_arguments=_add_arguments, run=_run),
    needs=("can_trace", "btf", "raw_tp"),  # tp_btf, or raw_tp where it is missing; a perf buffer will do
    diagnose=DiagnoseWatch(
        watched="drops",
        open=lazy(_RULES, "open_watch"),
        rules=lazy(_RULES, "diagnose_verdicts"),
        required=True,  # kfree_skb: the drops every other verdict is weighed against
        progress=lazy(_RULES, "progress"),
        own_events=lazy(_RULES, "own_drops"),
        notes=lazy(_RULES, "notes"),
    ),
    # The agent's exporter: exact drop counters by reason, location and namespace ([exporter.drops]). The
    # first attached collector (drops is the registry's first diagnostic): its attach kind is the agent's.
    collectors=(
        ExporterCollector(
            "drops",
            enabled=lambda exporter: exporter.drops.enabled,
            collector=lazy(_COLLECTOR, "open_collector"),
            source=lazy(_COLLECTOR, "open_source"),
        ),
    ),
)
