"""Every diagnostic, registered once: the CLI, agent sessions, `diagnose`, the fleet, the controller's API and
the web form all iterate this table.

A diagnostic's module exports `DIAGNOSTIC` (a `DiagnosticSpec`), or `DIAGNOSTICS` (several sharing one
module and BPF object); it is imported only when that diagnostic is asked for, so `netsleuth drops` does not
pay for importing `diagnose`. Adding one is its package and one line: here, or - for a diagnostic that lives
outside netsleuth - one `netsleuth.diagnostics` entry point of its distribution (`name = module`), found at
run time the same way (docs/adding-a-diagnostic.md).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from netsleuth.errors import UsageError

__all__ = [
    "DIAGNOSTIC_MODULES",
    "ENTRY_POINT_GROUP",
    "diagnostic_modules",
    "diagnostic_names",
    "get_diagnostic",
]

ENTRY_POINT_GROUP = "netsleuth.diagnostics"

# name -> module exporting DIAGNOSTIC (or DIAGNOSTICS, a dict of several sharing one module and BPF object).
DIAGNOSTIC_MODULES: dict[str, str] = {
    "drops": "netsleuth.diagnostics.drops",
    "resets": "netsleuth.diagnostics.tcp",
    "tcp.life": "netsleuth.diagnostics.tcp",
    "tcp.states": "netsleuth.diagnostics.tcp",
    "tcp.retrans": "netsleuth.diagnostics.tcp",
    "tcp.connlat": "netsleuth.diagnostics.tcp",
    "tcp.queues": "netsleuth.diagnostics.tcp",
    "conn": "netsleuth.diagnostics.conn",
    "dns": "netsleuth.diagnostics.dns",
    "diagnose": "netsleuth.diagnose",
    "route": "netsleuth.diagnostics.route",
    "snoop.exec": "netsleuth.diagnostics.snoop",
    "snoop.open": "netsleuth.diagnostics.snoop",
    "softirq": "netsleuth.diagnostics.softirq",
    "profile": "netsleuth.diagnostics.profile",
}


@functools.cache
def _plugin_modules() -> dict[str, str]:
    """Diagnostics other distributions register (entry points), read once: scanning the installed
    distributions costs milliseconds, so a run of a built-in diagnostic never does it."""
    from importlib.metadata import entry_points

    found: dict[str, str] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in DIAGNOSTIC_MODULES:  # a plug-in never replaces a built-in diagnostic
            found[entry.name] = entry.value.split(":", 1)[0]
    return found


def diagnostic_modules() -> dict[str, str]:
    """Every registered diagnostic: the built-in ones, then the plug-ins."""
    return {**DIAGNOSTIC_MODULES, **_plugin_modules()}


def diagnostic_names() -> tuple[str, ...]:
    return tuple(diagnostic_modules())


def get_diagnostic(name: str) -> Any:
    """The registered diagnostic `name` (a DiagnosticSpec); an unknown name is a UsageError listing the known
    ones."""
    module_name = DIAGNOSTIC_MODULES.get(name) if isinstance(name, str) else None
    if module_name is None and isinstance(name, str):
        module_name = _plugin_modules().get(name)
    if module_name is None:
        raise UsageError(f"unknown diagnostic {name!r}; known: {', '.join(diagnostic_modules())}")
    module = importlib.import_module(module_name)
    several: dict[str, Any] | None = getattr(module, "DIAGNOSTICS", None)
    return several[name] if several is not None else module.DIAGNOSTIC
