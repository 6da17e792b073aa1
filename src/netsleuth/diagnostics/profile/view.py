"""`netsleuth profile` on a terminal: the top functions at the end, and the stacks written as folded stacks,
an SVG flame graph and speedscope JSON (--folded, --svg, --speedscope: flags of the CLI only)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError

if TYPE_CHECKING:
    from netsleuth.diagnostics.profile.records import ProfileConfig, ProfileSummary, StackRecord

__all__ = ["ProfileView", "add_output_arguments", "run_profile", "totals_line", "write_outputs"]

_OUTPUTS = (
    ("folded", "write folded stacks (flamegraph.pl input)"),
    ("svg", "write an interactive SVG flame graph"),
    ("speedscope", "write speedscope JSON"),
)


class ProfileView:
    """How `profile` reads on a terminal (the run loop's TextView): the stacks go to the files, the terminal
    gets the top functions at the end."""

    noun = "samples"

    def lines(self, records: Sequence[Any]) -> str:
        return ""

    def finish(self, summary: ProfileSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        out = sys.stdout
        console = Console(file=out, width=None if out.isatty() else 160)
        table = Table(title=f"Top functions (leaf frames), {summary.hz} Hz on {summary.cpus} CPUs")
        for column in ("samples", "share", "function"):
            table.add_column(column, justify="left" if column == "function" else "right")
        for top in summary.top_functions:
            share = 100.0 * top.samples / summary.counted if summary.counted else 0.0
            table.add_row(
                str(top.samples), f"{share:.1f}%", escape(top.function)
            )  # "_[k]" is not rich markup
        console.print(table)
        console.print(totals_line(summary))
        for path in summary.outputs:
            console.print(f"wrote {path}")

    def loss_line(self, totals: EventTotals) -> str:
        return ""


def totals_line(summary: ProfileSummary) -> str:
    return (
        f"{summary.matched} samples ({summary.samples} taken on all CPUs) in {summary.stacks} distinct "
        f"stacks over {summary.seconds:.1f} s; {summary.kernel_stack_lost} kernel and "
        f"{summary.user_stack_lost} user stacks lost, {summary.uncounted} uncounted"
    )


def write_outputs(stacks: Sequence[StackRecord], outputs: dict[str, Path | None], title: str) -> list[str]:
    from netsleuth.diagnostics.profile.flamegraph import flamegraph_svg
    from netsleuth.diagnostics.profile.speedscope import speedscope_document

    written = []
    pairs = [(stack.frames, stack.count) for stack in stacks]
    if outputs["folded"] is not None:
        outputs["folded"].write_text("".join(stack.folded + "\n" for stack in stacks))
        written.append(str(outputs["folded"]))
    if outputs["svg"] is not None:
        outputs["svg"].write_text(flamegraph_svg(pairs, title, f"{sum(c for _, c in pairs)} samples"))
        written.append(str(outputs["svg"]))
    if outputs["speedscope"] is not None:
        outputs["speedscope"].write_text(json.dumps(speedscope_document(pairs, title)))
        written.append(str(outputs["speedscope"]))
    return written


class _WritingProfile:
    """The session, with the files written once the stacks are read (before the summary names them)."""

    def __init__(self, session: Any, outputs: dict[str, Path | None], title: str) -> None:
        self._session = session
        self._outputs = outputs
        self._title = title

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def drain(self) -> list[StackRecord]:
        stacks: list[StackRecord] = self._session.drain()
        self._session.outputs.extend(write_outputs(stacks, self._outputs, self._title))
        return stacks


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    for name, help_text in _OUTPUTS:
        parser.add_argument(f"--{name}", metavar="FILE", help=help_text)


def _writable(path: str | None, option: str) -> Path | None:
    if path is None:
        return None
    target = Path(path)
    if not target.parent.is_dir():
        raise UsageError(f"{option} {path}: the directory {target.parent} does not exist")
    return target


def run_profile(config: ProfileConfig, args: argparse.Namespace) -> int:
    """The CLI's run: the run loop, with the stack files written before the summary names them."""
    from netsleuth.commands._runloop import run_session
    from netsleuth.diagnostics.profile.session import ProfileDiagnostic

    outputs = {name: _writable(getattr(args, name), f"--{name}") for name, _ in _OUTPUTS}
    what = f"softirq {config.softirq.upper()}" if config.softirq else "on-CPU"
    title = f"netsleuth profile: {what} stacks at {config.hz} Hz"
    session = _WritingProfile(ProfileDiagnostic(config), outputs, title)
    return run_session(session, config, ProfileView(), json_lines=args.json, ready_file=args.ready_file)
