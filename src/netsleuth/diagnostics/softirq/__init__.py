"""`softirq`: per CPU and vector, how long raised softirqs wait (raise -> entry) and run (entry -> exit); per
NAPI instance, polls and packets against budget; per NET_RX run, whether it stopped on the packet budget or
the time limit (bpf/softirq.bpf.c). Counted in the kernel, reported at the end in one summary record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from netsleuth.diagnostics.softirq.records import SoftirqConfig, SoftirqSummary
from netsleuth.spec.diagnose import DiagnoseWatch, lazy
from netsleuth.spec.diagnostic import DiagnosticSpec
from netsleuth.spec.scope import ScopeTraits

if TYPE_CHECKING:
    from netsleuth.diagnostics.model import DiagnosticSession
    from netsleuth.diagnostics.softirq.view import SoftirqView
    from netsleuth.kernel.context import KernelContext

__all__ = ["DIAGNOSTIC"]


def _open(config: SoftirqConfig, context: KernelContext | None) -> DiagnosticSession:
    from netsleuth.diagnostics.softirq.session import SoftirqDiagnostic

    return SoftirqDiagnostic(config, context)


def _view(config: SoftirqConfig) -> SoftirqView:
    from netsleuth.diagnostics.softirq.view import SoftirqView

    return SoftirqView(per_cpu=bool(config.vector))


DIAGNOSTIC: DiagnosticSpec[SoftirqConfig] = DiagnosticSpec(
    name="softirq",
    help="softirq wait and run time per CPU and vector; NAPI polls and packets against budget",
    config=SoftirqConfig,
    records=(SoftirqSummary,),
    open=_open,
    objects=("softirq",),
    # Its --netns only chooses which NAPI instances are shown: the per-CPU figures are every namespace's.
    scope=ScopeTraits(
        netns_field=None,
        address_field=None,
        host_wide_only=(
            "its per-CPU softirq histograms count every namespace's packets and carry no namespace"
        ),
    ),
    view=_view,
    needs=("can_trace", "btf", "raw_tp", "ring_buffer"),  # tp_btf, or raw_tp where it is missing
    diagnose=DiagnoseWatch(
        watched="softirqs",
        open=lazy("netsleuth.diagnostics.softirq.rules", "open_watch"),
        rules=lazy("netsleuth.diagnostics.softirq.rules", "diagnose_verdicts"),
    ),
)
