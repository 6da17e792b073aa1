"""A verdict: one cause in plain words, the evidence for it, and the fix. Ranked worst first, on the same
`Severity` scale as doctor's findings (it is that one enum).

Every verdict names its cause by a code of the one catalogue (netsleuth.diagnostics.causes), `cause_code`,
whatever made it (drops, DNS, routing, softirqs, doctor); `category` is the kind of verdict (`firewall`,
`dns-timeout-firewall`, `path:gro-off`...). The ranking is a total order on what the verdicts say, so equal
verdicts come in the same order in every run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from netsleuth.diagnostics.causes import CATALOGUE
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
    cause_code: str = field(kw_only=True)  # the cause's code in netsleuth.diagnostics.causes

    def __post_init__(self) -> None:
        if self.cause_code not in CATALOGUE:  # a programming error: the tests make every kind of verdict
            raise ValueError(f"verdict {self.category!r}: cause code {self.cause_code!r} is not catalogued")

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


_NUMBERS = re.compile(r"\d+")


def _order(verdict: Verdict) -> tuple[Any, ...]:
    """Worst severity, most events; then what the verdict is about in words with its numbers left out (pids,
    ports, inodes differ from run to run), then the words themselves and the evidence: a total order, so no
    tie is left to the order the verdicts were made in (kernel map order, dict order)."""
    return (
        verdict.severity,
        -verdict.events,
        verdict.cause_code,
        verdict.category,
        _NUMBERS.sub("#", verdict.cause),
        verdict.cause,
        json.dumps(verdict.evidence, sort_keys=True, default=str),
        verdict.fix,
    )


def rank(verdicts: list[Verdict]) -> list[Verdict]:
    """Worst severity first; within one, the cause with the most events behind it; ties by `_order`."""
    return sorted(verdicts, key=_order)
