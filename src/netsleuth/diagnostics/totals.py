"""Exact kernel-side event counts, the same six for every program (drops.h enum drop_stat, tcp.h)."""

from __future__ import annotations

import msgspec

__all__ = ["EventTotals"]


class EventTotals(msgspec.Struct, frozen=True):
    """Every matched event is emitted, sampled or lost (or only counted, in --summary mode)."""

    seen: int = 0  # before filters
    matched: int = 0  # passed every filter: the exact total
    emitted: int = 0  # sent to the ring buffer
    sampled: int = 0  # left out on purpose: 1-in-N, or the ring buffer more than half full
    lost: int = 0  # the ring buffer had no room
    ungrouped: int = 0  # counted in `matched` beyond the group table

    def to_json(self) -> dict[str, int]:
        return {
            "seen": self.seen,
            "total": self.matched,
            "emitted": self.emitted,
            "sampled": self.sampled,
            "lost": self.lost,
            "ungrouped": self.ungrouped,
        }

    def __add__(self, other: EventTotals) -> EventTotals:
        return EventTotals(
            self.seen + other.seen,
            self.matched + other.matched,
            self.emitted + other.emitted,
            self.sampled + other.sampled,
            self.lost + other.lost,
            self.ungrouped + other.ungrouped,
        )
