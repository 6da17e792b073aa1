"""JSON Schemas derived from the specs: each diagnostic's config (what the web form renders and the
controller's OpenAPI publishes) and each record type (what the tests check printed records against and
docs/records.md documents). Nothing here is written by hand per diagnostic.

A config schema is msgspec's, with each property given what a form needs from the field's `Opt`:
`title` (its label), `description` (its help), `x-group` (its fieldset) and `x-flag` (the CLI spelling, for
a person who knows the CLI).
"""

from __future__ import annotations

from typing import Any

import msgspec

from netsleuth.spec.configs import Config, field_opts
from netsleuth.spec.records import Record, schema_hook

__all__ = [
    "config_schema",
    "nested_parts",
    "part_key_rows",
    "record_key_rows",
    "record_schema",
    "schema_components",
    "type_words",
]

_DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """msgspec puts a Struct in `$defs` behind a `$ref`; a single object reads better inline."""
    reference = schema.get("$ref")
    defs = dict(schema.get("$defs", {}))
    if isinstance(reference, str) and reference.startswith("#/$defs/"):
        name = reference.removeprefix("#/$defs/")
        body = dict(defs.pop(name))
        if defs:
            body["$defs"] = defs
        return body
    return schema


def config_schema(config_type: type[Config], title: str = "") -> dict[str, Any]:
    """The JSON Schema of one config type, with each field's label, help, group and CLI flag."""
    schema = _inline(msgspec.json.schema(config_type, schema_hook=schema_hook))
    opts = field_opts(config_type)
    properties: dict[str, Any] = schema.get("properties", {})
    for name, prop in properties.items():
        opt = opts.get(name)
        if opt is None or not opt.form:
            prop["x-form"] = False
            continue
        prop["title"] = opt.label_for(name)
        prop["description"] = opt.help
        if opt.group:
            prop["x-group"] = opt.group
        prop["x-flag"] = name.upper() if opt.positional else opt.flag_for(name)
        if opt.consts:
            prop["x-flags"] = dict(opt.consts)
    properties["v"] = {"const": config_type.VERSION, "default": config_type.VERSION, "x-form": False}
    if title:
        schema["title"] = title
    return {"$schema": _DRAFT, **schema}


def record_schema(record_type: type[Record], title: str = "") -> dict[str, Any]:
    """The JSON Schema one printed record of this type must match."""
    schema = _inline(msgspec.json.schema(record_type, schema_hook=schema_hook))
    # Readers ignore keys they do not know (a newer agent may add some), but what netsleuth prints must be
    # exactly what is declared: the schema is strict where decoding is lenient.
    for part in (schema, *schema.get("$defs", {}).values()):
        if part.get("type") == "object" and "properties" in part:
            part["additionalProperties"] = False
    fields = msgspec.structs.fields(record_type)
    version = next(field.default for field in fields if field.name == "v")
    schema.setdefault("properties", {})["v"] = {"const": version}
    if title:
        schema["title"] = title
    return {"$schema": _DRAFT, **schema}


def schema_components(types: list[type[Any]]) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
    """Schemas of several types sharing one set of components (`#/components/schemas/...`), for OpenAPI."""
    return msgspec.json.schema_components(
        types, schema_hook=schema_hook, ref_template="#/components/schemas/{name}"
    )


def record_key_rows(record_type: type[Record]) -> list[tuple[str, str, bool]]:
    """(key, type in words, always present) for each key of a record type: docs/records.md's table."""
    return [("type", f'"{record_type.record_type()}"', True), *part_key_rows(record_type)]


def part_key_rows(part: type[msgspec.Struct]) -> list[tuple[str, str, bool]]:
    """(key, type in words, always present) for each field of a record or of a part nested in one."""
    from msgspec import inspect as mi

    info = mi.type_info(part)
    assert isinstance(info, mi.StructType)
    rows = []
    for field in info.fields:
        # A field that defaults to msgspec.UNSET is left out of the JSON while unset: a key that is there
        # only sometimes (`netfilter` of a firewall's reset).
        always = (
            field.required
            or field.default is not msgspec.NODEFAULT
            or field.default_factory is not (msgspec.NODEFAULT)
        )
        rows.append((field.encode_name, type_words(field.type), always))
    return rows


def type_words(kind: Any) -> str:
    """A msgspec type as docs/records.md writes it: `integer or null`, `list of string`."""
    from msgspec import inspect as mi

    if isinstance(kind, mi.Metadata):
        return type_words(kind.type)
    if isinstance(kind, mi.UnionType):
        return " or ".join(type_words(member) for member in kind.types)
    if isinstance(kind, mi.NoneType):
        return "null"
    if isinstance(kind, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        return f"list of {type_words(kind.item_type)}"
    if isinstance(kind, mi.DictType):
        return f"object of {type_words(kind.value_type)}"
    if isinstance(kind, mi.LiteralType):
        return " or ".join(f'"{value}"' for value in kind.values)
    if isinstance(kind, mi.EnumType):
        return " or ".join(f'"{member.value}"' for member in kind.cls)
    if isinstance(kind, mi.StructType):
        return kind.cls.__name__.lstrip("_")
    if isinstance(kind, mi.CustomType):
        return "string (ISO 8601 time)" if kind.cls.__name__ == "WallTime" else "string"
    names: dict[type, str] = {
        mi.StrType: "string",
        mi.IntType: "integer",
        mi.FloatType: "number",
        mi.BoolType: "boolean",
        mi.AnyType: "any",
    }
    return names.get(type(kind), type(kind).__name__)


def nested_parts(record_types: list[type[Record]]) -> list[type[msgspec.Struct]]:
    """The Structs nested in these records that are not records themselves (`ClockPart`, `TcpGroup`...), at
    any depth, each once, in the order first met: what docs/records.md describes under "Parts"."""
    from msgspec import inspect as mi

    found: dict[type[msgspec.Struct], None] = {}
    met: set[type[msgspec.Struct]] = set(record_types)  # a record has its own section; each is walked once

    def visit(kind: Any) -> None:
        if isinstance(kind, mi.Metadata):
            visit(kind.type)
        elif isinstance(kind, mi.UnionType):
            for member in kind.types:
                visit(member)
        elif isinstance(kind, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
            visit(kind.item_type)
        elif isinstance(kind, mi.DictType):
            visit(kind.value_type)
        elif isinstance(kind, mi.StructType) and kind.cls not in met:
            met.add(kind.cls)
            if not issubclass(kind.cls, Record):
                found[kind.cls] = None
            for field in kind.fields:
                visit(field.type)

    for record_type in record_types:
        info = mi.type_info(record_type)
        assert isinstance(info, mi.StructType)
        for field in info.fields:
            visit(field.type)
    return list(found)
