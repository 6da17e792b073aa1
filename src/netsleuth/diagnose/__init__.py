"""`diagnose`: path health and what every diagnostic that contributes to it sees (drops, resets and
retransmits, DNS, routing, NET_RX budgets), watched together for one window and turned into ranked verdicts
with evidence and fixes.

Its watches are not named here: each comes from a diagnostic's spec (`diagnose=DiagnoseWatch(...)`,
netsleuth.spec.diagnose), iterated from the registry (run.py). What spans two of them - one fault seen by
two diagnostics, or by one and doctor - is joined in correlate.py.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from netsleuth.diagnose.records import DiagnoseConfig, DiagnoseSummary, Verdict
from netsleuth.spec.diagnostic import CliRun, DiagnosticSpec
from netsleuth.spec.scope import ScopeTraits

if TYPE_CHECKING:
    from netsleuth.diagnose.run import DiagnosisSession
    from netsleuth.kernel.context import KernelContext

__all__ = ["DIAGNOSTIC"]


def _open(config: DiagnoseConfig, context: KernelContext | None) -> DiagnosisSession:
    from netsleuth.diagnose.run import DiagnosisSession

    return DiagnosisSession(config, context)


def _run(config: DiagnoseConfig, args: argparse.Namespace) -> int:
    """The terminal's run: the progress line says what the window has seen so far, then the verdicts."""
    from netsleuth.commands._runloop import run_session
    from netsleuth.diagnose.run import DiagnosisSession
    from netsleuth.diagnose.view import DiagnoseView

    session = DiagnosisSession(config)
    view = DiagnoseView(session)
    return run_session(
        session, config, view, json_lines=args.json, ready_file=args.ready_file, status=view.status
    )


DIAGNOSTIC: DiagnosticSpec[DiagnoseConfig] = DiagnosticSpec(
    name="diagnose",
    help="watch drops, resets, retransmits, DNS, routing and path health together; print ranked verdicts "
    "with fixes",
    config=DiagnoseConfig,
    records=(Verdict, DiagnoseSummary),
    open=_open,
    # Every watch takes diagnose's filters, so the kernel keeps each inside the namespace and addresses;
    # every verdict says which namespace and addresses it concerns (a NET_RX budget's: none, the machine's).
    scope=ScopeTraits(netns_field="netns", address_field="host", joins_conntrack=True),
    needs=("can_trace", "btf", "raw_tp"),  # tp_btf, or raw_tp where it is missing; a perf buffer will do
    cli=CliRun(run=_run),  # its view reads the session's progress
)
