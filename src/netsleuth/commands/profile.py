"""`netsleuth profile`: on-CPU stacks sampled at --hz on every CPU, counted in the kernel, written as folded
stacks, an SVG flame graph and speedscope JSON; the top functions on the terminal."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netsleuth.commands import Command
from netsleuth.commands._runloop import run_session
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError

if TYPE_CHECKING:
    from netsleuth.diagnostics.profile import ProfileStack, ProfileSummary

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hz", default="99", help="samples per second on each CPU (default 99)")
    parser.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long")
    parser.add_argument(
        "--json", action="store_true", help="JSON Lines: one object per stack, then a summary"
    )
    parser.add_argument("--ready-file", metavar="PATH", help="create this file once the probes are attached")
    parser.add_argument("--folded", metavar="FILE", help="write folded stacks (flamegraph.pl input)")
    parser.add_argument("--svg", metavar="FILE", help="write an interactive SVG flame graph")
    parser.add_argument("--speedscope", metavar="FILE", help="write speedscope JSON")
    parser.add_argument("--kernel-only", action="store_true", help="kernel stacks only")
    parser.add_argument("--include-idle", action="store_true", help="also sample the idle task")
    parser.add_argument(
        "--softirq", metavar="VECTOR", help="only samples taken while this softirq runs: NET_RX or NET_TX"
    )
    group = parser.add_argument_group("filters (applied in the kernel)")
    group.add_argument("--pid", help="process id")
    group.add_argument("--comm", help="process name")
    group.add_argument(
        "--netns", help="network namespace of the task: inode, `ip netns` name, /proc/PID/ns/net"
    )
    group.add_argument("--cgroup", help="cgroup v2 path or id")


def _writable(path: str | None, option: str) -> Path | None:
    if path is None:
        return None
    target = Path(path)
    if not target.parent.is_dir():
        raise UsageError(f"{option} {path}: the directory {target.parent} does not exist")
    return target


class ProfileView:
    noun = "samples"

    def __init__(self, outputs: dict[str, Path | None], json_lines: bool) -> None:
        self._outputs = outputs
        self._json = json_lines
        self.stacks: list[ProfileStack] = []

    def lines(self, records: Sequence[Any]) -> str:
        self.stacks.extend(records)
        return ""  # the stacks go to the files; the terminal gets the top functions at the end

    def finish(self, summary: ProfileSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        out = sys.stdout
        console = Console(file=out, width=None if out.isatty() else 160)
        table = Table(title=f"Top functions (leaf frames), {summary.hz} Hz on {summary.cpus} CPUs")
        for column in ("samples", "share", "function"):
            table.add_column(column, justify="left" if column == "function" else "right")
        for name, count in summary.top_functions:
            share = 100.0 * count / summary.counted if summary.counted else 0.0
            table.add_row(str(count), f"{share:.1f}%", escape(name))  # "_[k]" is not rich markup
        console.print(table)
        console.print(totals_line(summary))
        for path in summary.outputs:
            console.print(f"wrote {path}")

    def loss_line(self, totals: EventTotals) -> str:
        return ""


def totals_line(summary: ProfileSummary) -> str:
    totals = summary.totals
    return (
        f"{totals.matched} samples ({totals.samples} taken on all CPUs) in {summary.stacks} distinct stacks "
        f"over {summary.seconds:.1f} s; {totals.kernel_lost} kernel and {totals.user_lost} user stacks lost, "
        f"{totals.uncounted} uncounted"
    )


def write_outputs(stacks: Sequence[ProfileStack], outputs: dict[str, Path | None], title: str) -> list[str]:
    from netsleuth.render.flamegraph import flamegraph_svg
    from netsleuth.render.speedscope import speedscope_document

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

    def drain(self) -> list[ProfileStack]:
        stacks: list[ProfileStack] = self._session.drain()
        self._session.outputs.extend(write_outputs(stacks, self._outputs, self._title))
        return stacks


def run(args: argparse.Namespace) -> int:
    from netsleuth.diagnostics.profile import DIAGNOSTIC, ProfileDiagnostic

    config = DIAGNOSTIC.config_from_args(args)
    outputs = {
        "folded": _writable(args.folded, "--folded"),
        "svg": _writable(args.svg, "--svg"),
        "speedscope": _writable(args.speedscope, "--speedscope"),
    }
    what = f"softirq {config.softirq}" if config.softirq else "on-CPU"
    title = f"netsleuth profile: {what} stacks at {config.hz} Hz"
    session = _WritingProfile(ProfileDiagnostic(config), outputs, title)
    return run_session(
        session,
        config.run_options,
        ProfileView(outputs, args.json),
        json_lines=args.json,
        ready_file=args.ready_file,
    )


COMMAND = Command(
    name="profile",
    help="on-CPU stacks on every CPU (or inside NET_RX/NET_TX softirqs): flame graph, folded, speedscope",
    add_arguments=add_arguments,
    run=run,
)
