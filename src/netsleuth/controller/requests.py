"""Reading a session request body: JSON shape, sizes and types, each mistake one sentence and a status code.

Only structure is checked here; what a filter means (is `--dport 99999` a port?) is checked where it can be,
by the diagnostic on the agent, which refuses the task with its own sentence (the host shows `rejected`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from netsleuth.fleet.protocol import ProtocolError, validate_host_id

__all__ = ["MAX_BODY", "BadRequest", "SessionRequest", "parse_session_request"]

MAX_BODY = 64 * 1024
_MAX_LIST = 64
_MAX_STRING = 256
_MAX_HOSTS = 1024
_CONFIG_KEY = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_FIELDS = {"hosts", "selector", "diagnostic", "config", "duration"}


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SessionRequest:
    hosts: tuple[str, ...] | None
    selector: dict[str, str] | None
    diagnostic: str
    config: dict[str, Any]
    duration: float

    @property
    def netns(self) -> str | None:
        value = self.config.get("netns")
        return str(value) if value is not None else None


def _check_value(key: str, value: Any, depth: int = 0) -> None:
    if isinstance(value, str):
        if len(value) > _MAX_STRING:
            raise BadRequest(413, f"config.{key} is longer than {_MAX_STRING} characters.")
    elif isinstance(value, list):
        if len(value) > _MAX_LIST:
            raise BadRequest(413, f"config.{key} has {len(value)} entries; at most {_MAX_LIST} are allowed.")
        for item in value:
            if isinstance(item, list | dict) or depth > 0:
                raise BadRequest(400, f"config.{key} must be a list of strings or numbers.")
            _check_value(key, item, depth + 1)
    elif isinstance(value, dict):
        raise BadRequest(400, f"config.{key} must be a string, number, boolean or list, not an object.")
    elif value is not None and not isinstance(value, bool | int | float):
        raise BadRequest(400, f"config.{key} has an unsupported type.")


def parse_session_request(body: bytes, known_diagnostics: tuple[str, ...]) -> SessionRequest:
    if len(body) > MAX_BODY:
        raise BadRequest(413, f"the request body is larger than {MAX_BODY // 1024} KiB.")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(400, f"the request body is not valid JSON ({error}).") from None
    if not isinstance(data, dict):
        raise BadRequest(400, "the request body must be a JSON object.")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise BadRequest(400, f"unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))}).")
    diagnostic = data.get("diagnostic")
    if not isinstance(diagnostic, str) or not diagnostic:
        raise BadRequest(400, "field 'diagnostic' must be a non-empty string.")
    if diagnostic not in known_diagnostics:
        raise BadRequest(
            422, f"unknown diagnostic {diagnostic[:64]!r} (known: {', '.join(known_diagnostics)})."
        )
    if ("hosts" in data) == ("selector" in data):
        raise BadRequest(400, "give exactly one of 'hosts' (a list of host ids) or 'selector' (labels).")
    hosts: tuple[str, ...] | None = None
    selector: dict[str, str] | None = None
    if "hosts" in data:
        raw_hosts = data["hosts"]
        if not isinstance(raw_hosts, list) or not raw_hosts:
            raise BadRequest(400, "field 'hosts' must be a non-empty list of host ids.")
        if len(raw_hosts) > _MAX_HOSTS:
            raise BadRequest(413, f"'hosts' names {len(raw_hosts)} hosts; at most {_MAX_HOSTS} are allowed.")
        try:
            hosts = tuple(dict.fromkeys(validate_host_id(host) for host in raw_hosts))
        except ProtocolError as error:
            raise BadRequest(400, f"{error}.") from None
    else:
        raw_selector = data["selector"]
        if (
            not isinstance(raw_selector, dict)
            or not raw_selector
            or len(raw_selector) > _MAX_LIST
            or not all(isinstance(v, str) and len(v) <= _MAX_STRING for v in raw_selector.values())
        ):
            raise BadRequest(400, "field 'selector' must be a non-empty object of label: value strings.")
        selector = {str(k): v for k, v in raw_selector.items()}
    config = data.get("config", {})
    if not isinstance(config, dict):
        raise BadRequest(400, "field 'config' must be a JSON object of filters.")
    if len(config) > _MAX_LIST:
        raise BadRequest(413, f"'config' has {len(config)} keys; at most {_MAX_LIST} are allowed.")
    for key, value in config.items():
        if not _CONFIG_KEY.match(key):
            raise BadRequest(400, f"config key {key[:40]!r} is not a filter name (lower case, digits, _).")
        _check_value(key, value)
    netns = config.get("netns")
    if netns is not None and not (isinstance(netns, str) and netns):
        raise BadRequest(400, "config.netns must be one namespace name.")
    duration = data.get("duration")
    if isinstance(duration, bool) or not isinstance(duration, int | float) or not duration > 0:
        raise BadRequest(400, "field 'duration' must be a number of seconds above 0.")
    return SessionRequest(hosts, selector, diagnostic, dict(config), float(duration))
