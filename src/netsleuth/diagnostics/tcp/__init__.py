"""The diagnostics the tcp object serves (bpf/tcp.bpf.c), sharing it: `resets` (every RST sent or received,
and connections killed without one, each with its cause in plain words) and `tcp life | states | retrans |
connlat | queues` (TCP's own events, like tcplife, tcpstates, tcpretrans and tcpconnlat, and queue drops).

They take a socket's filters (no interface: TCP events belong to sockets), all applied in the kernel; each
loads only the programs its events need. `conn` and `diagnose` use the same object through
netsleuth.diagnostics.tcp.program and the enrichers; `resets` declares the tcp part of `diagnose`
(rules.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from netsleuth.diagnostics.tcp.records import (
    AbortRecord,
    ConnectRecord,
    LifeRecord,
    QueueRecord,
    ResetRecord,
    ResetsConfig,
    ResetsSummary,
    RetransRecord,
    StateRecord,
    TcpConfig,
    TcpSummary,
)
from netsleuth.spec.diagnose import DiagnoseWatch, lazy
from netsleuth.spec.diagnostic import DiagnosticSpec
from netsleuth.spec.records import Record
from netsleuth.spec.scope import ScopeTraits

if TYPE_CHECKING:
    from netsleuth.diagnostics.model import DiagnosticSession
    from netsleuth.diagnostics.tcp.view import ResetsView, TcpView
    from netsleuth.kernel.context import KernelContext

__all__ = ["DIAGNOSTICS"]

# tp_btf, or raw_tp where it is missing; events go through a perf buffer on a kernel without ring buffers.
_NEEDS = ("can_trace", "btf", "raw_tp")
# Resets, aborts and TCP events carry their namespace and both addresses: both scopes are kept in the
# kernel (the namespace and the "either address" filters) and checked on every record.
_SCOPE = ScopeTraits(netns_field="netns", address_field="host")
# A reset is a hop of a flow the controller follows across hosts and NATs (fleet/merge.py): a fleet session of
# resets ships this host's conntrack entries of its flows too.
_RESETS_SCOPE = ScopeTraits(netns_field="netns", address_field="host", joins_conntrack=True)
_RULES = "netsleuth.diagnostics.tcp.rules"  # resets' part of `diagnose`


def _open_resets(config: ResetsConfig, context: KernelContext | None) -> DiagnosticSession:
    from netsleuth.diagnostics.tcp.session import ResetsDiagnostic

    return ResetsDiagnostic(config, context)


def _resets_view(_config: ResetsConfig) -> ResetsView:
    from netsleuth.diagnostics.tcp.view import ResetsView

    return ResetsView()


def _open_view(name: str) -> Callable[[TcpConfig, KernelContext | None], DiagnosticSession]:
    def open_session(config: TcpConfig, context: KernelContext | None) -> DiagnosticSession:
        from netsleuth.diagnostics.tcp.session import TcpEventsDiagnostic

        return TcpEventsDiagnostic(name, config, context)

    return open_session


def _text_view(name: str) -> Callable[[TcpConfig], TcpView]:
    def view(_config: TcpConfig) -> TcpView:
        from netsleuth.diagnostics.tcp.view import TcpView

        return TcpView(name)

    return view


_VIEWS: dict[str, tuple[str, type[Record]]] = {
    "life": (
        "each connection's life when it closes: process, endpoints, duration, bytes (like tcplife)",
        LifeRecord,
    ),
    "states": (
        "every TCP state change with the time spent in the previous state (like tcpstates)",
        StateRecord,
    ),
    "retrans": (
        "retransmits: SYN, SYN-ACK, tail loss probe, timeout, fast; per-flow counts (like tcpretrans)",
        RetransRecord,
    ),
    "connlat": (
        "connect latency per process and destination, and failed connects with errno (like tcpconnlat)",
        ConnectRecord,
    ),
    "queues": (
        "accept-queue overflows, receive-buffer and memory drops, SYN-queue counters, with owners",
        QueueRecord,
    ),
}

DIAGNOSTICS: dict[str, DiagnosticSpec[ResetsConfig] | DiagnosticSpec[TcpConfig]] = {
    "resets": DiagnosticSpec(
        name="resets",
        help="every TCP reset sent or received: state, trigger, kernel reason, owner, and why in plain words",
        config=ResetsConfig,
        records=(ResetRecord, AbortRecord, ResetsSummary),
        open=_open_resets,
        objects=("tcp",),
        scope=_RESETS_SCOPE,
        needs=_NEEDS,
        view=_resets_view,
        # One tcp object counts resets and retransmits for diagnose's window.
        diagnose=DiagnoseWatch(
            watched="TCP resets and retransmits",
            open=lazy(_RULES, "TcpWindowSession"),
            rules=lazy(_RULES, "tcp_verdicts"),
            progress=lazy(_RULES, "progress"),
        ),
    ),
    **{
        f"tcp.{name}": DiagnosticSpec(
            name=f"tcp.{name}",
            help=text,
            config=TcpConfig,
            records=(record, TcpSummary),
            open=_open_view(name),
            objects=("tcp",),
            scope=_SCOPE,
            needs=_NEEDS,
            view=_text_view(name),
        )
        for name, (text, record) in _VIEWS.items()
    },
}
