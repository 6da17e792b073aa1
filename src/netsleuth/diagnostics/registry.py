"""Every diagnostic, registered once: the CLI, agent sessions, `diagnose` and the fleet iterate this table.

A diagnostic's module exports `DIAGNOSTIC` (a `DiagnosticSpec`); it is imported only when that diagnostic is
asked for, so `netsleuth drops` does not pay for importing `diagnose`. Adding a diagnostic is its `.bpf.c`,
its module and one line here (docs/adding-a-diagnostic.md).
"""

from __future__ import annotations

import importlib
from typing import Any

from netsleuth.diagnostics.model import DiagnosticSpec
from netsleuth.errors import UsageError

__all__ = ["DIAGNOSTIC_MODULES", "diagnostic_names", "get_diagnostic"]

# name -> module exporting DIAGNOSTIC (or DIAGNOSTICS, a dict of several sharing one module and BPF object).
DIAGNOSTIC_MODULES: dict[str, str] = {
    "drops": "netsleuth.diagnostics.drops",
    "resets": "netsleuth.diagnostics.tcp_diagnostics",
    "tcp.life": "netsleuth.diagnostics.tcp_diagnostics",
    "tcp.states": "netsleuth.diagnostics.tcp_diagnostics",
    "tcp.retrans": "netsleuth.diagnostics.tcp_diagnostics",
    "tcp.connlat": "netsleuth.diagnostics.tcp_diagnostics",
    "tcp.queues": "netsleuth.diagnostics.tcp_diagnostics",
    "conn": "netsleuth.diagnostics.conn_diagnostic",
    "dns": "netsleuth.diagnostics.dns",
    "diagnose": "netsleuth.diagnose.diagnostic",
    "route": "netsleuth.diagnostics.route",
    "snoop.exec": "netsleuth.diagnostics.snoop",
    "snoop.open": "netsleuth.diagnostics.snoop",
    "softirq": "netsleuth.diagnostics.softirq",
    "profile": "netsleuth.diagnostics.profile",
}


def diagnostic_names() -> tuple[str, ...]:
    return tuple(DIAGNOSTIC_MODULES)


def get_diagnostic(name: str) -> DiagnosticSpec[Any]:
    """The registered diagnostic `name`; an unknown name is a UsageError listing the known ones."""
    module_name = DIAGNOSTIC_MODULES.get(name) if isinstance(name, str) else None
    if module_name is None:
        raise UsageError(f"unknown diagnostic {name!r}; known: {', '.join(DIAGNOSTIC_MODULES)}")
    module = importlib.import_module(module_name)
    several: dict[str, DiagnosticSpec[Any]] | None = getattr(module, "DIAGNOSTICS", None)
    spec: DiagnosticSpec[Any] = several[name] if several is not None else module.DIAGNOSTIC
    return spec
