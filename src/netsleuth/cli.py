"""Argument parsing, exit codes and error messages: the only place that talks to the terminal's exit status.

Exit codes: 0 success, 1 the environment lacks something (root, BTF, libbpf), 2 bad input. Errors are one
sentence on stderr; a traceback is shown only with NETSLEUTH_DEBUG=1, for bugs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from netsleuth import __version__
from netsleuth.commands import Command
from netsleuth.errors import EXIT_USAGE, NetsleuthError

__all__ = ["build_parser", "main"]


def _all_commands() -> list[Command]:
    # Imported here so `netsleuth --help` stays fast and one broken command cannot break the others' import.
    from netsleuth.commands import doctor, drops, offload, rollback

    return [drops.COMMAND, doctor.COMMAND, offload.COMMAND, rollback.COMMAND]


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage block on error; we print one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="netsleuth",
        description="Tells you why your Linux network misbehaves: drops, resets, path health.",
    )
    parser.add_argument("--version", action="version", version=f"netsleuth {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_OneLineParser)
    subparsers.required = True
    for command in _all_commands():
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
