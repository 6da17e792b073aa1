"""A verdict: one cause in plain words, the evidence for it, and the fix. Ranked worst first, on the same
`Severity` scale as doctor's findings (it is that one enum)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from netsleuth.doctor.findings import Severity

__all__ = ["Severity", "Verdict", "rank"]


@dataclass(frozen=True)
class Verdict:
    category: str  # stable machine name: "firewall", "no-listener", "listen-overflow", "udp-rcvbuf", ...
    severity: Severity
    cause: str  # one sentence a person paged at 3 a.m. can act on
    evidence: dict[str, Any]
    fix: tuple[str, ...]
    events: int = 0  # how many kernel events back it (drops, resets...), the tie-breaker within a severity
    absorbed: tuple[str, ...] = field(default=())  # doctor finding ids this verdict explains
    cause_code: str | None = None  # the cause's code in netsleuth.diagnostics.causes, when it has one

    def to_json(self, rank: int) -> dict[str, Any]:
        return {
            "type": "verdict",
            "rank": rank,
            "severity": self.severity.label,
            "category": self.category,
            "cause": self.cause,
            "cause_code": self.cause_code,
            "evidence": self.evidence,
            "fix": list(self.fix),
            "absorbed_findings": list(self.absorbed),
        }


def rank(verdicts: list[Verdict]) -> list[Verdict]:
    """Worst severity first; within one, the cause with the most events behind it."""
    return sorted(verdicts, key=lambda verdict: (verdict.severity, -verdict.events, verdict.category))
