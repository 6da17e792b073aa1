"""The CLI command of every diagnostic, derived from its spec: `netsleuth drops`, `netsleuth tcp life`.

Its flags are the config's fields (netsleuth.spec.flags) plus the run loop's terminal flags (`--json`,
`--ready-file`) and whatever the spec adds for a terminal only (`CliRun.add_arguments`); it runs the
diagnostic through the one run loop with the spec's text view. A command word with several diagnostics
(`tcp`: tcp.life, tcp.states...) gets one sub-command each.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from netsleuth.commands import Command
from netsleuth.spec.diagnostic import DiagnosticSpec
from netsleuth.spec.flags import add_config_flags

__all__ = ["diagnostic_command", "run_diagnostic"]


def _add_spec_arguments(parser: argparse.ArgumentParser, spec: DiagnosticSpec[Any]) -> None:
    add_config_flags(parser, spec.config)
    parser.add_argument("--json", action="store_true", help="JSON Lines output, ending with a summary object")
    parser.add_argument("--ready-file", metavar="PATH", help="create this file once the probes are attached")
    if spec.cli.add_arguments is not None:
        spec.cli.add_arguments(parser)
    parser.set_defaults(_spec=spec)


def run_diagnostic(args: argparse.Namespace) -> int:
    """Run the diagnostic the parsed arguments chose, until Ctrl-C or its --duration."""
    from netsleuth.commands._runloop import run_session

    spec: DiagnosticSpec[Any] = args._spec
    config = spec.config_from_args(args)
    if spec.cli.run is not None:
        return spec.cli.run(config, args)
    if spec.view is None:
        raise AssertionError(f"{spec.name} has no text view and no CLI run")
    return run_session(
        spec.open(config, None), config, spec.view(config), json_lines=args.json, ready_file=args.ready_file
    )


def diagnostic_command(word: str, specs: Sequence[DiagnosticSpec[Any]]) -> Command:
    """The command for one CLI word: the diagnostic itself, or a sub-command per diagnostic under it."""
    if len(specs) == 1 and specs[0].command == (word,):
        (spec,) = specs

        def add_one(parser: argparse.ArgumentParser) -> None:
            _add_spec_arguments(parser, spec)

        return Command(name=word, help=spec.help, add_arguments=add_one, run=run_diagnostic)

    def add_several(parser: argparse.ArgumentParser) -> None:
        subparsers = parser.add_subparsers(dest="mode", metavar="MODE", parser_class=type(parser))
        subparsers.required = True
        for spec in specs:
            sub = subparsers.add_parser(
                spec.command[-1], help=spec.help, description=spec.description or spec.help
            )
            _add_spec_arguments(sub, spec)

    help_text = "; ".join(f"{spec.command[-1]}: {spec.help}" for spec in specs)
    return Command(name=word, help=help_text, add_arguments=add_several, run=run_diagnostic)
