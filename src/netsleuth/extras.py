"""The optional parts of netsleuth and the pip extra each comes in: pyproject.toml's
[project.optional-dependencies], read back from the installed package's metadata, so the list is written
once.

The core install is the single-host CLI and the agent's exporter. A command that needs more - the fleet link,
the controller - calls `require_extra` before importing it, and a missing package becomes one sentence naming
the extra to install (exit 2), never an ImportError traceback.
"""

from __future__ import annotations

import re

from netsleuth.errors import UsageError

__all__ = ["MissingExtra", "extra_requirements", "require_extra"]

_DISTRIBUTION = "netsleuth"
# A requirement line of the package metadata (PEP 508): 'nats-py>=2.6; extra == "fleet"',
# 'netsleuth[fleet]; extra == "controller"'.
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


class MissingExtra(UsageError):
    """A command needs an optional part of netsleuth that this installation lacks."""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_requirements(extra: str, requirements: list[str]) -> list[str]:
    """The distribution names `extra` needs, given the package's requirement lines, following an extra that
    names netsleuth's own other extras (controller = netsleuth[fleet] + ...)."""
    names: list[str] = []
    wanted, seen = [extra], set()
    while wanted:
        current = wanted.pop()
        if current in seen:
            continue
        seen.add(current)
        for line in requirements:
            requirement, _, marker = line.partition(";")
            marked = _EXTRA_MARKER.search(marker)
            if marked is None or marked[1] != current:
                continue
            match = _NAME.match(requirement)
            if match is None:
                continue
            if _canonical(match[1]) == _DISTRIBUTION:
                wanted.extend(part.strip() for part in (match[2] or "").split(",") if part.strip())
            elif match[1] not in names:
                names.append(match[1])
    return names


def require_extra(extra: str, needed_by: str) -> None:
    """Raise MissingExtra when a distribution of `extra` is not installed; `needed_by` names what needs it
    ("netsleuth controller", "the agent's [fleet] section")."""
    from importlib import metadata

    try:
        requirements = metadata.requires(_DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return  # run from a source tree without an install: no metadata to check against; imports decide
    declared = extra_requirements(extra, requirements)
    if not declared:
        raise LookupError(
            f"pyproject.toml declares no extra {extra!r}"
        )  # a bug in the caller, not the user's
    missing = []
    for name in declared:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        packages = ", ".join(missing)
        verb = "is" if len(missing) == 1 else "are"
        raise MissingExtra(
            f"{needed_by} needs the {extra!r} extra ({packages} {verb} not installed): "
            f"pip install 'netsleuth[{extra}]'"
        )
