"""A session request (the JSON body of POST /v1/sessions), validated against the agent's limits.

    {"diagnostic": "drops",
     "filters": {"netns": "web1", "proto": "udp", "dport": 53, "reason": ["NETFILTER_DROP"]},
     "options": {"stack": false, "sample": 1},
     "duration": 10, "max_events": 1000, "max_bytes": 1048576, "cpu_budget_percent": 2}

Filters and options are the CLI's own flags without the dashes (`exclude_reason` for --exclude-reason,
`family`: 4 or 6 for -4/-6) and are parsed by the CLI's own parser, so a session means exactly what the
same `netsleuth drops` command line would. Limits left out take the agent's defaults; asking for more than
the agent allows is refused (never silently clamped), naming the field.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from netsleuth.agent.config import SessionLimits
from netsleuth.errors import UsageError

__all__ = ["SessionRequest", "argv_from_json", "parse_session_request", "parse_with"]

_MAX_BODY_BYTES = 64 << 10
_KEYS = ("diagnostic", "filters", "options", "duration", "max_events", "max_bytes", "cpu_budget_percent")


@dataclass(frozen=True)
class SessionRequest:
    diagnostic: str
    duration: float
    max_events: int
    max_bytes: int
    cpu_budget_percent: float
    filters: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "diagnostic": self.diagnostic,
            "filters": self.filters,
            "options": self.options,
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
        filters=_object(raw, "filters"),
        options=_object(raw, "options"),
    )


def _scalar_text(key: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise UsageError(f"filter {key} must be a string or a number (got {value!r})")
    return str(value)


def argv_from_json(values: dict[str, Any], repeatable: Sequence[str], flags: Sequence[str]) -> list[str]:
    """{"dport": 53, "host": ["198.18.0.1"], "stack": true, "family": 6} -> the CLI's argv."""
    argv: list[str] = []
    for key, value in values.items():
        option = "--" + key.replace("_", "-")
        if key == "family":
            if value not in (4, 6):
                raise UsageError(f"filter family must be 4 or 6 (got {value!r})")
            argv.append(f"-{value}")
        elif key in flags:
            if not isinstance(value, bool):
                raise UsageError(f"option {key} must be true or false (got {value!r})")
            argv += [option] if value else []
        elif key in repeatable:
            for item in value if isinstance(value, list) else [value]:
                argv += [option, _scalar_text(key, item)]
        else:
            argv += [option, _scalar_text(key, value)]
    return argv


class _RaisingParser(argparse.ArgumentParser):
    """argparse exits on errors; a session must turn them into a refusal instead."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message.replace("--", "").replace("argument ", "filter "))


def parse_with(
    add_arguments: Callable[[argparse.ArgumentParser], None], argv: list[str]
) -> argparse.Namespace:
    parser = _RaisingParser(prog="session", add_help=False, exit_on_error=False)
    add_arguments(parser)
    try:
        return parser.parse_args(argv)
    except argparse.ArgumentError as error:
        raise UsageError(str(error).replace("--", "").replace("argument ", "filter ")) from None
