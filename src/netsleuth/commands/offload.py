"""`netsleuth offload show [DEV...]` and `netsleuth offload set DEV FEATURE on|off`."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.markup import escape

from netsleuth.commands import Command
from netsleuth.doctor.offload import FeatureRow, set_offload, show_offloads

__all__ = ["COMMAND"]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="offload_action", metavar="ACTION", parser_class=type(parser))
    actions.required = True
    show = actions.add_parser("show", help="every feature with on/off/fixed and what it does")
    show.add_argument("devices", nargs="*", metavar="DEV", help="devices (default: all but lo)")
    show.add_argument("--json", action="store_true", help="JSON object: device -> list of features")
    show.add_argument("--netns", metavar="NAME", help="inside this network namespace")
    change = actions.add_parser("set", help="turn one feature on or off (on a bond also on its slaves)")
    change.add_argument("device", metavar="DEV")
    change.add_argument("feature", metavar="FEATURE", help="kernel name (rx-gro) or ethtool -K name (gro)")
    change.add_argument("state", choices=("on", "off"))
    change.add_argument("--netns", metavar="NAME", help="inside this network namespace")


def _state(row: FeatureRow) -> str:
    return ("on" if row.active else "off") + (" [fixed]" if row.fixed else "")


def _show(args: argparse.Namespace, console: Console) -> int:
    table = show_offloads(args.devices or None, args.netns)
    if args.json:
        payload = {
            device: [
                {
                    "feature": row.name,
                    "active": row.active,
                    "fixed": row.fixed,
                    "description": row.description,
                }
                for row in rows
            ]
            for device, rows in table.items()
        }
        sys.stdout.write(json.dumps(payload) + "\n")
        return 0
    for device, rows in table.items():
        console.print(f"[bold]{escape(device)}[/]")
        width = max((len(row.name) for row in rows), default=0)
        for row in rows:
            style = "dim" if row.fixed else ("green" if row.active else "yellow")
            state = escape(f"{_state(row):<11}")
            console.print(f"  {row.name:<{width}}  [{style}]{state}[/] {escape(row.description)}")
    return 0


def _set(args: argparse.Namespace, console: Console) -> int:
    results = set_offload(args.device, args.feature, args.state == "on", args.netns)
    failed = False
    for result in results:
        before, after = ("on" if result.before else "off"), ("on" if result.after else "off")
        note = "" if after == args.state else "  (the kernel kept it: a feature it depends on is off)"
        failed |= after != args.state
        console.print(f"{result.device} {result.feature}: {before} -> {after}{escape(note)}")
    return 1 if failed else 0


def _run(args: argparse.Namespace) -> int:
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    if args.offload_action == "show":
        return _show(args, console)
    return _set(args, console)


COMMAND = Command(
    name="offload",
    help="show NIC offload features and what each does, or turn one on/off (bond slaves too)",
    add_arguments=_add_arguments,
    run=_run,
)
