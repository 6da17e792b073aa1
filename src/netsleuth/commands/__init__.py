"""The subcommands. Each module exports one `COMMAND`; cli.py builds the parser from `ALL_COMMANDS`.

A command is a thin shell: it parses its arguments into a diagnostic's config, runs the diagnostic and hands
the typed records to a renderer. Nothing here touches libbpf.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import msgspec

__all__ = ["Command"]


class Command(msgspec.Struct, frozen=True):
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
