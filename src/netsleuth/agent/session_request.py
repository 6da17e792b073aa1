"""A session request (the JSON body of POST /v1/sessions), validated against the agent's limits.

    {"diagnostic": "drops",
     "config": {"netns": "web1", "proto": "udp", "dport": 53, "reason": ["NETFILTER_DROP"], "stack": false},
     "duration": 10, "max_events": 1000, "max_bytes": 1048576, "cpu_budget_percent": 2}

`config` is the diagnostic's own JSON config: its CLI flags without the dashes (`exclude_reason` for
--exclude-reason, `family`: 4 or 6 for -4/-6), checked by the same code as the flags
(netsleuth.diagnostics.model.ConfigInput), so a session means exactly what the same command line would.
`filters` and `options` (the first version's split of the same keys) are still read, merged into `config`.
Limits left out take the agent's defaults; asking for more than the agent allows is refused (never
silently clamped), naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from netsleuth.agent.config import SessionLimits
from netsleuth.errors import UsageError

__all__ = ["SessionRequest", "parse_session_request"]

_MAX_BODY_BYTES = 64 << 10
_KEYS = (
    "diagnostic",
    "config",
    "filters",
    "options",
    "duration",
    "max_events",
    "max_bytes",
    "cpu_budget_percent",
)


@dataclass(frozen=True)
class SessionRequest:
    diagnostic: str
    duration: float
    max_events: int
    max_bytes: int
    cpu_budget_percent: float
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "diagnostic": self.diagnostic,
            "config": self.config,
            "duration": self.duration,
            "max_events": self.max_events,
            "max_bytes": self.max_bytes,
            "cpu_budget_percent": self.cpu_budget_percent,
        }


def _number(raw: dict[str, Any], key: str, default: float, maximum: float, unit: str) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise UsageError(f"{key} must be a positive number of {unit} (got {value!r})")
    if value > maximum:
        raise UsageError(f"{key} {value:g} exceeds this agent's limit of {maximum:g} {unit}")
    return float(value)


def _integer(raw: dict[str, Any], key: str, default: int, maximum: int, unit: str) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{key} must be a positive whole number of {unit} (got {value!r})")
    if value > maximum:
        raise UsageError(f"{key} {value} exceeds this agent's limit of {maximum} {unit}")
    return value


def _object(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise UsageError(f"{key} must be a JSON object")
    return value


def parse_session_request(body: bytes, limits: SessionLimits, diagnostics: Sequence[str]) -> SessionRequest:
    if len(body) > _MAX_BODY_BYTES:
        raise UsageError(f"the request body is larger than {_MAX_BODY_BYTES} bytes")
    try:
        raw = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"the request body is not JSON: {error}") from None
    if not isinstance(raw, dict):
        raise UsageError("the request body must be a JSON object")
    for key in raw:
        if key not in _KEYS:
            raise UsageError(f"unknown field {key!r}; known: {', '.join(_KEYS)}")
    diagnostic = raw.get("diagnostic")
    if not isinstance(diagnostic, str) or diagnostic not in diagnostics:
        raise UsageError(f"diagnostic must be one of {', '.join(diagnostics)} (got {diagnostic!r})")
    return SessionRequest(
        diagnostic=diagnostic,
        duration=_number(raw, "duration", limits.default_duration, limits.max_duration, "seconds"),
        max_events=_integer(raw, "max_events", limits.max_events, limits.max_events, "events"),
        max_bytes=_integer(raw, "max_bytes", limits.max_bytes, limits.max_bytes, "bytes"),
        cpu_budget_percent=_number(
            raw, "cpu_budget_percent", limits.cpu_budget_percent, limits.cpu_budget_percent, "percent"
        ),
        config={**_object(raw, "filters"), **_object(raw, "options"), **_object(raw, "config")},
    )
