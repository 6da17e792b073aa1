"""Safe apply: one finding's `FixAction`s, after writing a rollback file with the values they replace, and
`rollback` that puts exactly those values back.

Order matters for safety: read every previous value first (any failure stops before a change), write the
rollback file, then apply; if an action fails midway the ones already applied are undone. Only the targets
a finding names are touched: an action whose target does not appear in the finding's own fix commands is
refused as a bug.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netsleuth.doctor import ethtool
from netsleuth.doctor.findings import Finding, FixAction, FixKind
from netsleuth.doctor.fixes import action_netns
from netsleuth.doctor.procfs import sysctl_path
from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.kernel.netns_exec import call_in_netns

__all__ = [
    "DEFAULT_ROLLBACK_DIR",
    "AppliedChange",
    "apply_actions",
    "apply_fix",
    "read_current",
    "rollback",
]

DEFAULT_ROLLBACK_DIR = Path("/var/lib/netsleuth/rollback")
ROLLBACK_VERSION = 1

_CHANNEL_FIELDS = {"combined_count", "rx_count", "tx_count", "other_count"}


@dataclass(frozen=True)
class AppliedChange:
    action: FixAction  # action.value is the new value
    previous: str

    def to_json(self) -> dict[str, str]:
        return {**self.action.to_json(), "previous": self.previous}


def _file_path(root: Path, target: str) -> Path:
    return root / target.lstrip("/")


def _feature_state(device: str, feature: str) -> tuple[bool, bool]:
    from pyroute2.ethtool import Ethtool

    with Ethtool() as tool:
        try:
            features = tool.get_features(device).features
        except Exception as error:
            raise UsageError(f"cannot read features of {device}: {error}") from error
    if feature not in features:
        raise UsageError(f"{device} has no feature {feature!r}")
    state = features[feature]
    return bool(state.enable), not state.available


def read_current(action: FixAction, root: Path) -> str:
    """The value `action` would replace, in the same notation as `action.value`."""
    if action.kind is FixKind.SYSCTL:
        return " ".join(sysctl_path(root, action.target).read_text().split())
    if action.kind is FixKind.FILE:
        return _file_path(root, action.target).read_text().strip()
    if action.kind is FixKind.FEATURE:
        active, fixed = _feature_state(action.target, action.setting)
        if fixed:
            raise UsageError(
                f"{action.setting} is fixed on {action.target}: the driver does not allow changing it"
            )
        return "on" if active else "off"
    from pyroute2.ethtool import Ethtool

    with Ethtool() as tool:
        if action.kind is FixKind.RING:
            return str(getattr(tool.get_rings(action.target), action.setting))
        if action.kind is FixKind.CHANNELS:
            return str(getattr(tool.get_channels(action.target), action.setting))
        if action.kind is FixKind.COALESCE:
            return str(tool.get_coalesce(action.target)[action.setting])
    if action.kind is FixKind.MTU:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            links = ipr.link("get", ifname=action.target)
            return str(links[0].get_attr("IFLA_MTU"))
    raise UsageError(f"unknown fix kind {action.kind}")


def _write(action: FixAction, value: str, root: Path) -> None:
    if action.kind is FixKind.SYSCTL:
        sysctl_path(root, action.target).write_text(value + "\n")
    elif action.kind is FixKind.FILE:
        _file_path(root, action.target).write_text(value + "\n")
    elif action.kind is FixKind.FEATURE:
        got = ethtool.set_features(action.target, {action.setting: value == "on"})
        if got[action.setting] != (value == "on"):
            raise EnvironmentProblem(
                f"{action.target} kept {action.setting} {'off' if value == 'on' else 'on'}: "
                f"a feature it depends on is off"
            )
    elif action.kind is FixKind.RING:
        ethtool.set_rings(action.target, **{action.setting: int(value)})
    elif action.kind is FixKind.CHANNELS:
        if action.setting not in _CHANNEL_FIELDS:
            raise UsageError(f"unknown channel setting {action.setting}")
        ethtool.set_channels(action.target, {action.setting: int(value)})
    elif action.kind is FixKind.COALESCE:
        ethtool.set_coalesce(action.target, {action.setting: int(value)})
    elif action.kind is FixKind.MTU:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            try:
                ipr.link("set", ifname=action.target, mtu=int(value))
            except Exception as error:  # NetlinkError: the kernel's range check (e.g. a tunnel's max MTU)
                raise EnvironmentProblem(
                    f"the kernel refused MTU {value} on {action.target}: {error}"
                ) from error


def _read_all(actions: tuple[FixAction, ...], root: Path) -> list[str]:
    values: list[str] = []
    for action in actions:
        try:
            values.append(read_current(action, root))
        except (OSError, ethtool.EthtoolRefused) as error:
            raise EnvironmentProblem(
                f"cannot read {action.describe()} before changing it: {error}"
            ) from error
    return values


def apply_actions(changes: list[AppliedChange], root: Path, use_previous: bool) -> None:
    """Write each change's new (or, with use_previous, old) value; undo what was done if one fails."""
    done: list[AppliedChange] = []
    try:
        for change in changes:
            _write(change.action, change.previous if use_previous else change.action.value, root)
            done.append(change)
    except (OSError, ethtool.EthtoolRefused, EnvironmentProblem) as error:
        for change in reversed(done):
            try:
                _write(change.action, change.action.value if use_previous else change.previous, root)
            except (OSError, ethtool.EthtoolRefused, EnvironmentProblem):
                continue
        target = changes[len(done)].action
        raise EnvironmentProblem(
            f"could not set {target.describe()}: {error}; earlier changes undone"
        ) from error


def _check_named(finding: Finding) -> None:
    commands = " ".join(finding.fix_commands)
    for action in finding.actions:
        if action.target not in commands:
            raise EnvironmentProblem(
                f"refusing {action.describe()}: the finding {finding.id} does not name it"
            )


def _require_root() -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem("applying a fix needs root (CAP_NET_ADMIN and write access to /proc/sys)")


def apply_fix(
    finding: Finding,
    rollback_dir: Path = DEFAULT_ROLLBACK_DIR,
    netns: str | None = None,
    root: Path = Path("/"),
) -> Path:
    """Apply `finding`'s actions; return the rollback file written before anything changed."""
    if not finding.actions:
        raise UsageError(f"{finding.id} has no automatic fix; its advice is in the report")
    _check_named(finding)
    if root == Path("/"):
        _require_root()
    netns = action_netns(finding.actions, netns)
    previous = call_in_netns(netns, lambda: _read_all(finding.actions, root))
    changes = [AppliedChange(action, old) for action, old in zip(finding.actions, previous, strict=True)]
    rollback_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    safe_id = finding.id.replace(":", "_").replace("/", "_")
    path = rollback_dir / f"{stamp}-{safe_id}.json"
    document: dict[str, Any] = {
        "version": ROLLBACK_VERSION,
        "finding": finding.id,
        "netns": netns,
        "root": str(root),
        "created": stamp,
        "changes": [change.to_json() for change in changes],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    call_in_netns(netns, lambda: apply_actions(changes, root, use_previous=False))
    return path


def _load(path: Path) -> tuple[dict[str, Any], list[AppliedChange]]:
    try:
        document = json.loads(path.read_text())
        changes = [
            AppliedChange(FixAction.from_json(raw), previous=str(raw["previous"]))
            for raw in document["changes"]
        ]
    except FileNotFoundError as error:
        raise UsageError(f"no rollback file {path}") from error
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(f"{path} is not a netsleuth rollback file") from error
    if document.get("version") != ROLLBACK_VERSION:
        raise UsageError(f"{path} has rollback format {document.get('version')}, expected {ROLLBACK_VERSION}")
    return document, changes


def rollback(path: Path) -> list[AppliedChange]:
    """Restore every previous value recorded in `path`, last change first; return what was restored."""
    document, changes = _load(path)
    root = Path(document.get("root") or "/")
    if root == Path("/"):
        _require_root()
    restore_order = list(reversed(changes))
    call_in_netns(document.get("netns"), lambda: apply_actions(restore_order, root, use_previous=True))
    return restore_order
