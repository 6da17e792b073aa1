"""Cardinality guard: at most N label sets get their own series, every other one is summed into `other`.

Which ones: the largest, among those present when a slot is free. A label set admitted keeps its series
while it exists; one summed into `other` stays there. Moving a label set *out of* `other` later (when it
grows past an admitted one) would make `other` go down, and Prometheus reads a falling counter as a reset,
so the choice is sticky. Sums stay exact either way: `sum(metric)` is the kernel's total at every scrape.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

__all__ = ["OTHER", "SeriesGuard"]

OTHER = "other"

Key = TypeVar("Key", bound=Hashable)


class SeriesGuard(Generic[Key]):
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a series limit must be at least 1")
        self.limit = limit
        self._admitted: set[Key] = set()
        self._folded: set[Key] = set()
        self._lock = threading.Lock()

    def admit(self, totals: Mapping[Key, int]) -> frozenset[Key]:
        """The keys that get their own series this scrape, given every present key's running total.

        Keys no longer present (retired) free their slot; new keys fill free slots largest first; a key
        that once found no slot is never promoted."""
        with self._lock:
            self._admitted &= totals.keys()
            self._folded &= totals.keys()
            fresh = [key for key in totals if key not in self._admitted and key not in self._folded]
            fresh.sort(key=lambda key: -totals[key])
            free = self.limit - len(self._admitted)
            self._admitted.update(fresh[: max(free, 0)])
            self._folded.update(fresh[max(free, 0) :])
            return frozenset(self._admitted)

    @property
    def folded(self) -> int:
        """How many present label sets are summed into `other` (a self-metric: raise the limit?)."""
        with self._lock:
            return len(self._folded)
