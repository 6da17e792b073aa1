"""The CLI's light view of a config's fields (spec.configs.cli_fields, read from the type hints alone) says
what msgspec.inspect's full view says, for every config of every built-in diagnostic: the same fields in the
same order, the same JSON keys, switches, repeatable flags and choices."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import pytest
from msgspec import Meta
from msgspec import inspect as mi

from netsleuth.diagnostics.registry import DIAGNOSTIC_MODULES, get_diagnostic
from netsleuth.spec.configs import Config, cli_fields, config_fields, field_opts
from netsleuth.spec.options import Opt

_SEQUENCES = mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType


def _plain(kind: mi.Type) -> mi.Type:
    # What spec.flags read a field's type as before cli_fields: an Optional's one member, under its metadata.
    if isinstance(kind, mi.UnionType):
        members = [member for member in kind.types if not isinstance(member, mi.NoneType)]
        if len(members) == 1:
            return _plain(members[0])
    if isinstance(kind, mi.Metadata):
        return _plain(kind.type)
    return kind


def _holds_a_list(kind: mi.Type) -> bool:
    if isinstance(kind, mi.UnionType):
        return any(_holds_a_list(member) for member in kind.types)
    if isinstance(kind, mi.Metadata):
        return _holds_a_list(kind.type)
    return isinstance(kind, _SEQUENCES)


def _configs() -> list[type[Config]]:
    found: dict[type[Config], None] = {}
    for name in DIAGNOSTIC_MODULES:
        found[get_diagnostic(name).config] = None
    return list(found)


def test_every_diagnostic_has_a_config_with_fields() -> None:
    assert len(_configs()) >= 10
    assert all(cli_fields(config) for config in _configs())


@pytest.mark.parametrize("config", _configs(), ids=lambda config: config.__name__)
def test_cli_fields_agree_with_msgspec_inspect(config: type[Config]) -> None:
    light = cli_fields(config)
    full = config_fields(config)
    assert [field.name for field in light] == [field.name for field in full]
    assert [field.encode_name for field in light] == [field.encode_name for field in full]
    for ours, theirs in zip(light, full, strict=True):
        plain = _plain(theirs.type)
        expected_kind = (
            "bool"
            if isinstance(plain, mi.BoolType)
            else "list"
            if isinstance(plain, _SEQUENCES)
            else "choice"
            if isinstance(plain, mi.LiteralType)
            else "value"
        )
        assert ours.kind == expected_kind, ours.name
        assert ours.choices == (tuple(plain.values) if isinstance(plain, mi.LiteralType) else ())
        assert ours.repeatable == _holds_a_list(theirs.type), ours.name
    assert field_opts(config) == {field.name: field.opt for field in light if field.opt is not None}


class Shapes(Config, frozen=True, kw_only=True):
    """Every shape a field's type may take that the CLI tells apart."""

    switch: bool | None = None
    hosts: Annotated[list[str], Meta(max_length=4), Opt("h")] = msgspec.field(default_factory=list)
    ports: tuple[int, ...] | None = None
    pair: tuple[int, int] | None = None
    mode: Annotated[Literal["a", "b"] | None, Opt("m")] = None
    either: Literal["x"] | Annotated[int, Meta(ge=0)] | None = None
    some: str | list[str] | None = None


def test_the_light_view_reads_through_optional_annotated_and_unions() -> None:
    shapes = {field.name: (field.kind, field.choices, field.repeatable) for field in cli_fields(Shapes)}
    assert shapes == {
        "switch": ("bool", (), False),
        "hosts": ("list", (), True),
        "ports": ("list", (), True),
        "pair": ("value", (), False),
        "mode": ("choice", ("a", "b"), False),
        "either": ("value", (), False),
        "some": ("value", (), True),
    }
    test_cli_fields_agree_with_msgspec_inspect(Shapes)
