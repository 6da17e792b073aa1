"""`signals`: every kill(2) with its sender's and its target's network namespaces - a diagnostic that lives
outside netsleuth, in its own package, registered by one `netsleuth.diagnostics` entry point of its own
distribution (tests/privileged/test_plugin_diagnostic.py makes that distribution). Nothing in netsleuth
names it: the CLI, agent sessions, fleet tasks, the controller's OpenAPI and the web form all find it.

Its kernel side (signals.bpf.c, compiled into the package as signals.bpf.o) filters by the sender's network
namespace; its records also name the target's, joined in user space - so under a fleet scope a kill sent
from inside the scope to a process outside it is withheld by the last line, not by the kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from netsleuth.spec.diagnostic import DiagnosticSpec
from netsleuth.spec.scope import ScopeTraits

from .records import SignalRecord, SignalsConfig, SignalsSummary

if TYPE_CHECKING:
    from netsleuth.diagnostics.model import DiagnosticSession
    from netsleuth.kernel.context import KernelContext

__all__ = ["DIAGNOSTIC"]


def _open(config: SignalsConfig, context: KernelContext | None) -> DiagnosticSession:
    from .session import SignalsDiagnostic

    return SignalsDiagnostic(config)


def _view(_config: SignalsConfig) -> Any:
    from .session import SignalsView

    return SignalsView()


DIAGNOSTIC: DiagnosticSpec[SignalsConfig] = DiagnosticSpec(
    name="signals",
    help="every kill(2) with the sender's and the target's network namespaces",
    config=SignalsConfig,
    records=(SignalRecord, SignalsSummary),
    open=_open,
    # The sender's namespace is filtered in the kernel; its records carry no address.
    scope=ScopeTraits(netns_field="netns", address_field=None),
    view=_view,
    needs=("can_trace", "btf", "ring_buffer"),
)
