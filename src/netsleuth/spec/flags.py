"""CLI flags derived from a config type: each field with an `Opt` becomes one argparse argument, and the
parsed namespace goes back through `read_config` like any JSON, so the CLI and an agent session accept and
refuse exactly the same values with the same sentences (naming `--dport` for one, `dport` for the other).
"""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

from netsleuth.spec.configs import Config, Speaker, cli_fields, read_config

__all__ = ["add_config_flags", "config_from_args"]

C = TypeVar("C", bound=Config)

# Namespace attributes that carry the parsed config fields, apart from argparse's own (and other commands').
_PREFIX = "cfg__"


def add_config_flags(parser: argparse.ArgumentParser, config_type: type[Config]) -> None:
    """One argument per field with an Opt, in declaration order, grouped by `Opt.group`."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in cli_fields(config_type):
        opt = field.opt
        if opt is None or not opt.cli:
            continue
        target: argparse.ArgumentParser | argparse._ArgumentGroup = parser
        if opt.group:
            target = groups.get(opt.group) or groups.setdefault(
                opt.group, parser.add_argument_group(opt.group)
            )
        dest = _PREFIX + field.name
        if opt.positional:
            choices = list(field.choices) if field.kind == "choice" else None
            parser.add_argument(dest, metavar=field.name.upper(), choices=choices, help=opt.help)
            continue
        flag = opt.flag_for(field.name)
        metavar = opt.metavar or field.name.upper()
        if field.kind == "bool":
            target.add_argument(flag, dest=dest, action="store_true", default=None, help=opt.help)
        elif field.kind == "list":
            target.add_argument(flag, dest=dest, action="append", metavar=metavar, help=opt.help)
        elif opt.consts:
            # Flags that each store one value (-4 / -6 for `family`): no flag of the field's own name.
            for const_flag, value in opt.consts.items():
                target.add_argument(
                    const_flag, dest=dest, action="store_const", const=value, help=f"{opt.help}: {value}"
                )
        else:
            target.add_argument(flag, dest=dest, metavar=metavar, help=opt.help)


def config_from_args(config_type: type[C], args: argparse.Namespace, what: str = "") -> C:
    """The config the user gave on the command line: only the flags given, read like JSON (a flag's text
    is converted to the field's type by the same rules as a JSON string)."""
    given: dict[str, Any] = {
        name[len(_PREFIX) :]: value
        for name, value in vars(args).items()
        if name.startswith(_PREFIX) and value is not None
    }
    return read_config(config_type, given, Speaker.CLI, what)
