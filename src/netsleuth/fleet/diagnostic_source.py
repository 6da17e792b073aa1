"""The diagnostics a fleet task may name: the registry's, opened like the agent's local sessions
(agent/session_diagnostics.open_session: the same JSON validation, the agent's shared symbol table), seen by
the fleet as JSON records - what travels in record batches.

Before it opens, the typed config is narrowed to the task's scope where the diagnostic reaches further than
its `netns` key says: every packet filter it holds gets the scope's namespace (conn's drop program watches
every namespace by design, to catch the drop that kills a connection elsewhere on the host), and its NAT
join reads only the scope's conntrack table. So the kernel never emits another namespace's events for a
scoped task; scope_filter.py is the last line behind that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from netsleuth.agent.session_diagnostics import DiagnosticContext, open_session
from netsleuth.diagnostics.drop_batch import DropBatch
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.diagnostics.model import DiagnosticSession, Record
from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.fleet.scope_filter import EnforcedScope, ScopeFilter
from netsleuth.kernel.netns import resolve_netns_arg

__all__ = [
    "EncodedRecords",
    "FleetDiagnostic",
    "Records",
    "catalogue",
    "for_the_fleet",
    "narrow_to_scope",
    "open_diagnostic",
    "validate_config",
]


class FleetDiagnostic(Protocol):
    @property
    def attach_kind(self) -> str: ...

    def start(self) -> None: ...

    def poll(self, timeout_ms: int) -> Records: ...

    def drain(self) -> Records: ...

    def summary(self, interrupted: bool) -> dict[str, Any]: ...

    def totals(self) -> EventTotals: ...

    def program_fds(self) -> dict[str, int]: ...

    def notes(self) -> list[str]: ...

    def close(self) -> None: ...


def catalogue() -> tuple[str, ...]:
    return diagnostic_names()


class EncodedRecords:
    """A poll's records encoded once per kind (netsleuth.diagnostics.drop_batch.DropBatch: a drop storm)
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
        return EncodedRecords(
            self._batch.select(lambda record, count: scope.keep_alike(record.to_json(), count))
        )

    def lines(self) -> list[bytes]:
        return self._batch.json_lines()


Records = list[dict[str, Any]] | EncodedRecords


def _as_records(records: Sequence[Record]) -> Records:
    if isinstance(records, DropBatch):
        return EncodedRecords(records)
    return [dict(record.to_json()) for record in records]


class _JsonRecords:
    """A registry session whose records come out as their JSON objects (or, for a drop batch, as its lines:
    EncodedRecords)."""

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

    def summary(self, interrupted: bool) -> dict[str, Any]:
        return dict(self._session.summary(interrupted).to_json())

    def totals(self) -> EventTotals:
        return self._session.totals()

    def program_fds(self) -> dict[str, int]:
        return self._session.program_fds()

    def notes(self) -> list[str]:
        return self._session.notes()

    def close(self) -> None:
        self._session.close()


def narrow_to_scope(config: Any, scope: EnforcedScope) -> Any:
    """The typed config with every packet filter confined to the scope's namespace and, when the scope has
    addresses, to them (a filter already narrower is left alone: admission made the diagnostic's own filter
    the scope's or a part of it), and the NAT join's conntrack reads confined to the namespace. A host-wide
    scope changes nothing."""
    if (
        scope.host_wide
        or scope.netns is None
        or not dataclasses.is_dataclass(config)
        or isinstance(config, type)
    ):
        return config
    inode = resolve_netns_arg(scope.netns)
    changes: dict[str, Any] = {}
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if isinstance(value, PacketFilter):
            narrowed = value
            if narrowed.netns is None:
                narrowed = dataclasses.replace(narrowed, netns=inode)
            if scope.networks and not narrowed.hosts:
                # conn's drop filter leaves the server end out (after a DNAT packets no longer carry it);
                # under an address scope what does not carry a scope address may not be seen anyway.
                narrowed = dataclasses.replace(narrowed, hosts=scope.networks)
            if narrowed is not value:
                changes[item.name] = narrowed
        elif item.name == "conntrack_namespaces" and value is None:
            changes[item.name] = (scope.netns,)
    return dataclasses.replace(config, **changes) if changes else config


def for_the_fleet(config: Any) -> Any:
    """What a host reports in a fleet session beyond a local run: conn's drops and resets that no connection
    on this host claimed (the connection's socket is on another host; the controller joins them across
    hosts and NATs, fleet/merge.py) - each host its own share, instead of one host reaching into the
    others' namespaces."""
    if (
        dataclasses.is_dataclass(config)
        and not isinstance(config, type)
        and any(item.name == "report_unclaimed" for item in dataclasses.fields(config))
    ):
        return dataclasses.replace(config, report_unclaimed=True)
    return config


def open_diagnostic(
    name: str, config: dict[str, Any], context: DiagnosticContext, scope: EnforcedScope
) -> FleetDiagnostic:
    """Validate `config` for `name`, narrow it to `scope` and open it (nothing attached until start);
    UsageError if invalid."""
    return _JsonRecords(
        open_session(name, config, context, lambda typed: for_the_fleet(narrow_to_scope(typed, scope)))
    )


def validate_config(name: str, config: dict[str, Any]) -> object:
    """The diagnostic's typed config from JSON, or its UsageError: nothing is loaded or attached."""
    return get_diagnostic(name).config_from_json(dict(config))
