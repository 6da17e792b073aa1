"""`snoop exec` and `snoop open`: execsnoop and opensnoop from tracepoints (bpf/snoop.bpf.c).

`exec` reports every execve/execveat with its arguments and result, and the exit status of each process
whose exec it reported; `open` every open/openat with its fd or error. Both take the filters that apply to a
process (--pid, --comm, --netns, --cgroup) and --failed, all applied in the kernel, and name the process's
network namespace and container.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from netsleuth.diagnostics.snoop.records import ExecRecord, ExitRecord, OpenRecord, SnoopConfig, SnoopSummary
from netsleuth.spec.diagnostic import DiagnosticSpec
from netsleuth.spec.scope import ScopeTraits

if TYPE_CHECKING:
    from netsleuth.diagnostics.model import DiagnosticSession
    from netsleuth.diagnostics.snoop.view import SnoopView
    from netsleuth.kernel.context import KernelContext

__all__ = ["DIAGNOSTICS"]


def _open(mode: str) -> Callable[[SnoopConfig, KernelContext | None], DiagnosticSession]:
    def open_session(config: SnoopConfig, context: KernelContext | None) -> DiagnosticSession:
        from netsleuth.diagnostics.snoop.session import SnoopDiagnostic

        return SnoopDiagnostic(mode, config, context)

    return open_session


def _view(mode: str) -> Callable[[SnoopConfig], SnoopView]:
    def view(_config: SnoopConfig) -> SnoopView:
        from netsleuth.diagnostics.snoop.view import SnoopView

        return SnoopView(mode)

    return view


def _spec(mode: str, help_text: str) -> DiagnosticSpec[SnoopConfig]:
    return DiagnosticSpec(
        name=f"snoop.{mode}",
        help=help_text,
        config=SnoopConfig,
        records=(ExecRecord, ExitRecord, SnoopSummary) if mode == "exec" else (OpenRecord, SnoopSummary),
        open=_open(mode),
        objects=("snoop",),
        # Its processes carry a namespace but no address: a namespace scope is kept in the kernel, an
        # address scope cannot be.
        scope=ScopeTraits(netns_field="netns", address_field=None),
        view=_view(mode),
        # Classic tracepoints (opened by their tracefs id), events through the ring buffer.
        needs=("can_trace", "btf", "ring_buffer"),
    )


DIAGNOSTICS: dict[str, DiagnosticSpec[SnoopConfig]] = {
    "snoop.exec": _spec("exec", "every exec with its arguments, result and exit status (execsnoop)"),
    "snoop.open": _spec("open", "every file open with its fd or error (opensnoop)"),
}
