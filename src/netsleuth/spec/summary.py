"""The closing record every session ends with, and the parts of it every diagnostic shares."""

from __future__ import annotations

import msgspec

from netsleuth.diagnostics.totals import EventTotals
from netsleuth.spec.records import Record

__all__ = ["ClockPart", "Summary", "TotalsPart"]


class ClockPart(msgspec.Struct, frozen=True, kw_only=True):
    """CLOCK_MONOTONIC and the wall clock read at one moment: every record's time is monotonic + offset."""

    monotonic_ns: int
    wall_ns: int
    offset_ns: int


class Summary(Record, frozen=True, kw_only=True, tag="summary"):
    """Exact totals of a run: every matched event was emitted, sampled away or lost (`total` = matched).

    kw_only (here and in every subclass) keeps the fields in the order they are declared, the base's first:
    the JSON reads `type`, `v`, `diagnostic`... (msgspec puts keyword-only fields after the others, so
    without it the inherited `v` came after `clock`, or last)."""

    diagnostic: str
    seen: int
    total: int  # every event that matched the filters: exact
    emitted: int
    sampled: int
    lost: int
    ungrouped: int
    attach: str
    interrupted: bool
    clock: ClockPart
    # Set by an agent or fleet session that cut a summary's `groups` to fit its byte cap: how many it left
    # out (netsleuth.agent.sessions, netsleuth.fleet.session_runner). Unset, it is not in the JSON.
    groups_omitted: int | msgspec.UnsetType = msgspec.UNSET

    @property
    def totals(self) -> EventTotals:
        return EventTotals(self.seen, self.total, self.emitted, self.sampled, self.lost, self.ungrouped)

    @staticmethod
    def totals_fields(totals: EventTotals) -> dict[str, int]:
        """The totals as this record's fields: `Summary(**Summary.totals_fields(t), ...)`."""
        return {
            "seen": totals.seen,
            "total": totals.matched,
            "emitted": totals.emitted,
            "sampled": totals.sampled,
            "lost": totals.lost,
            "ungrouped": totals.ungrouped,
        }


class TotalsPart(msgspec.Struct, frozen=True, kw_only=True):
    """Exact totals of one part of a run (one kind of event, one direction): the summary's own six keys,
    nested (`by_kind`, resets' `sent`)."""

    seen: int
    total: int
    emitted: int
    sampled: int
    lost: int
    ungrouped: int

    @classmethod
    def of(cls, totals: EventTotals) -> TotalsPart:
        return cls(**Summary.totals_fields(totals))

    @property
    def totals(self) -> EventTotals:
        return EventTotals(self.seen, self.total, self.emitted, self.sampled, self.lost, self.ungrouped)
