"""The subcommands. Each module exports one `COMMAND`; cli.py builds the parser from `ALL_COMMANDS`.

A command is a thin shell: it parses its arguments into a diagnostic's config, runs the diagnostic and hands
the typed records to a renderer. Nothing here touches libbpf.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Command"]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
