"""`netsleuth diagnose` as text: a progress line while it watches, then the ranked verdicts with their
evidence and fixes."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.markup import escape

from netsleuth.diagnostics.totals import EventTotals
from netsleuth.spec.verdict import Severity, Verdict

if TYPE_CHECKING:
    from rich.console import Console

    from netsleuth.diagnose.records import DiagnoseSummary
    from netsleuth.diagnose.run import DiagnosisSession

__all__ = ["DiagnoseView", "print_verdicts"]

_STYLE = {Severity.CRITICAL: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_EVIDENCE_SHOWN = (
    "drops",
    "timeouts",
    "dns_drops",
    "rate_per_s",
    "resets_sent",
    "example",
    "process",
    "processes",
    "location",
    "stack_top",
    "subject",
)


class DiagnoseView:
    """Verdicts are judged at the end of the window: nothing to print while watching but the progress."""

    noun = "drops"

    def __init__(self, session: DiagnosisSession) -> None:
        self._session = session
        self._verdicts: list[Verdict] = []

    def status(self) -> str:
        return self._session.progress()

    def lines(self, records: Sequence[Verdict]) -> str:
        self._verdicts.extend(records)  # printed with the summary: the window's verdicts come at its end
        return ""

    def finish(self, summary: DiagnoseSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console

        console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200)
        print_verdicts(console, self._verdicts, summary.seconds, summary.watched)

    def loss_line(self, totals: EventTotals) -> str:
        return ""


def _evidence_line(verdict: Verdict) -> str:
    parts = []
    for key in _EVIDENCE_SHOWN:
        value = verdict.evidence.get(key)
        if value in (None, [], ""):
            continue
        if key == "process":
            value = f"{value['comm']}[{value['pid']}]"
        elif key == "processes":
            shown = [f"{process['comm']}[{process['pid']}]" for process in value[:5]]
            value = ", ".join(shown) + (f" and {len(value) - 5} more" if len(value) > 5 else "")
        elif key == "stack_top":
            value = " < ".join(value)
        parts.append(f"{key.replace('_', ' ')}: {value}")
    return "; ".join(parts)


def print_verdicts(console: Console, verdicts: Sequence[Verdict], seconds: float, watched: str) -> None:
    console.print(f"Watched {watched} for {seconds:.1f} s.")
    if not verdicts:
        console.print(
            "[green]No problem found[/green]: no drops, resets or path-health findings in this window."
        )
        return
    for verdict in verdicts:
        label = f"[{_STYLE[verdict.severity]}]{verdict.severity.label.upper()}[/]"
        console.print(f"\n{verdict.rank}. {label} {escape(verdict.cause)}")
        evidence = _evidence_line(verdict)
        if evidence:
            console.print(f"   [dim]evidence:[/dim] {escape(evidence)}")
        for finding in verdict.evidence.get("path_health", []):
            console.print(f"   [dim]path health:[/dim] {escape(finding['title'])} ({escape(finding['id'])})")
        for step in verdict.fix:
            console.print(f"   [dim]fix:[/dim] {escape(step)}")
