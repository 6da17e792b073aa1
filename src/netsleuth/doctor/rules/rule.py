"""What a rule is: a named check of one theme on a `Window`, giving findings or the line for the report's
"all good" list. Its own module so the rule modules and the package that lists them import it, not each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from netsleuth.doctor.findings import Finding
from netsleuth.doctor.window import Window

__all__ = ["Rule", "Verdict"]

Verdict = tuple[list[Finding], str]


@dataclass(frozen=True)
class Rule:
    name: str
    check: Callable[[Window], Verdict]
