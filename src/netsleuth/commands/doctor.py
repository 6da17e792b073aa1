"""`netsleuth doctor`: sample the packet path twice, `--interval` apart, and report what is wrong and how to
fix it; `--fix ID --yes` applies one finding's fix with a rollback file and re-measures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from netsleuth.commands import Command
from netsleuth.doctor.apply import DEFAULT_ROLLBACK_DIR, apply_fix
from netsleuth.doctor.findings import Finding, Report
from netsleuth.doctor.model import Snapshot
from netsleuth.doctor.napi_measure import NapiMeasurement
from netsleuth.doctor.render import render_json, render_text
from netsleuth.doctor.rules import diagnose
from netsleuth.doctor.run import DEFAULT_INTERVAL, measure
from netsleuth.doctor.window import Window
from netsleuth.errors import UsageError

__all__ = ["COMMAND"]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval", type=float, default=DEFAULT_INTERVAL, metavar="SECONDS",
        help=f"time between the two samples rates are computed over (default {DEFAULT_INTERVAL:g})",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON object with all findings")
    parser.add_argument(
        "--netns", metavar="NAME", help="diagnose inside this network namespace (ip netns name)"
    )
    parser.add_argument("--root", type=Path, default=Path("/"), help="read /proc and /sys under this root")
    parser.add_argument("--record", type=Path, metavar="DIR", help="also save both samples to DIR (JSON)")
    parser.add_argument("--replay", type=Path, metavar="DIR", help="judge samples saved with --record")
    parser.add_argument(
        "--no-bpf", action="store_true",
        help="load no BPF programs: judge the NET_RX budget from softnet_stat only (inferred, not measured)",
    )  # fmt: skip
    parser.add_argument("--fix", metavar="ID", help="apply the fix of finding ID (needs --yes)")
    parser.add_argument("--yes", action="store_true", help="really apply the --fix")
    parser.add_argument(
        "--rollback-dir", type=Path, default=DEFAULT_ROLLBACK_DIR, metavar="DIR",
        help=f"where --fix writes its rollback file (default {DEFAULT_ROLLBACK_DIR})",
    )  # fmt: skip


def _window(args: argparse.Namespace) -> Window:
    if args.interval <= 0:
        raise UsageError("--interval must be a positive number of seconds")
    if args.replay is not None:
        try:
            before = Snapshot.from_json(json.loads((args.replay / "before.json").read_text()))
            after = Snapshot.from_json(json.loads((args.replay / "after.json").read_text()))
            napi = _replayed_napi(args.replay / _NAPI_FILE)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise UsageError(f"cannot replay {args.replay}: {error}") from error
        problem = None if napi is not None else f"{args.replay} holds no {_NAPI_FILE} (recorded without BPF)"
        return Window(before, after, napi=napi, napi_problem=problem)
    if args.root != Path("/") and not args.root.is_dir():
        raise UsageError(f"--root {args.root} is not a directory")
    window = measure(root=args.root, netns=args.netns, interval=args.interval, bpf=not args.no_bpf)
    if args.record is not None:
        args.record.mkdir(parents=True, exist_ok=True)
        (args.record / "before.json").write_text(json.dumps(window.before.to_json()))
        (args.record / "after.json").write_text(json.dumps(window.after.to_json()))
        if window.napi is not None:
            (args.record / _NAPI_FILE).write_text(json.dumps(window.napi.to_json()))
    return window


_NAPI_FILE = "napi.json"  # the BPF-measured NET_RX runs and NAPI polls, when the run measured them


def _replayed_napi(path: Path) -> NapiMeasurement | None:
    if not path.exists():
        return None
    return NapiMeasurement.from_json(json.loads(path.read_text()))


def _unknown_finding(finding_id: str, report: Report) -> UsageError:
    found = ", ".join(finding.id for finding in report.findings if finding.actions) or "none with a fix"
    return UsageError(f"no finding {finding_id!r} in this run (findings with a fix: {found})")


def _print_plan(console: Console, finding: Finding) -> None:
    console.print(f"[bold]{escape(finding.id)}[/]: {escape(finding.title)}")
    for command in finding.fix_commands:
        console.print(f"  would run: {escape(command)}")
    console.print("Nothing changed. Re-run with --yes to apply (a rollback file is written first).")


def _fix(args: argparse.Namespace, report: Report, console: Console) -> int:
    finding = report.finding(args.fix)
    if finding is None:
        raise _unknown_finding(args.fix, report)
    if not finding.actions:
        raise UsageError(f"{finding.id} has no automatic fix; its advice is in the report")
    if not args.yes:
        _print_plan(console, finding)
        return 0
    if args.replay is not None:
        raise UsageError("--fix cannot apply to a replayed recording")
    rollback_file = apply_fix(finding, rollback_dir=args.rollback_dir, netns=args.netns, root=args.root)
    for action in finding.actions:
        console.print(f"applied: {escape(action.describe())}")
    console.print(f"rollback file: {rollback_file}  (undo: netsleuth rollback {rollback_file})")
    console.print(f"re-measuring for {args.interval:g} s ...")
    after_report = diagnose(
        measure(root=args.root, netns=args.netns, interval=args.interval, bpf=not args.no_bpf)
    )
    still = after_report.finding(finding.id)
    before = json.dumps(finding.evidence)
    if still is None:
        console.print(f"[green]{escape(finding.id)} is gone[/] (before: {escape(before)})")
    else:
        now = json.dumps(still.evidence)
        console.print(
            f"[yellow]{escape(finding.id)} still present[/]: before {escape(before)}, now {escape(now)}"
        )
    return 0


def _run(args: argparse.Namespace) -> int:
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    if args.fix is not None:
        if args.json:
            raise UsageError("--fix and --json cannot be combined")
        return _fix(args, diagnose(_window(args)), console)
    report = diagnose(_window(args))
    if args.json:
        sys.stdout.write(render_json(report) + "\n")
    else:
        render_text(report, console)
    return 0


COMMAND = Command(
    name="doctor",
    help="check NIC, IRQ, softirq, socket and offload health on rates, and say how to fix what is wrong",
    add_arguments=_add_arguments,
    run=_run,
)
