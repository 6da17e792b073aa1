"""The verdict: one cause in plain words, the evidence for it, and the fix - the record `diagnose` prints,
made by the verdict rules each diagnostic contributes (netsleuth.spec.diagnose) and by diagnose's own path and
listener checks.

Every verdict names its cause by a code of the one catalogue (netsleuth.diagnostics.causes), `cause_code`,
whatever made it; `category` is the kind of verdict (`firewall`, `dns-timeout-firewall`, `path:gro-off`...),
on the same `Severity` scale as doctor's findings (that one enum). What the verdict concerns is in typed
fields: the network namespace (`netns`) and addresses (`saddr`, `daddr`) a fleet scope keeps it inside by
(spec.scope.RecordScope), and the firewall rule it names (`firewall_rule`), by which diagnose tells two
verdicts of one fault apart from two faults (netsleuth.diagnose.correlate).
"""

from __future__ import annotations

from typing import Any

from netsleuth.doctor.findings import Severity
from netsleuth.spec.records import Record
from netsleuth.spec.scope import AddressField, NetnsField

__all__ = ["Severity", "Verdict"]


class Verdict(Record, frozen=True, kw_only=True, tag="verdict"):
    rank: int = 0  # 1 for the worst, once diagnose has ranked every verdict of the window (0 before)
    severity: Severity
    category: str  # stable machine name: "firewall", "no-listener", "listen-overflow", "udp-rcvbuf", ...
    cause: str  # one sentence a person paged at 3 a.m. can act on
    cause_code: str  # the cause's code in netsleuth.diagnostics.causes
    # Free-form: each kind of verdict has its own facts (a drop group's counts and example, a DNS verdict's
    # names and processes, a doctor finding's device counters, the NET_RX runs per CPU); people and the text
    # view read them, and nothing decides on their keys - what correlation and the scope read is typed above
    # and below.
    evidence: dict[str, Any]
    fix: tuple[str, ...]
    absorbed_findings: tuple[str, ...] = ()  # doctor finding ids (or rules, before merging) this explains
    events: int = 0  # how many kernel events back it (drops, resets...), the tie-breaker within a severity
    # Where it happened: the namespace whose packets, sockets or settings it is about (null: the whole
    # machine, e.g. a CPU's NET_RX budget), and the flow's addresses where it is about one.
    netns: NetnsField | None = None
    saddr: AddressField = None
    daddr: AddressField = None
    firewall_rule: str | None = None  # the rule it names as the cause, as the firewall's listing shows it

    def __post_init__(self) -> None:
        from netsleuth.diagnostics.causes import CATALOGUE

        if self.cause_code not in CATALOGUE:  # a programming error: the tests make every kind of verdict
            raise ValueError(f"verdict {self.category!r}: cause code {self.cause_code!r} is not catalogued")
