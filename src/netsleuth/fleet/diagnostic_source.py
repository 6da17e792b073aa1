"""The diagnostics a fleet task may name, opened from one JSON config.

The shared registry (netsleuth.diagnostics.registry: `get_diagnostic(name).config_from_json(...)`, then
`open`) is the source when it is installed; until it is, the agent's own session diagnostics (drops) are, with
the JSON config split into their filters and options. Either way the fleet sees one small interface.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol, cast

from netsleuth.agent.session_diagnostics import SESSION_DIAGNOSTICS, DiagnosticContext, DropsDiagnostic
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError

__all__ = ["FleetDiagnostic", "catalogue", "open_diagnostic"]

_OPTION_KEYS = frozenset({"stack", "sample"})
_IGNORED_KEYS = frozenset({"summary", "duration"})  # the fleet streams events; the task's deadline rules


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


def _registry() -> Any | None:
    try:
        return importlib.import_module("netsleuth.diagnostics.registry")
    except ImportError:
        return None


def catalogue() -> tuple[str, ...]:
    registry = _registry()
    if registry is not None:
        return tuple(registry.diagnostic_names())
    return tuple(SESSION_DIAGNOSTICS)


class _RegistryDiagnostic:
    """A registry DiagnosticSession seen as dict records."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.attach_kind = ""

    def start(self) -> None:
        self._session.start()
        self.attach_kind = str(getattr(self._session, "attach_kind", ""))

    def poll(self, timeout_ms: int) -> list[dict[str, Any]]:
        return [record.to_json() for record in self._session.poll(timeout_ms)]

    def drain(self) -> list[dict[str, Any]]:
        return [record.to_json() for record in self._session.drain()]

    def summary(self, interrupted: bool) -> dict[str, Any]:
        return cast(dict[str, Any], self._session.summary(interrupted).to_json())

    def totals(self) -> EventTotals:
        return cast(EventTotals, self._session.totals())

    def program_fds(self) -> dict[str, int]:
        return cast(dict[str, int], self._session.program_fds())

    def notes(self) -> list[str]:
        return list(self._session.notes())

    def close(self) -> None:
        self._session.close()


class _AgentDrops:
    """The agent's DropsDiagnostic with exact totals (read from its drops session)."""

    def __init__(self, diagnostic: DropsDiagnostic) -> None:
        self._diagnostic = diagnostic

    @property
    def attach_kind(self) -> str:
        return self._diagnostic.attach_kind

    def start(self) -> None:
        self._diagnostic.start()

    def poll(self, timeout_ms: int) -> list[dict[str, Any]]:
        return self._diagnostic.poll(timeout_ms)

    def drain(self) -> list[dict[str, Any]]:
        return self._diagnostic.drain()

    def summary(self, interrupted: bool) -> dict[str, Any]:
        return self._diagnostic.summary(interrupted)

    def totals(self) -> EventTotals:
        return self._diagnostic._session.totals()

    def program_fds(self) -> dict[str, int]:
        return self._diagnostic.program_fds()

    def notes(self) -> list[str]:
        return self._diagnostic.notes()

    def close(self) -> None:
        self._diagnostic.close()


def open_diagnostic(name: str, config: dict[str, Any], context: DiagnosticContext) -> FleetDiagnostic:
    """Validate `config` for `name` and open it (nothing attached until start()); UsageError if invalid."""
    registry = _registry()
    if registry is not None:
        spec = registry.get_diagnostic(name)
        return _RegistryDiagnostic(spec.open(spec.config_from_json(config), None))
    factory: Callable[..., Any] | None = SESSION_DIAGNOSTICS.get(name)
    if factory is None:
        raise UsageError(f"unknown diagnostic {name!r}")
    filters = {k: v for k, v in config.items() if k not in _OPTION_KEYS | _IGNORED_KEYS}
    options = {k: v for k, v in config.items() if k in _OPTION_KEYS}
    return _AgentDrops(cast(DropsDiagnostic, factory(filters, options, context)))
