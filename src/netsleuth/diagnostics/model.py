"""What a diagnostic is once opened, whoever runs it (the CLI, an agent session, `diagnose`, a fleet task): a
`DiagnosticSession` that yields typed records and a typed summary.

A diagnostic is a `netsleuth.spec.diagnostic.DiagnosticSpec` registered once (netsleuth.diagnostics.registry);
its `open(config, context)` gives the session. Records are msgspec Structs (netsleuth.spec.records) whose JSON
carries `"type"` and `"v"`; consumers read their attributes, never their JSON. Every session of one run shares
one `KernelContext`, so kallsyms is read once and every record's time comes from the same clock offset,
carried in the summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from netsleuth.diagnostics.totals import EventTotals

__all__ = ["DiagnosticSession", "Record"]


class Record(Protocol):
    """A typed record: a drop, a reset, a tcp event, a connection, a verdict, a summary."""

    def to_json(self) -> Mapping[str, Any]: ...


class DiagnosticSession(Protocol):
    """A diagnostic attached to the kernel. `start` loads and attaches (a fleet task's *prepare*); `poll`
    returns the records that arrived; `summary` is the closing record with exact totals and the clock."""

    @property
    def attach_kind(self) -> str:
        """How the programs attached (tp_btf, raw_tp, ...), once started."""
        ...

    def start(self) -> None: ...

    def poll(self, timeout_ms: int) -> Sequence[Record]: ...

    def drain(self) -> Sequence[Record]: ...

    def totals(self) -> EventTotals: ...

    def summary(self, interrupted: bool) -> Record: ...

    def program_fds(self) -> dict[str, int]: ...

    def notes(self) -> list[str]: ...

    def close(self) -> None: ...
