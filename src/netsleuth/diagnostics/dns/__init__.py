"""`dns`: every DNS query a process sends, joined with its answer in the kernel (bpf/dns.bpf.c): which process
asked, which server, how long, what came back - and what never came back, with the drop behind it.

Answers are filtered in the kernel by response code (--rcode) and latency (--slow) besides the packet
filters; `--summary` groups by process, server and name suffix, with search-list amplification.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from netsleuth.diagnostics.dns.records import (
    DnsAnswer,
    DnsConfig,
    DnsDrop,
    DnsSummary,
    DnsTimeout,
    DnsUnmatched,
)
from netsleuth.spec.collectors import ExporterCollector
from netsleuth.spec.diagnose import DiagnoseWatch, lazy
from netsleuth.spec.diagnostic import DiagnosticSpec

if TYPE_CHECKING:
    from netsleuth.diagnostics.dns.view import DnsView
    from netsleuth.diagnostics.model import DiagnosticSession
    from netsleuth.kernel.context import KernelContext

__all__ = ["DIAGNOSTIC"]

_COLLECTOR = "netsleuth.diagnostics.dns.collector"  # its part of the agent's exporter


def _open(config: DnsConfig, context: KernelContext | None) -> DiagnosticSession:
    from netsleuth.diagnostics.dns.session import DnsDiagnostic

    return DnsDiagnostic(config, context)


def _view(_config: DnsConfig) -> DnsView:
    from netsleuth.diagnostics.dns.view import DnsView

    return DnsView()


DIAGNOSTIC: DiagnosticSpec[DnsConfig] = DiagnosticSpec(
    name="dns",
    help="every DNS query and its answer: which process asked, which server, how long, what came back, "
    "and what never came back",
    config=DnsConfig,
    records=(DnsAnswer, DnsTimeout, DnsUnmatched, DnsDrop, DnsSummary),
    open=_open,
    objects=("dns",),
    # The defaults: the kernel filters the namespace (`netns`) and "either address" (`host`); every record
    # names its namespace and carries the client's and the server's addresses.
    view=_view,
    needs=("can_trace", "btf", "raw_tp", "ring_buffer"),  # tp_btf, or raw_tp where it is missing
    diagnose=DiagnoseWatch(
        watched="DNS",
        open=lazy("netsleuth.diagnostics.dns.rules", "open_watch"),
        rules=lazy("netsleuth.diagnostics.dns.rules", "diagnose_verdicts"),
        keep=10_000,  # enough evidence for any verdict; a storm's rest is in the kernel's counts
    ),
    # The agent's exporter: per-server counters in the kernel ([exporter.dns], off by default).
    collectors=(
        ExporterCollector(
            "dns",
            enabled=lambda exporter: exporter.dns.enabled,
            collector=lazy(_COLLECTOR, "open_collector"),
            source=lazy(_COLLECTOR, "open_source"),
        ),
    ),
)
