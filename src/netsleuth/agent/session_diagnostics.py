"""The diagnostics an agent session (local or fleet) can run: every one in the registry, opened from the
request's JSON config (the same validation as the CLI's flags), on a `KernelContext` whose symbol table is
shared by the sessions running at the same time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from netsleuth.diagnostics.filters import filter_notes
from netsleuth.diagnostics.model import DiagnosticSession, Record
from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.kernel.function_names import SharedKallsyms
from netsleuth.kernel.reasons import DropReasons

__all__ = [
    "SESSION_DIAGNOSTICS",
    "DiagnosticContext",
    "DiagnosticFactory",
    "WindowedGroups",
    "open_session",
    "open_typed",
]


@dataclass(frozen=True)
class DiagnosticContext:
    """What the agent loaded once and every session shares."""

    reasons: DropReasons
    symbols: SharedKallsyms = field(default_factory=SharedKallsyms)


@runtime_checkable
class WindowedGroups(Protocol):
    """A session whose summary holds in-kernel groups counted from attach unless told where its window
    starts (drops: DropsDiagnostic.start_window; a fleet session's T0, netsleuth.fleet.session_runner)."""

    def start_window(self) -> None: ...


class _SharedSymbolsSession:
    """A registry session whose kernel context borrows the agent's shared symbol table: released, and the
    context closed, when the session closes (the last session out lets the ~40 MB table go)."""

    def __init__(
        self, session: DiagnosticSession, symbols: SharedKallsyms, close_context: Callable[[], None]
    ):
        self.session = session
        self._symbols: SharedKallsyms | None = symbols
        self._close_context = close_context

    @property
    def attach_kind(self) -> str:
        return self.session.attach_kind

    def start(self) -> None:
        self.session.start()

    def poll(self, timeout_ms: int) -> Sequence[Record]:
        return self.session.poll(timeout_ms)

    def drain(self) -> Sequence[Record]:
        return self.session.drain()

    def totals(self) -> EventTotals:
        return self.session.totals()

    def start_window(self) -> None:
        if isinstance(self.session, WindowedGroups):
            self.session.start_window()

    def summary(self, interrupted: bool) -> Record:
        return self.session.summary(interrupted)

    def program_fds(self) -> dict[str, int]:
        return self.session.program_fds()

    def notes(self) -> list[str]:
        return [*filter_notes(self.session), *self.session.notes()]

    def close(self) -> None:
        self.session.close()
        if self._symbols is not None:
            self._close_context()
            self._symbols.release()
            self._symbols = None


def open_typed(spec: Any, config: Any, context: DiagnosticContext) -> DiagnosticSession:
    """Open the registered diagnostic `spec` with its config already read and checked (nothing attached
    until start), on a kernel context that borrows the agent's shared symbol table."""
    from netsleuth.kernel.context import KernelContext

    # No debug-vmlinux source lines in sessions: they stay cheap, and their records are complete without.
    kernel = KernelContext(kallsyms=context.symbols.acquire(), firewall=True)
    try:
        session = spec.open(config, kernel)
    except BaseException:
        kernel.close()
        context.symbols.release()
        raise
    return _SharedSymbolsSession(session, context.symbols, kernel.close)


def open_session(name: str, config: Mapping[str, Any], context: DiagnosticContext) -> DiagnosticSession:
    """Validate `config` for the registered diagnostic `name` and open it (nothing attached until start);
    a UsageError with one sentence when the name or the config is not valid."""
    spec = get_diagnostic(name)
    return open_typed(spec, spec.config_from_json(dict(config)), context)


# (the config the session request's validator read, the agent's shared context) -> the session, not started.
DiagnosticFactory = Callable[[Any, DiagnosticContext], DiagnosticSession]


def _factory(name: str) -> DiagnosticFactory:
    return lambda config, context: open_typed(get_diagnostic(name), config, context)


# Every registered diagnostic, by name (the diagnostic's module is imported only when a session opens it).
SESSION_DIAGNOSTICS: dict[str, DiagnosticFactory] = {name: _factory(name) for name in diagnostic_names()}
