"""Text rendering of diagnose's ranked verdicts."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from netsleuth.diagnose.verdicts import Severity, Verdict

__all__ = ["print_verdicts"]

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
    for rank, verdict in enumerate(verdicts, start=1):
        label = f"[{_STYLE[verdict.severity]}]{verdict.severity.label.upper()}[/]"
        console.print(f"\n{rank}. {label} {escape(verdict.cause)}")
        evidence = _evidence_line(verdict)
        if evidence:
            console.print(f"   [dim]evidence:[/dim] {escape(evidence)}")
        for finding in verdict.evidence.get("path_health", []):
            console.print(f"   [dim]path health:[/dim] {escape(finding['title'])} ({escape(finding['id'])})")
        for step in verdict.fix:
            console.print(f"   [dim]fix:[/dim] {escape(step)}")
