"""The last line of a task's scope on the agent: no record outside it leaves the host, and what was held back
is counted.

The first line is in the kernel: admission.py resolves the scope once (spec.scope.Scope: namespaces as
inodes, address ranges, a Kubernetes namespace's pods) and pushes it into the fields the diagnostic's
`ScopeTraits` name, and its narrowing hook confines what reaches further (conn's drop program and NAT lookups
watch every namespace by design). This module checks every record the session is about to send anyway,
because a diagnostic can still join facts from elsewhere in user space (a conntrack lookup, a host-wide
softirq verdict) and a scope the agent promised to keep must not depend on every diagnostic getting that
right.

A typed record is checked by its field types (spec.scope.RecordScope): every field typed `NetnsField` must
name a namespace of the scope, every pod (`K8sNamespaceField`) be of the scope's Kubernetes namespace, and a
record carrying addresses (`AddressField`) must have one inside the scope's ranges - at any depth. A
summary always leaves, keeping only its groups inside the scope; a record that carries neither a namespace
nor an address (a profile stack) passes only a host-wide scope. The session's own conntrack records
(fleet/conntrack_records.py) are the only ones that are not typed: they name where they were read by its
label and carry their tuples' addresses, checked as such; any other untyped record is withheld.

Everything withheld is counted (`withheld_records`, `withheld_entries`), and the host's `ended` status says
so: totals stay honest when the agent holds something back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import msgspec

from netsleuth.spec.scope import NetnsLabels, RecordScope, Scope

__all__ = ["ScopeFilter"]


class ScopeFilter:
    """Checks records against one task's scope and counts what it holds back. Thread-safe counters: the
    session thread filters, the status is read from the same thread, but nothing here assumes it."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self._typed = RecordScope(scope)
        self._labels: NetnsLabels | None = None  # made on the first conntrack record
        self._lock = threading.Lock()
        self.withheld_records = 0
        self.withheld_entries = 0  # summary groups, timeline entries, NAT hops removed from kept records

    @property
    def withheld(self) -> int:
        return self.withheld_records + self.withheld_entries

    def note(self) -> str | None:
        """The sentence for the host's status, when anything was held back."""
        if not self.withheld:
            return None
        parts = []
        if self.withheld_records:
            parts.append(f"{self.withheld_records} record(s)")
        if self.withheld_entries:
            parts.append(f"{self.withheld_entries} entr(ies) of kept records")
        return (
            f"withheld {self.withheld} out-of-scope ({' and '.join(parts)}; scope: {self.scope.describe()})"
        )

    def _conntrack_inside(self, record: Any) -> bool:
        """A conntrack record (a dict: `conntrack` or `conntrack_stats`) is inside when the namespace it was
        read in is the scope's and, under an address scope, one of its tuples' addresses is inside."""
        if not isinstance(record, dict) or record.get("type") not in ("conntrack", "conntrack_stats"):
            return False  # nothing else travels untyped: what cannot be judged does not leave
        if self._labels is None:
            self._labels = NetnsLabels(self.scope)
        if not self._labels.holds(record.get("netns")):
            return False
        tuples = [record.get(direction) for direction in ("orig", "reply")]
        addresses = [
            flow[key] for flow in tuples if isinstance(flow, dict) for key in ("src", "dst") if key in flow
        ]
        return not (self.scope.networks and addresses) or any(
            isinstance(address, str) and self.scope.holds_address(address) for address in addresses
        )

    def _narrow(self, record: Any) -> tuple[Any | None, int]:
        if isinstance(record, msgspec.Struct):
            return self._typed.narrow(record)
        return (record if self._conntrack_inside(record) else None), 0

    def keep(self, records: Iterable[Any]) -> list[Any]:
        """The records (some narrowed) that may leave the host; the rest counted."""
        if self.scope.host_wide:
            return list(records)
        kept = []
        withheld = entries = 0
        for record in records:
            narrowed, removed = self._narrow(record)
            entries += removed
            if narrowed is None:
                withheld += 1
            else:
                kept.append(narrowed)
        with self._lock:
            self.withheld_records += withheld
            self.withheld_entries += entries
        return kept

    def keep_alike(self, record: Any, count: int) -> bool:
        """Whether `count` records alike `record` - the same but for their time, as a batch's drops of one
        kind (netsleuth.diagnostics.drops.batch) - may leave the host; counted as `keep` would count them.
        Only for records that are kept or withheld whole (not summaries, conn reports or verdicts)."""
        if self.scope.host_wide:
            return True
        inside = self._typed.allows(record) if isinstance(record, msgspec.Struct) else False
        if inside:
            return True
        with self._lock:
            self.withheld_records += count
        return False
