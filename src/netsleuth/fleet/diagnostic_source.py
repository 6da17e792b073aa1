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
from typing import Any, Protocol

from netsleuth.agent.session_diagnostics import DiagnosticContext, open_session
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.diagnostics.model import DiagnosticSession
from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.fleet.scope_filter import EnforcedScope
from netsleuth.kernel.netns import resolve_netns_arg

__all__ = [
    "FleetDiagnostic",
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

    def poll(self, timeout_ms: int) -> list[dict[str, Any]]: ...

    def drain(self) -> list[dict[str, Any]]: ...

    def summary(self, interrupted: bool) -> dict[str, Any]: ...

    def totals(self) -> EventTotals: ...

    def program_fds(self) -> dict[str, int]: ...

    def notes(self) -> list[str]: ...

    def close(self) -> None: ...


def catalogue() -> tuple[str, ...]:
    return diagnostic_names()


class _JsonRecords:
    """A registry session whose records come out as their JSON objects."""

    def __init__(self, session: DiagnosticSession) -> None:
        self._session = session

    @property
    def attach_kind(self) -> str:
        return self._session.attach_kind

    def start(self) -> None:
        self._session.start()

    def poll(self, timeout_ms: int) -> list[dict[str, Any]]:
        return [dict(record.to_json()) for record in self._session.poll(timeout_ms)]

    def drain(self) -> list[dict[str, Any]]:
        return [dict(record.to_json()) for record in self._session.drain()]

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
