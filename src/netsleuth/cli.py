"""Argument parsing, exit codes and error messages: the only place that talks to the terminal's exit status.

Exit codes: 0 success, 1 the environment lacks something (root, BTF, libbpf), 2 bad input. Errors are one
sentence on stderr; a traceback is shown only with NETSLEUTH_DEBUG=1, for bugs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from netsleuth import __version__
from netsleuth.commands import Command
from netsleuth.errors import EXIT_USAGE, NetsleuthError
from netsleuth.startup_gc import pause_collection, resume_collection

__all__ = ["build_parser", "main"]


# Subcommand name -> the module exporting its COMMAND. Only the module of the command being run is imported
# (drops' attach time should not pay for importing doctor); `netsleuth --help` imports them all.
_COMMAND_MODULES = {
    "doctor": "netsleuth.commands.doctor",
    "offload": "netsleuth.commands.offload",
    "rollback": "netsleuth.commands.rollback",
    "agent": "netsleuth.commands.agent",
    "controller": "netsleuth.commands.controller",
    "fleet": "netsleuth.commands.fleet",
}


def _diagnostic_words(with_plugins: bool) -> list[str]:
    """The CLI words of the registered diagnostics that have no hand-written command: each is derived from
    its spec (commands/diagnostic.py)."""
    from netsleuth.diagnostics.registry import DIAGNOSTIC_MODULES, diagnostic_modules

    names = diagnostic_modules() if with_plugins else DIAGNOSTIC_MODULES
    words = dict.fromkeys(name.split(".", 1)[0] for name in names)
    return [word for word in words if word not in _COMMAND_MODULES]


def _attaching(word: str | None) -> bool:
    """Whether the command runs one `run_session` (commands/_runloop.py), which resumes garbage collection
    once the probes are attached: for it collection is held off from here to there (netsleuth.startup_gc).
    Those are the diagnostics' derived commands; every hand-written one runs with it on (checked by
    tests/unit/test_cli_startup.py)."""
    if word is None:
        return False
    return word in _diagnostic_words(with_plugins=False)


def _command(name: str, with_plugins: bool) -> Command:
    """The command `name`; its diagnostics are the built-in ones only, or with the plug-ins' too."""
    module = _COMMAND_MODULES.get(name)
    if module is not None:
        command: Command = importlib.import_module(module).COMMAND
        return command
    from netsleuth.commands.diagnostic import diagnostic_command
    from netsleuth.diagnostics.registry import DIAGNOSTIC_MODULES, diagnostic_modules, get_diagnostic

    names = diagnostic_modules() if with_plugins else DIAGNOSTIC_MODULES
    specs = [get_diagnostic(each) for each in names if each.split(".", 1)[0] == name]
    return diagnostic_command(name, specs)


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _terminal_columns() -> int:
    """shutil.get_terminal_size's answer (COLUMNS, else the terminal's width, else 80) without importing
    shutil, which brings zlib, bz2 and lzma with it: 3 ms of every start, spent because argparse builds a
    help formatter for each argument it adds."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _HelpFormatter(argparse.HelpFormatter):
    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        super().__init__(prog, indent_increment, max_help_position, width or _terminal_columns() - 2)


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage block on error; we print one line and exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # A parser with options that look like negative numbers (-4, -6) reads `--duration -1` as an option
        # without its value ("expected one argument"); given as `--duration=-1`, the value reaches the
        # command's own check, which says what is wrong with it.
        given = list(sys.argv[1:] if args is None else args)
        joined: list[str] = []
        for token in given:
            previous = joined[-1] if joined else ""
            action = self._option_string_actions.get(previous)
            if action is not None and action.nargs is None and _NEGATIVE_NUMBER.match(token):
                joined[-1] = f"{previous}={token}"
            else:
                joined.append(token)
        return super().parse_known_args(joined, namespace)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(EXIT_USAGE)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; when `argv` names a command, only that command's module is imported."""
    parser = _OneLineParser(
        prog="netsleuth",
        description="Tells you why your Linux network misbehaves: drops, resets, path health.",
    )
    parser.add_argument("--version", action="version", version=f"netsleuth {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_OneLineParser)
    subparsers.required = True
    chosen = _chosen_command(argv)
    # A run of one known command needs no parser for the others (argparse builds each with its gettext
    # lookups: about half a millisecond apiece); a command name it does not know gets them all, so the
    # error lists the valid ones, and the top-level help (`netsleuth --help`, `netsleuth -h drops`)
    # describes them all.
    arguments = list(argv)
    before_command = arguments[: arguments.index(chosen)] if chosen is not None else arguments
    top_level_help = "-h" in before_command or "--help" in before_command
    builtin = [*_COMMAND_MODULES, *_diagnostic_words(with_plugins=False)]
    # Plug-in diagnostics are looked up only when the command is not a built-in one, or for the top-level
    # help: reading every installed distribution's entry points imports importlib.metadata (email, zipfile,
    # csv...) and costs 10-30 ms of `netsleuth drops`' start. A built-in command word is netsleuth's own: a
    # plug-in adds its own word (docs/adding-a-diagnostic.md), never a mode under one of netsleuth's.
    with_plugins = chosen is None or chosen not in builtin or top_level_help
    names = [*_COMMAND_MODULES, *_diagnostic_words(with_plugins=True)] if with_plugins else [chosen or ""]
    for name in names:
        command = _command(name, with_plugins)
        sub = subparsers.add_parser(name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(_run=command.run)
    return parser


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The command word, as argparse will read it: the first argument not starting with '-' (the top-level
    parser has no option that takes a value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if _attaching(_chosen_command(arguments)):
        pause_collection()
    else:
        resume_collection()  # the launcher (netsleuth/__main__.py) paused it before knowing the command
    try:
        return _run(arguments)
    finally:
        resume_collection()


def _run(arguments: list[str]) -> int:
    args = build_parser(arguments).parse_args(arguments)
    try:
        result: int = args._run(args)
        return result
    except NetsleuthError as error:
        if os.environ.get("NETSLEUTH_DEBUG"):
            raise
        sys.stderr.write(f"netsleuth: {error}\n")
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `netsleuth drops | head`: the reader went away; that is not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
