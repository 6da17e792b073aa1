"""Text and JSON renderings of a doctor `Report`. The console is a parameter (tests pass a recording one).

JSON is one object per run: {"interval_seconds", "findings": [...], "all_good": [...], "notes": [...]}
(docs/doctor.md).
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from netsleuth.doctor.findings import Finding, Report, Severity

__all__ = ["render_json", "render_text"]

_STYLE = {Severity.CRITICAL: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def _evidence_text(evidence: dict[str, Any]) -> str:
    parts = []
    for key, value in evidence.items():
        shown = json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else str(value)
        parts.append(f"{key}={shown}")
    return ", ".join(parts)


def _render_finding(console: Console, finding: Finding) -> None:
    style = _STYLE[finding.severity]
    console.print(f"  [{style}]●[/] [bold]{escape(finding.title)}[/]  [dim]\\[{escape(finding.id)}][/]")
    console.print(f"    [dim]evidence:[/] {escape(_evidence_text(finding.evidence))}")
    console.print(f"    {escape(finding.explanation)}")
    for command in finding.fix_commands:
        console.print(f"    [green]fix:[/] {escape(command)}")
    for line in finding.persistent:
        console.print(f"    [dim]persist:[/] {escape(line)}")
    if finding.apply_command:
        console.print(f"    [dim]apply with:[/] {escape(finding.apply_command)}")


def render_text(report: Report, console: Console) -> None:
    console.print(f"[bold]netsleuth doctor[/]: rates over {report.interval:.1f} s")
    for severity in Severity:
        group = [finding for finding in report.findings if finding.severity == severity]
        if not group:
            continue
        console.print()
        console.print(f"[{_STYLE[severity]}]{severity.label.upper()} ({len(group)})[/]")
        for finding in group:
            _render_finding(console, finding)
    if not report.findings:
        console.print()
        console.print("[green]No findings.[/]")
    if report.all_good:
        console.print()
        console.print("[green]All good[/]")
        for line in report.all_good:
            console.print(f"  [green]✓[/] {escape(line)}")
    for note in report.notes:
        console.print(f"[dim]note: {escape(note)}[/]")


def render_json(report: Report) -> str:
    return json.dumps(report.to_json(), sort_keys=False)
