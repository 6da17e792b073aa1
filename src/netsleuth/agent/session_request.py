"""A local session request (the JSON body of the agent's POST /v1/sessions), validated against the agent's
limits.

    {"diagnostic": "drops",
     "config": {"netns": "web1", "proto": "udp", "dport": 53, "reason": ["NETFILTER_DROP"], "stack": false},
     "duration": 10, "max_events": 1000, "max_bytes": 1048576, "cpu_budget_percent": 2}

The body is the one session request every server reads (netsleuth.spec.session_request: the controller's
adds the hosts to run on), read by its one validator: `config` is the diagnostic's own JSON config, its CLI
flags without the dashes (`exclude_reason` for --exclude-reason, `family`: 4 or 6 for -4/-6), read by the
diagnostic's typed config, so a session means exactly what the same command line would. `filters` and
`options` (the first version's split of the same keys) are still read, merged into `config`. Limits left
out take the agent's defaults; asking for more than the agent allows is refused (never silently clamped),
naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from netsleuth.agent.config import SessionLimits
from netsleuth.spec.session_request import (
    ConfigObject,
    RequestError,
    SessionRequest,
    read_session_request,
)

__all__ = ["AgentRequest", "LocalSession", "parse_session_request"]


class AgentRequest(SessionRequest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The session request as an agent reads it: the shared fields and the first version's split config."""

    filters: ConfigObject = msgspec.field(default_factory=dict)
    options: ConfigObject = msgspec.field(default_factory=dict)


@dataclass(frozen=True)
class LocalSession:
    """An accepted request: its limits resolved against the agent's, its config read by the diagnostic."""

    diagnostic: str
    duration: float
    max_events: int
    max_bytes: int
    cpu_budget_percent: float
    config: dict[str, Any] = field(default_factory=dict)  # as given (JSON)
    typed_config: Any = None  # as the diagnostic read it: what the session opens with

    def to_json(self) -> dict[str, Any]:
        return {
            "diagnostic": self.diagnostic,
            "config": self.config,
            "duration": self.duration,
            "max_events": self.max_events,
            "max_bytes": self.max_bytes,
            "cpu_budget_percent": self.cpu_budget_percent,
        }


T = TypeVar("T", int, float)


def _within(name: str, value: T | None, default: T, maximum: T, unit: str) -> T:
    if value is None:
        return default
    if value > maximum:
        raise RequestError(400, f"{name} {value:g} exceeds this agent's limit of {maximum:g} {unit}.")
    return value


def _merged(request: AgentRequest) -> dict[str, Any]:
    return {**request.filters, **request.options, **request.config}


def parse_session_request(
    body: bytes,
    limits: SessionLimits,
    diagnostics: Sequence[str],
    read_config: Callable[[str, dict[str, Any]], Any] | None = None,
) -> LocalSession:
    """The request, or RequestError (a UsageError) with one sentence. `read_config`: how a diagnostic reads
    its config when not by its registered spec (a test's scripted diagnostic)."""
    read = read_session_request(body, AgentRequest, diagnostics, config_of=_merged, read_config=read_config)
    request = read.request
    return LocalSession(
        diagnostic=request.diagnostic,
        duration=float(
            _within("duration", request.duration, limits.default_duration, limits.max_duration, "seconds")
        ),
        max_events=_within("max_events", request.max_events, limits.max_events, limits.max_events, "events"),
        max_bytes=_within("max_bytes", request.max_bytes, limits.max_bytes, limits.max_bytes, "bytes"),
        cpu_budget_percent=float(
            _within(
                "cpu_budget_percent",
                request.cpu_budget_percent,
                limits.cpu_budget_percent,
                limits.cpu_budget_percent,
                "percent",
            )
        ),
        config=_merged(request),
        typed_config=read.config,
    )
