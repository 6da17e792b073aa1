"""The session request: one diagnostic, its config and how long and how much it may run - the body of an
agent's `POST /v1/sessions` (agent/session_request.py) and, with the hosts to run on, of the controller's
`POST /api/v1/sessions` (controller/requests.py). One msgspec Struct, one validator for both:

    {"diagnostic": "drops", "config": {"proto": "udp", "dport": 53}, "duration": 10,
     "max_events": 1000, "max_bytes": 1048576, "cpu_budget_percent": 2}

`read_session_request` decodes the body into the Struct (types, unknown fields), bounds the config's size,
checks the diagnostic is registered (`decode_session_request`), and reads `config` with the diagnostic's
own typed config (`read_request_config`; netsleuth.spec.configs: the CLI's checks and sentences), so a
session means exactly what the same command line would. The controller makes the two steps apart, with
its role check between them. Every refusal is a `RequestError`: one sentence, an HTTP status, and the
config field to blame when there is one (a form marks it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

import msgspec
from msgspec import Meta
from msgspec import inspect as mi

from netsleuth.errors import NetsleuthError, UsageError
from netsleuth.spec.configs import ConfigError, Speaker, describe

__all__ = [
    "MAX_BODY",
    "ReadRequest",
    "RequestError",
    "SessionRequest",
    "decode_session_request",
    "read_request_config",
    "read_session_request",
]

MAX_BODY = 64 * 1024
_MAX_LIST = 64
_MAX_STRING = 256
_CONFIG_KEY = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

Duration = Annotated[float, Meta(gt=0, extra={"words": "a positive number of seconds"})]
Count = Annotated[int, Meta(ge=1, extra={"words": "a positive whole number"})]
Percent = Annotated[float, Meta(gt=0, le=100, extra={"words": "a positive number of percent, at most 100"})]
ConfigObject = Annotated[
    dict[str, Any],
    Meta(
        extra={"words": "a JSON object: the diagnostic's options, named as its CLI flags without the dashes"}
    ),
]


class RequestError(UsageError):
    """A refused request: the sentence, its HTTP status (400 malformed, 413 too large, 422 a diagnostic or
    config the validator refuses) and, when one config field is to blame, the field and the problem apart
    (the sentence names the CLI's flag, a form words it with its own label)."""

    def __init__(self, status: int, message: str, field: str | None = None, problem: str | None = None):
        super().__init__(message)
        self.status = status
        self.field = field
        self.problem = problem


class SessionRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One diagnostic for a bounded time. Limits left out take the server's defaults (an agent's [sessions];
    the controller's task budgets); asking for more than it allows is refused, never silently clamped."""

    diagnostic: Annotated[str, Meta(min_length=1, max_length=64, description="a registered diagnostic")]
    config: ConfigObject = msgspec.field(default_factory=dict)
    duration: Annotated[Duration | None, Meta(description="seconds the session runs once started")] = None
    max_events: Annotated[Count | None, Meta(description="records sent at most; the summary is extra")] = None
    max_bytes: Annotated[Count | None, Meta(description="bytes of records sent at most")] = None
    cpu_budget_percent: Annotated[
        Percent | None, Meta(description="CPU its BPF programs may spend, in percent of one CPU")
    ] = None


R = TypeVar("R", bound=SessionRequest)


@dataclass(frozen=True)
class ReadRequest(Generic[R]):
    """A validated request and its config as the diagnostic's typed config (None: the controller could
    not check it here - what only the agents can know - and leaves it to them)."""

    request: R
    config: Any


_UNKNOWN = re.compile(r"Object contains unknown field `([^`]*)`")
_MISSING = re.compile(r"Object missing required field `([^`]*)`")
_AT = re.compile(r" - at `\$((?:\.[A-Za-z_]+)*)")


def _struct_fields(kind: mi.Type) -> dict[str, mi.Field] | None:
    """The fields of a Struct type (through its metadata and an optional `| None`), else None."""
    while True:
        if isinstance(kind, mi.Metadata):
            kind = kind.type
        elif isinstance(kind, mi.UnionType):
            members = [member for member in kind.types if not isinstance(member, mi.NoneType)]
            if len(members) != 1:
                return None
            kind = members[0]
        else:
            break
    return {field.encode_name: field for field in kind.fields} if isinstance(kind, mi.StructType) else None


def _sentence(kind: type[SessionRequest], raw: Mapping[str, Any], message: str) -> RequestError:
    """msgspec's error on the request's own fields - or a field of a Struct inside it, such as the
    controller's selector - as one sentence naming the field (`selector.pod`)."""
    fields = _struct_fields(mi.type_info(kind))
    assert fields is not None
    at = _AT.search(message)
    container: dict[str, mi.Field] | None = fields  # the object the path ends in
    field: mi.Field | None = None
    names: list[str] = []
    value: Any = raw
    for part in (at.group(1) if at else "").split(".")[1:]:
        field = container.get(part) if container is not None else None
        if field is None:
            break
        names.append(part)
        value = value.get(part) if isinstance(value, Mapping) else None
        container = _struct_fields(field.type)
    where = ".".join(names)
    unknown = _UNKNOWN.match(message)
    missing = _MISSING.match(message)
    if (unknown or missing) and container is not None:
        inside = f" of {where}" if where else ""
        if unknown:
            known = ", ".join(container)
            return RequestError(400, f"unknown field {unknown.group(1)!r}{inside} (known: {known}).")
        assert missing is not None
        return RequestError(400, f"field {missing.group(1)!r}{inside} is required.")
    if field is None:
        return RequestError(400, f"the request is invalid: {message}.")
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return RequestError(400, f"{where} must be {describe(field.type)} (got {shown}).")


def _check_value(key: str, value: Any) -> None:
    """The config's size, before any diagnostic reads it: bounded strings and lists of plain values."""
    if isinstance(value, str):
        if len(value) > _MAX_STRING:
            raise RequestError(413, f"config.{key} is longer than {_MAX_STRING} characters.")
    elif isinstance(value, list):
        if len(value) > _MAX_LIST:
            raise RequestError(
                413, f"config.{key} has {len(value)} entries; at most {_MAX_LIST} are allowed."
            )
        for item in value:
            if isinstance(item, list | dict):
                raise RequestError(400, f"config.{key} must be a list of strings or numbers.")
            _check_value(key, item)
    elif isinstance(value, dict):
        raise RequestError(400, f"config.{key} must be a string, number, boolean or list, not an object.")


def decode_session_request(
    body: bytes,
    kind: type[R],
    diagnostics: Collection[str],
    config_of: Callable[[R], dict[str, Any]] | None = None,
) -> tuple[R, dict[str, Any]]:
    """The first half of the validator: `body` as a `kind` (SessionRequest or a server's own extension of
    it), the diagnostic registered, and the config to read (`config_of` the request: what a server adds to
    what was given) bounded in size; RequestError with one sentence otherwise."""
    if len(body) > MAX_BODY:
        raise RequestError(413, f"the request body is larger than {MAX_BODY // 1024} KiB.")
    try:
        raw = msgspec.json.decode(body or b"{}")
    except msgspec.DecodeError as error:
        raise RequestError(400, f"the request body is not valid JSON ({error}).") from None
    if not isinstance(raw, dict):
        raise RequestError(400, "the request body must be a JSON object.")
    try:
        request = msgspec.convert(raw, kind, strict=True)
    except msgspec.ValidationError as error:
        raise _sentence(kind, raw, str(error)) from None
    if request.diagnostic not in diagnostics:
        raise RequestError(
            422, f"unknown diagnostic {request.diagnostic!r} (known: {', '.join(diagnostics)})."
        )
    config = config_of(request) if config_of is not None else dict(request.config)
    if len(config) > _MAX_LIST:
        raise RequestError(413, f"'config' has {len(config)} keys; at most {_MAX_LIST} are allowed.")
    for key, value in config.items():
        if not _CONFIG_KEY.match(key):
            raise RequestError(400, f"config key {key[:40]!r} is not an option name (lower case, digits, _).")
        _check_value(key, value)
    return request, config


def read_session_request(
    body: bytes,
    kind: type[R],
    diagnostics: Collection[str],
    *,
    speaker: Speaker = Speaker.JSON,
    config_of: Callable[[R], dict[str, Any]] | None = None,
    read_config: Callable[[str, dict[str, Any]], Any] | None = None,
) -> ReadRequest[R]:
    """The whole validator: `decode_session_request`, then `read_request_config`."""
    request, config = decode_session_request(body, kind, diagnostics, config_of)
    return ReadRequest(
        request, read_request_config(request.diagnostic, config, speaker=speaker, read_config=read_config)
    )


def read_request_config(
    name: str,
    config: dict[str, Any],
    *,
    speaker: Speaker = Speaker.JSON,
    elsewhere: bool = False,
    read_config: Callable[[str, dict[str, Any]], Any] | None = None,
) -> Any:
    """The second half: `config` read by diagnostic `name`'s typed config; RequestError (422) with its
    sentence and the field to blame. `speaker`: whom the sentence is for (the controller's names the CLI
    flag, for `netsleuth fleet run`; the field is named apart anyway). `elsewhere`: the config is for other
    hosts (the controller): only its form is checked, not whether what it names exists here, and what this
    machine cannot check (None) is left to the agents. `read_config`: how the diagnostic reads it when not
    by its registered spec (a test's scripted diagnostic)."""
    from netsleuth.diagnostics.registry import get_diagnostic

    try:
        if read_config is not None:
            return read_config(name, config)
        # Its form only: nothing a typed config holds is host-specific (names are resolved when it opens).
        return get_diagnostic(name).config_from_json(config, speaker)
    except UsageError as error:
        sentence = f"invalid config for {name}: {str(error).rstrip('.')}."
        if isinstance(error, ConfigError) and error.field is not None:
            raise RequestError(422, sentence, field=error.field, problem=error.problem.rstrip(".")) from None
        raise RequestError(422, sentence) from None
    except (NetsleuthError, OSError):
        if not elsewhere:
            raise
        return None  # what this machine lacks (BTF for drop reason names): the agents check it
