"""The diagnostics a session can run, each its own BPF attachment with the session's filters, producing the
very JSON records `netsleuth <diagnostic> --json` prints (same enricher, same `to_json`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from netsleuth.agent.function_names import SharedKallsyms
from netsleuth.agent.session_request import argv_from_json, parse_with
from netsleuth.diagnostics.drops import DropsConfig, DropsSession, RawDrop
from netsleuth.diagnostics.drops_enrich import DropEnricher, DropRecord
from netsleuth.diagnostics.filters import add_filter_arguments, packet_filter_from_args
from netsleuth.kernel.reasons import DropReasons

__all__ = [
    "SESSION_DIAGNOSTICS",
    "DiagnosticContext",
    "DiagnosticFactory",
    "DropsDiagnostic",
    "SessionDiagnostic",
]


@dataclass(frozen=True)
class DiagnosticContext:
    """What the agent loaded once and every session shares."""

    reasons: DropReasons
    symbols: SharedKallsyms = field(default_factory=SharedKallsyms)


class SessionDiagnostic(Protocol):
    attach_kind: str

    def start(self) -> None: ...

    def poll(self, timeout_ms: int) -> list[dict[str, Any]]: ...

    def drain(self) -> list[dict[str, Any]]: ...

    def summary(self, interrupted: bool) -> dict[str, Any]: ...

    def program_fds(self) -> dict[str, int]: ...

    def lost_and_sampled(self) -> tuple[int, int]: ...

    def notes(self) -> list[str]: ...

    def close(self) -> None: ...


def _drops_filter_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_arguments(parser)
    parser.add_argument("--reason", action="append", default=[])
    parser.add_argument("--exclude-reason", action="append", default=[])


def _drops_option_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", action="store_true")
    parser.add_argument("--sample", type=int, default=1)


_REPEATABLE = ("host", "src", "dst", "reason", "exclude_reason")


class DropsDiagnostic:
    """`netsleuth drops --json` with the session's filters."""

    def __init__(self, filters: dict[str, Any], options: dict[str, Any], context: DiagnosticContext) -> None:
        args = parse_with(_drops_filter_arguments, argv_from_json(filters, _REPEATABLE, ()))
        opts = parse_with(_drops_option_arguments, argv_from_json(options, (), ("stack",)))
        reasons = context.reasons
        self._config = DropsConfig(
            packet_filter=packet_filter_from_args(args),
            reasons=frozenset(reasons.parse(args.reason)),
            exclude_reasons=frozenset(reasons.parse(args.exclude_reason)),
            stack=opts.stack,
            sample_every=opts.sample,
        )
        self._session = DropsSession(self._config, reasons)
        # The symbol table is shared by the sessions running and let go after the last (function_names.py:
        # ~40 MB an idle agent should not hold). No debug-vmlinux source lines: a session stays cheap, and
        # its records are complete without them.
        self._symbols = context.symbols
        self._enricher: DropEnricher | None = DropEnricher(
            reasons, want_stack=opts.stack, kallsyms=self._symbols.acquire()
        )
        self.attach_kind = ""
        self._notes: list[str] = []

    @property
    def enricher(self) -> DropEnricher:
        if self._enricher is None:
            raise RuntimeError("the session is closed")
        return self._enricher

    def start(self) -> None:
        self._session.start()
        self.attach_kind = self._session.attach_kind
        self.enricher.prepare()

    def _enrich(self, raw: RawDrop) -> DropRecord:
        return self.enricher.enrich(raw)

    def poll(self, timeout_ms: int) -> list[dict[str, Any]]:
        return [self._enrich(raw).to_json() for raw in self._session.poll(timeout_ms)]

    def drain(self) -> list[dict[str, Any]]:
        return [self._enrich(raw).to_json() for raw in self._session.drain()]

    def summary(self, interrupted: bool) -> dict[str, Any]:
        """The same object `netsleuth drops --json` ends with."""
        enrich_group = self.enricher.enrich_group
        groups = [enrich_group(group) for group in self._session.groups()]
        return {
            "type": "summary",
            **self._session.totals().to_json(),
            "attach": self._session.attach_kind,
            "interrupted": interrupted,
            "groups": [group.to_json() for group in sorted(groups, key=lambda g: -g.count)],
        }

    def program_fds(self) -> dict[str, int]:
        return self._session.program_fds()

    def lost_and_sampled(self) -> tuple[int, int]:
        totals = self._session.totals()
        return totals.lost, totals.sampled

    def notes(self) -> list[str]:
        # Naming a rule means reading the firewall of the drop's namespace, which can be out of reach
        # (entering another namespace needs CAP_SYS_ADMIN, which the systemd unit does not grant): the drops
        # are still reported, with their hook, and the session says why rules are missing.
        problems = self._enricher.firewall_problems.values() if self._enricher is not None else ()
        return [*self._notes, *(f"firewall rules are not named in this session: {text}" for text in problems)]

    def close(self) -> None:
        self._session.close()
        if self._enricher is not None:
            self._enricher.close()
            self._enricher = None
            self._symbols.release()


DiagnosticFactory = Callable[[dict[str, Any], dict[str, Any], DiagnosticContext], SessionDiagnostic]

SESSION_DIAGNOSTICS: dict[str, DiagnosticFactory] = {
    "drops": DropsDiagnostic,
}
