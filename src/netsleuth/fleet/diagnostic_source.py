"""The diagnostics a fleet task may name: the registry's, opened like the agent's local sessions
(agent/session_diagnostics.open_session: the same JSON validation, the agent's shared symbol table), seen by
the fleet as JSON records - what travels in record batches.
"""

from __future__ import annotations

from typing import Any, Protocol

from netsleuth.agent.session_diagnostics import DiagnosticContext, open_session
from netsleuth.diagnostics.model import DiagnosticSession
from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic
from netsleuth.diagnostics.totals import EventTotals

__all__ = ["FleetDiagnostic", "catalogue", "open_diagnostic", "validate_config"]


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


def open_diagnostic(name: str, config: dict[str, Any], context: DiagnosticContext) -> FleetDiagnostic:
    """Validate `config` for `name` and open it (nothing attached until start); UsageError if invalid."""
    return _JsonRecords(open_session(name, config, context))


def validate_config(name: str, config: dict[str, Any]) -> object:
    """The diagnostic's typed config from JSON, or its UsageError: nothing is loaded or attached."""
    return get_diagnostic(name).config_from_json(dict(config))
