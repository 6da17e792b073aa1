"""The JSON of every record type, declared once as typed dictionaries, and the JSON Schemas made from them.

Each record's `to_json()` must produce its declaration here: the tests check every record the privileged
runs print against `schema_for(record)` (tests/tracerun.py), so a key that is added, renamed or retyped
without its declaration fails there, and docs/records.md (written by `python -m
netsleuth.diagnostics.record_schemas docs/records.md`, checked up to date by a unit test) documents what is
declared. `additionalProperties` is false: an undeclared key is an error, not a silent extension.

Free-form values (a verdict's evidence, a firewall rule's details) are declared as objects of any keys.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, Union

import msgspec

from netsleuth.diagnostics.schema import SCHEMA_VERSIONS

__all__ = ["RECORD_TYPES", "json_schema", "markdown", "schema_for"]


# -- shared parts --------------------------------------------------------------------------------------------


# -- agent sessions ------------------------------------------------------------------------------------------


class SessionStartJson(TypedDict):
    type: Literal["session_start"]
    v: int
    id: str
    diagnostic: str
    config: dict[str, Any]
    duration: float
    max_events: int
    max_bytes: int
    cpu_budget_percent: float
    attach: str


class SessionEndJson(TypedDict):
    type: Literal["session_end"]
    v: int
    id: str
    reason: str
    detail: str
    seconds: float
    events: int
    bytes: int
    bpf_run_time_ns: int
    bpf_cpu_percent: float
    notes: list[str]


# The declaration of each record type; summaries by the diagnostic that writes them.
RECORD_TYPES: dict[str, type] = {
    "session_start": SessionStartJson,
    "session_end": SessionEndJson,
}


# -- JSON Schema ---------------------------------------------------------------------------------------------

_SCALARS: dict[object, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
}


def _schema_of(annotation: object, defs: dict[str, Any]) -> dict[str, Any]:
    if annotation is Any:
        return {}
    if annotation in _SCALARS:
        return dict(_SCALARS[annotation])
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is NotRequired:
        return _schema_of(arguments[0], defs)
    if origin is Literal:
        return {"enum": list(arguments)} if len(arguments) > 1 else {"const": arguments[0]}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema_of(argument, defs) for argument in arguments]}
    if origin is list:
        return {"type": "array", "items": _schema_of(arguments[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema_of(arguments[1], defs)}
    if isinstance(annotation, type) and typing.is_typeddict(annotation):
        name = annotation.__name__.lstrip("_")
        if name not in defs:
            defs[name] = {}  # reserve the name first: declarations may refer to themselves
            defs[name] = _object_schema(annotation, defs)
        return {"$ref": f"#/$defs/{name}"}
    raise TypeError(f"no JSON Schema for {annotation!r}")


def _required_keys(declaration: type) -> list[str]:
    """Keys not marked NotRequired. Read from the evaluated hints: with postponed annotations, Python 3.11's
    TypedDict cannot see NotRequired when the class is made, so its __required_keys__ says every key."""
    hints = typing.get_type_hints(declaration, include_extras=True)
    total = getattr(declaration, "__total__", True)
    return [key for key, value in hints.items() if total and typing.get_origin(value) is not NotRequired]


def _object_schema(declaration: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(declaration, include_extras=True)
    required = sorted(_required_keys(declaration))
    return {
        "type": "object",
        "properties": {key: _schema_of(value, defs) for key, value in hints.items()},
        "required": required,
        "additionalProperties": not getattr(declaration, "__total__", True),
    }


def json_schema(record_type: str) -> dict[str, Any]:
    """The JSON Schema (2020-12) of one record type ("drop", "summary:drops"...), self-contained."""
    declaration = RECORD_TYPES[record_type]
    defs: dict[str, Any] = {}
    schema = _object_schema(declaration, defs)
    version = SCHEMA_VERSIONS[record_type.split(":", 1)[0]]
    schema["properties"]["v"] = {"const": version}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"netsleuth {record_type} record, version {version}",
        **schema,
        **({"$defs": defs} if defs else {}),
    }


def typed_record_types() -> dict[str, type[Any]]:
    """The record classes of the diagnostics whose specs declare typed records (netsleuth.spec), by the same
    names as RECORD_TYPES ("exec", "summary:snoop.exec")."""
    from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic

    found: dict[str, type[Any]] = {}
    for name in diagnostic_names():
        for kind in getattr(get_diagnostic(name), "records", ()):
            if isinstance(kind, type):
                tag = kind.record_type()  # type: ignore[attr-defined]
                found[f"summary:{name}" if tag == "summary" else tag] = kind
    return found


def _typed_record(record_type: str, diagnostic: object) -> type[Any] | None:
    name = f"summary:{diagnostic}" if record_type == "summary" else record_type
    return typed_record_types().get(name)


def schema_for(record: Mapping[str, Any]) -> dict[str, Any]:
    """The schema a printed record must match: by its "type", and for a summary by its "diagnostic"."""
    record_type = str(record.get("type"))
    typed = _typed_record(record_type, record.get("diagnostic"))
    if typed is not None:
        from netsleuth.spec.schemas import record_schema

        return record_schema(typed)
    if record_type == "summary":
        record_type = f"summary:{record.get('diagnostic')}"
    if record_type not in RECORD_TYPES:
        raise KeyError(f"no schema is declared for records of type {record_type!r}")
    return json_schema(record_type)


def markdown() -> str:
    """docs/records.md: every record type's keys, as declared."""
    lines = [
        "# Records: the JSON netsleuth prints",
        "",
        "Generated by `python -m netsleuth.diagnostics.record_schemas docs/records.md` from the declarations",
        "in `src/netsleuth/diagnostics/record_schemas.py`; the tests check every record the privileged runs",
        "print against the same declarations. Every record has `type` and `v` (the version of its type's",
        "schema: it grows when a key changes meaning or goes away; new keys do not change it). Summaries",
        "carry `diagnostic` and the run's `clock` (monotonic and wall-clock time read together), so records",
        "of several hosts can be put on one time line.",
        "",
    ]
    for record_type, declaration in RECORD_TYPES.items():
        version = SCHEMA_VERSIONS[record_type.split(":", 1)[0]]
        lines += [f"## `{record_type}` (v{version})", "", "| key | type | always |", "| --- | --- | --- |"]
        hints = typing.get_type_hints(declaration, include_extras=True)
        required = set(_required_keys(declaration))
        for key, value in hints.items():
            lines.append(f"| `{key}` | {_type_text(value)} | {'yes' if key in required else 'no'} |")
        lines.append("")
    from netsleuth.spec.schemas import nested_parts, part_key_rows, record_key_rows

    typed = typed_record_types()
    for record_type, kind in typed.items():
        version = next(field.default for field in msgspec.structs.fields(kind) if field.name == "v")
        lines += [f"## `{record_type}` (v{version})", "", "| key | type | always |", "| --- | --- | --- |"]
        for key, words, always in record_key_rows(kind):
            lines.append(f"| `{key}` | `{words}` | {'yes' if always else 'no'} |")
        lines.append("")
    lines += [
        "## Parts",
        "",
        "The objects nested in the records above, by the name their keys' types give them (`ClockPart`,",
        "`list of TcpGroup`). A name ending in Record is a record of its own section (`ExecRecord`: `exec`).",
        "",
    ]
    for part in nested_parts(list(typed.values())):
        lines += [f"### `{part.__name__.lstrip('_')}`", "", "| key | type | always |", "| --- | --- | --- |"]
        for key, words, always in part_key_rows(part):
            lines.append(f"| `{key}` | `{words}` | {'yes' if always else 'no'} |")
        lines.append("")
    return "\n".join(lines)


def _type_name(annotation: object) -> str:
    if annotation is Any:
        return "any"
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is NotRequired:
        return _type_name(arguments[0])
    if origin is Literal:
        return " or ".join(f'"{value}"' for value in arguments)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(argument) for argument in arguments)
    if origin is list:
        return f"list of {_type_name(arguments[0])}"
    if origin is dict:
        return f"object of {_type_name(arguments[1])}"
    if isinstance(annotation, type):
        names = {str: "string", int: "integer", float: "number", bool: "boolean"}
        return names.get(annotation, annotation.__name__.lstrip("_"))
    return str(annotation)


def _type_text(annotation: object) -> str:
    return f"`{_type_name(annotation)}`"


if __name__ == "__main__":
    # Imported by its own name, so the declarations are the package's classes, not __main__'s copies.
    from netsleuth.diagnostics import record_schemas

    target = sys.argv[1] if len(sys.argv) > 1 else "docs/records.md"
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(record_schemas.markdown())
