"""The diagnostics a fleet task may name: the registry's, opened like the agent's local sessions
(agent/session_diagnostics: the agent's shared symbol table), their records kept typed until they are
encoded into record batches (a drop storm's as its batch's own lines).

Admission (admission.py) gave the config already narrowed to the task's scope, by the diagnostic's
`ScopeTraits` and its narrowing hook (conn's confines its drop program, which watches every namespace by
design, and its NAT join to the scope's namespaces). So the kernel never emits another namespace's events
for a scoped task; scope_filter.py is the last line behind that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from netsleuth.agent.session_diagnostics import DiagnosticContext, WindowedGroups, open_typed
from netsleuth.diagnostics.drops.batch import DropBatch
from netsleuth.diagnostics.model import DiagnosticSession, Record
from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.fleet.scope_filter import ScopeFilter

__all__ = [
    "EncodedRecords",
    "FleetDiagnostic",
    "Records",
    "catalogue",
    "for_the_fleet",
    "open_diagnostic",
]


class FleetDiagnostic(Protocol):
    @property
    def attach_kind(self) -> str: ...

    def start(self) -> None: ...

    def poll(self, timeout_ms: int) -> Records: ...

    def drain(self) -> Records: ...

    def summary(self, interrupted: bool) -> Any: ...  # a typed summary record

    def totals(self) -> EventTotals: ...

    def start_window(self) -> None: ...  # T0: the summary's in-kernel groups count from now on

    def program_fds(self) -> dict[str, int]: ...

    def notes(self) -> list[str]: ...

    def close(self) -> None: ...


def catalogue() -> tuple[str, ...]:
    return diagnostic_names()


class EncodedRecords:
    """A poll's records encoded once per kind (netsleuth.diagnostics.drops.batch.DropBatch: a drop storm)
    that stay so on their way out: the T0 window and the scope are decided per kind and the lines are the
    batch's own, instead of a JSON object made and encoded per record. The window compares each drop's wall
    time in nanoseconds (the ISO text rounds it to the microsecond)."""

    def __init__(self, batch: DropBatch) -> None:
        self._batch = batch

    def __len__(self) -> int:
        return len(self._batch)

    def since(self, wall_ns: int) -> EncodedRecords:
        return EncodedRecords(self._batch.select(lambda _record, _count: True, wall_ns))

    def keep(self, scope: ScopeFilter) -> EncodedRecords:
        """What may leave the host; the rest counted by `scope` as its `keep` counts records."""
        return EncodedRecords(self._batch.select(lambda record, count: scope.keep_alike(record, count)))

    def lines(self) -> list[bytes]:
        return self._batch.json_lines()


# Typed records (msgspec Structs, encoded at the edge), or a drop batch's lines.
Records = list[Any] | EncodedRecords


def _as_records(records: Sequence[Record]) -> Records:
    if isinstance(records, DropBatch):
        return EncodedRecords(records)
    return list(records)


class _FleetRecords:
    """A registry session as the fleet reads it: typed records as they are, a drop batch as its lines
    (EncodedRecords)."""

    def __init__(self, session: DiagnosticSession) -> None:
        self._session = session

    @property
    def attach_kind(self) -> str:
        return self._session.attach_kind

    def start(self) -> None:
        self._session.start()

    def poll(self, timeout_ms: int) -> Records:
        return _as_records(self._session.poll(timeout_ms))

    def drain(self) -> Records:
        return _as_records(self._session.drain())

    def summary(self, interrupted: bool) -> Any:
        return self._session.summary(interrupted)

    def totals(self) -> EventTotals:
        return self._session.totals()

    def start_window(self) -> None:
        if isinstance(self._session, WindowedGroups):
            self._session.start_window()

    def program_fds(self) -> dict[str, int]:
        return self._session.program_fds()

    def notes(self) -> list[str]:
        return self._session.notes()

    def close(self) -> None:
        self._session.close()


def for_the_fleet(config: Any) -> Any:
    """What a host reports in a fleet session beyond a local run: conn's drops and resets that no connection
    on this host claimed (the connection's socket is on another host; the controller joins them across
    hosts and NATs, fleet/merge.py) - each host its own share, instead of one host reaching into the
    others' namespaces."""
    if isinstance(config, msgspec.Struct) and "report_unclaimed" in config.__struct_fields__:
        return msgspec.structs.replace(config, report_unclaimed=True)
    return config


def open_diagnostic(name: str, config: Any, context: DiagnosticContext) -> FleetDiagnostic:
    """Open `name` with the typed config admission accepted and narrowed to the task's scope (nothing
    attached until start). UsageError if it cannot open here."""
    return _FleetRecords(open_typed(get_diagnostic(name), for_the_fleet(config), context))
