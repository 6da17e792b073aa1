"""Typed configs: one msgspec Struct per diagnostic, read by the same code from CLI flags, an agent session's
JSON, a fleet task and the web form, with the same one-sentence errors.

`read_config(Type, values, speaker)` validates with msgspec (types, ranges, lengths, choices, unknown keys),
then the config's own `check()` (what involves two fields: `-6` with an IPv4 address). A failure is a
`ConfigError`: a UsageError (exit 2, HTTP 400) that also carries the field, so the web form marks the field
and words it with the field's label while the CLI names its flag. Nothing here looks at the running host:
names that only mean something there (a network namespace, a device) are resolved when the diagnostic opens
(netsleuth.spec.scope), so a controller can check a config meant for another host.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import msgspec
from msgspec import inspect as mi

from netsleuth.errors import UsageError
from netsleuth.spec.options import NETWORK_TYPES, Opt

__all__ = [
    "CliField",
    "Config",
    "ConfigError",
    "Speaker",
    "cli_fields",
    "config_fields",
    "read_config",
]

C = TypeVar("C", bound="Config")


class Speaker(enum.Enum):
    """Who gave the values, so an error names the field as that person wrote it."""

    CLI = "cli"  # --dport
    JSON = "json"  # dport (an agent session, a fleet task, the controller's API)


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every diagnostic's config. Subclasses declare fields as `Annotated[type, Meta(...), Opt(...)]`
    and may override `check` for rules that span fields; `v` is the config's schema version."""

    VERSION: ClassVar[int] = 1

    def check(self) -> None:
        """Raise `ConfigError` for a combination of values that cannot work; each field alone is valid."""


class ConfigError(UsageError):
    """A config value that cannot be used: `field` (None for the config as a whole), the problem in words,
    and the value given. str() is the sentence for the speaker it was raised for."""

    def __init__(
        self, field: str | None, problem: str, *, speaker: Speaker = Speaker.CLI, flag: str = ""
    ) -> None:
        self.field = field
        self.problem = problem
        self.speaker = speaker
        self.flag = flag
        name = flag if speaker is Speaker.CLI and flag else field
        super().__init__(f"{name} {problem}" if name else problem)


def config_fields(config_type: type[Config]) -> tuple[mi.Field, ...]:
    """The config's fields with their types and constraints (msgspec's own view), read once per type:
    msgspec.inspect does not keep it, and a CLI run asks twice on its way to attaching (its flags, then
    its repeatable fields when the arguments are read) - about 5 ms of `netsleuth drops`' start each."""
    found = _FIELDS.get(config_type)
    if found is None:
        info = mi.type_info(config_type)
        assert isinstance(info, mi.StructType)
        found = _FIELDS[config_type] = info.fields
    return found


_FIELDS: dict[type[Config], tuple[mi.Field, ...]] = {}


class CliField(msgspec.Struct, frozen=True):
    """One field as the CLI reads it: its name and JSON key, its Opt (None: JSON-only), and its type's shape -
    `kind` "bool" (a switch), "list" (a repeatable flag), "choice" (a Literal: `choices`) or "value", seen
    through an Optional and the Annotated metadata (as spec.flags builds its argparse argument), and
    `repeatable`: it holds a list of values (any member of a union does; read_config takes one value there
    as a list of one)."""

    name: str
    encode_name: str
    opt: Opt | None
    kind: str
    choices: tuple[object, ...] = ()
    repeatable: bool = False


def cli_fields(config_type: type[Config]) -> tuple[CliField, ...]:
    """The config's fields in declaration order as the CLI and read_config need them, from the type hints
    alone (read once per type). msgspec.inspect's full view (`config_fields`, what errors and the web form
    describe a type by) costs ~8 ms of every start; a run's flags and values need only this much of it
    (tests/unit/test_config_fields.py checks that both views agree for every config)."""
    found = _CLI_FIELDS.get(config_type)
    if found is None:
        found = _CLI_FIELDS[config_type] = _read_cli_fields(config_type)
    return found


_CLI_FIELDS: dict[type[Config], tuple[CliField, ...]] = {}


def field_opts(config_type: type[Config]) -> dict[str, Opt]:
    """Each field's Opt (a field without one is JSON-only: the CLI and the form leave it out)."""
    found = _OPTS.get(config_type)
    if found is None:
        found = _OPTS[config_type] = {
            field.name: field.opt for field in cli_fields(config_type) if field.opt is not None
        }
    return found


_OPTS: dict[type[Config], dict[str, Opt]] = {}


def _read_cli_fields(config_type: type[Config]) -> tuple[CliField, ...]:
    import typing

    hints = typing.get_type_hints(config_type, include_extras=True)
    fields = []
    for name, encode_name in zip(
        config_type.__struct_fields__, config_type.__struct_encode_fields__, strict=True
    ):
        hint = hints[name]
        opt = next((meta for meta in getattr(hint, "__metadata__", ()) if isinstance(meta, Opt)), None)
        plain = _plain_hint(hint)
        if plain is bool:
            kind, choices = "bool", ()
        elif _is_sequence_hint(plain, any_member=False):
            kind, choices = "list", ()
        elif typing.get_origin(plain) is typing.Literal:
            kind, choices = "choice", typing.get_args(plain)
        else:
            kind, choices = "value", ()
        repeatable = _is_sequence_hint(hint, any_member=True)
        fields.append(CliField(name, encode_name, opt, kind, choices, repeatable))
    return tuple(fields)


def _unwrapped(hint: Any) -> Any:
    """The type under Annotated metadata and NewTypes, as msgspec reads it."""
    while True:
        if hasattr(hint, "__metadata__"):  # Annotated[T, ...]
            hint = hint.__origin__
        elif hasattr(hint, "__supertype__"):  # a NewType
            hint = hint.__supertype__
        else:
            return hint


def _union_members(hint: Any) -> tuple[Any, ...] | None:
    import types
    import typing

    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return None


def _plain_hint(hint: Any) -> Any:
    """An Optional's one other member, under its metadata: `int | None` reads as int."""
    hint = _unwrapped(hint)
    members = _union_members(hint)
    if members is not None:
        others = [member for member in members if member is not type(None)]
        if len(others) == 1:
            return _plain_hint(others[0])
    return hint


def _is_sequence_hint(hint: Any, *, any_member: bool) -> bool:
    """A list, set, frozenset or `tuple[X, ...]` (msgspec's list, var-tuple and set types); with
    `any_member`, a union with one among its members is one too."""
    import collections.abc
    import typing

    hint = _unwrapped(hint)
    members = _union_members(hint)
    if members is not None:
        return any_member and any(_is_sequence_hint(member, any_member=True) for member in members)
    if hint in (list, tuple, set, frozenset):
        return True
    origin = typing.get_origin(hint)
    if origin is tuple:
        args = typing.get_args(hint)
        return len(args) == 2 and args[1] is Ellipsis
    return origin in (
        list,
        set,
        frozenset,
        collections.abc.Sequence,
        collections.abc.MutableSequence,
        collections.abc.Set,
        collections.abc.MutableSet,
    )


def _dec_hook(kind: type, value: Any) -> Any:
    if kind in NETWORK_TYPES:
        if not isinstance(value, str):
            raise TypeError("expected text")
        return ipaddress.ip_network(value, strict=False)
    raise NotImplementedError


# msgspec's error texts, read only when a config is refused: compiled then (re caches them), not at start.
_AT = r" - at `\$\.?([A-Za-z_][A-Za-z0-9_]*)?(.*)`$"
_UNKNOWN = r"Object contains unknown field `([^`]*)`"
_MISSING = r"Object missing required field `([^`]*)`"


def read_config(
    config_type: type[C], values: Mapping[str, Any], speaker: Speaker = Speaker.JSON, what: str = ""
) -> C:
    """`values` (a JSON object, or the CLI's given flags) as a `config_type`, checked. `what` names the
    diagnostic in errors about the config as a whole."""
    what = what or config_type.__name__
    if not isinstance(values, Mapping):
        raise ConfigError(None, f"the {what} config must be a JSON object", speaker=speaker)
    version = values.get("v", config_type.VERSION)
    if version != config_type.VERSION:
        raise ConfigError(
            "v",
            f"is {version!r}: this netsleuth reads version {config_type.VERSION} of the {what} config",
            speaker=speaker,
        )
    repeatable = _repeatable(config_type)
    # One value where a flag repeats (`"host": "198.18.0.1"`, `"reason": "NO_SOCKET"`) is a list of one, as
    # the CLI's one flag is (docs/agent.md).
    given = {
        key: [value] if key in repeatable and isinstance(value, str | int) else value
        for key, value in values.items()
        if key != "v"
    }
    try:
        config = msgspec.convert(given, config_type, strict=False, dec_hook=_dec_hook)
    except msgspec.ValidationError as error:
        raise _sentence(config_type, given, str(error), speaker, what) from None
    try:
        config.check()
    except ConfigError as error:
        if error.speaker is not speaker:
            raise _respoken(config_type, error, speaker) from None
        raise
    return config


def _repeatable(config_type: type[Config]) -> frozenset[str]:
    """The fields that hold a list of values (a repeatable flag)."""
    found = _REPEATABLE.get(config_type)
    if found is None:
        found = _REPEATABLE[config_type] = frozenset(
            field.encode_name for field in cli_fields(config_type) if field.repeatable
        )
    return found


_REPEATABLE: dict[type[Config], frozenset[str]] = {}


def _respoken(config_type: type[Config], error: ConfigError, speaker: Speaker) -> ConfigError:
    flag = error.flag or (_flag(config_type, error.field) if error.field else "")
    return ConfigError(error.field, error.problem, speaker=speaker, flag=flag)


def _flag(config_type: type[Config], name: str) -> str:
    opt = field_opts(config_type).get(name)
    if opt is None:
        return "--" + name.replace("_", "-")
    if opt.positional:
        return name.upper()
    return opt.flag_for(name)


def _sentence(
    config_type: type[Config], given: Mapping[str, Any], message: str, speaker: Speaker, what: str
) -> ConfigError:
    unknown = re.match(_UNKNOWN, message)
    if unknown:
        name = unknown.group(1)
        known = sorted(field.encode_name for field in config_fields(config_type))
        import difflib  # only for this sentence: not on every run's way to attaching

        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; it knows {', '.join(known)}"
        # A key the config does not have is no field a form could mark: the config as a whole is refused.
        return ConfigError(None, f"{name} is not an option of {what}{hint}", speaker=speaker)
    missing = re.match(_MISSING, message)
    if missing:
        name = missing.group(1)
        return ConfigError(name, "is required", speaker=speaker, flag=_flag(config_type, name))
    at = re.search(_AT, message)
    name = at.group(1) if at else None
    if name is None:
        return ConfigError(None, f"the {what} config is invalid: {message}", speaker=speaker)
    fields = {field.encode_name: field for field in config_fields(config_type)}
    field = fields.get(name)
    value = given.get(name)
    if at and at.group(2).startswith("[") and isinstance(value, list | tuple):
        index = int(at.group(2)[1:].split("]", 1)[0])
        value = value[index] if index < len(value) else value
    flag = _flag(config_type, name)
    if field is None:
        return ConfigError(name, message, speaker=speaker, flag=flag)
    words = _words(field.type)
    if words is not None and value is not None and not isinstance(value, list | tuple | dict):
        return ConfigError(name, f"{value!r} is not {words}", speaker=speaker, flag=flag)
    shown = f" (got {value!r})" if value is not None else ""
    return ConfigError(name, f"must be {describe(field.type)}{shown}", speaker=speaker, flag=flag)


def _words(kind: mi.Type) -> str | None:
    """How a reusable type names itself in an error (its Meta's extra `words`)."""
    if isinstance(kind, mi.UnionType):
        named = [_words(member) for member in kind.types if not isinstance(member, mi.NoneType)]
        return named[0] if len(named) == 1 else None
    if isinstance(kind, mi.Metadata):
        words = (kind.extra or {}).get("words")
        return str(words) if words else _words(kind.type)
    if isinstance(kind, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        return _words(kind.item_type)
    if isinstance(kind, mi.CustomType) and kind.cls in NETWORK_TYPES:
        return "an IP address or CIDR (e.g. 198.18.0.1, 198.18.0.0/15, 2001:db8::/32)"
    return None


def describe(kind: mi.Type, *, item: bool = False) -> str:
    """A type as a person reads it: 'a whole number from 1 to 65535', 'one of tcp, udp'."""
    if isinstance(kind, mi.UnionType):
        parts = [describe(member) for member in kind.types if not isinstance(member, mi.NoneType)]
        return " or ".join(dict.fromkeys(parts))
    if isinstance(kind, mi.Metadata):
        words = (kind.extra or {}).get("words")
        return str(words) if words else describe(kind.type)
    if isinstance(kind, mi.IntType):
        return "a whole number" + _bounds(kind.ge, kind.gt, kind.le, kind.lt)
    if isinstance(kind, mi.FloatType):
        if kind.gt == 0 and kind.ge is None and kind.le is None and kind.lt is None:
            return "a positive number"
        return "a number" + _bounds(kind.ge, kind.gt, kind.le, kind.lt)
    if isinstance(kind, mi.BoolType):
        return "true or false"
    if isinstance(kind, mi.StrType):
        if kind.min_length and kind.max_length:
            return f"{kind.min_length} to {kind.max_length} characters"
        return "text"
    if isinstance(kind, mi.LiteralType):
        return "one of " + ", ".join(str(value) for value in kind.values)
    if isinstance(kind, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        return describe(kind.item_type, item=True) + ("" if item else " (one or more)")
    if isinstance(kind, mi.CustomType) and kind.cls in NETWORK_TYPES:
        return "an IP address or CIDR (e.g. 198.18.0.1, 198.18.0.0/15, 2001:db8::/32)"
    return "valid"


def _bounds(ge: float | None, gt: float | None, le: float | None, lt: float | None) -> str:
    low = ge if ge is not None else gt
    high = le if le is not None else lt
    if ge is not None and le is not None:
        return f" from {ge:g} to {le:g}"
    text = ""
    if low is not None:
        text += f" of {low:g} or more" if ge is not None else f" over {low:g}"
    if high is not None:
        text += (" and" if text else "") + (f" up to {high:g}" if le is not None else f" under {high:g}")
    return text
