"""Ranking: the verdicts of one window worst first, in a total order on what they say, so equal verdicts
come in the same order in every run."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from netsleuth.spec.verdict import Severity, Verdict

__all__ = ["Severity", "Verdict", "rank"]

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
    """Worst severity first; within one, the cause with the most events behind it; ties by `_order`. Each
    verdict carries its place (`rank`, from 1)."""
    return [
        msgspec.structs.replace(verdict, rank=number)
        for number, verdict in enumerate(sorted(verdicts, key=_order), start=1)
    ]
