"""`diagnose`'s typed config and its records: the verdicts (netsleuth.spec.verdict) and the summary."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from netsleuth.spec.common import PacketConfig
from netsleuth.spec.options import Opt
from netsleuth.spec.records import Record
from netsleuth.spec.summary import ClockPart, TotalsPart
from netsleuth.spec.verdict import Verdict

__all__ = ["DEFAULT_DURATION", "DiagnoseConfig", "DiagnoseSummary", "Verdict"]

DEFAULT_DURATION = 10.0
MAX_DURATION = 3600.0

WindowSeconds = Annotated[
    float,
    Meta(gt=0, le=MAX_DURATION, extra={"words": f"a number of seconds over 0 and at most {MAX_DURATION:g}"}),
]


class DiagnoseConfig(PacketConfig, frozen=True, kw_only=True):
    """A packet diagnostic's filters (every watch of the window takes them) and the window's length.

    A diagnosis always counts in the kernel and reports at the end: `summary` and `sample` mean nothing to it
    and are no flags or form fields (a JSON config may still carry them, as it always could)."""

    summary: Annotated[bool, Opt("counted in the kernel: always", cli=False, form=False)] = True
    sample: Annotated[int, Opt("every event counts: always 1", cli=False, form=False)] = 1
    duration: Annotated[
        WindowSeconds, Opt(f"how long to watch (default {DEFAULT_DURATION:g})", metavar="SECONDS")
    ] = DEFAULT_DURATION


class DiagnoseSummary(Record, frozen=True, kw_only=True, tag="summary"):
    """The window's end. Not a spec.summary.Summary: diagnose emits no events of its own, so its exact totals
    are its drops watch's, under `drops` (netsleuth's own footprint left out of them, counted in
    `own_drops`)."""

    diagnostic: str = "diagnose"
    seconds: float
    watched: str  # "netns db", "pod team-a/web-1, netns cni-...", "this host"
    verdicts: int  # how many: the verdicts themselves come before it, ranked, as their own records
    drops: TotalsPart
    own_drops: int  # netsleuth's own footprint (its firewall reads' purged netlink messages), not in `drops`
    all_good: tuple[str, ...]  # the path checks doctor found nothing wrong with
    problems: tuple[str, ...]  # what could not be watched, and why
    attach: str
    interrupted: bool
    clock: ClockPart
