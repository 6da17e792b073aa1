"""`netsleuth rollback FILE`: restore exactly the values a `doctor --fix` replaced."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from netsleuth.commands import Command
from netsleuth.doctor.apply import rollback

__all__ = ["COMMAND"]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE", help="the rollback file `doctor --fix` printed")


def _run(args: argparse.Namespace) -> int:
    for change in rollback(args.file):
        action = change.action
        where = f"{action.target} {action.setting}".strip()
        sys.stdout.write(f"restored {action.kind.value} {where}: {action.value} -> {change.previous}\n")
    return 0


COMMAND = Command(
    name="rollback",
    help="undo a `doctor --fix` from the rollback file it wrote",
    add_arguments=_add_arguments,
    run=_run,
)
