"""`conn`: one timeline per connection - its state changes, retransmits, drops with their reason and firewall
rule, resets, the NATs it went through - ending in a one-line verdict of what happened to it.

The tcp object's events of the selected connections are joined with every TCP drop on the host (the drop
that kills a connection is often in another namespace) and with conntrack's NAT translations (tracker.py).
Here --dst names the server end and may carry its port; --src and --sport the client end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from netsleuth.diagnostics.conn.records import ConnConfig, ConnRecord, ConnSummary
from netsleuth.spec.diagnostic import CliRun, DiagnosticSpec
from netsleuth.spec.scope import ScopeTraits

if TYPE_CHECKING:
    import argparse

    from netsleuth.diagnostics.conn.session import ConnDiagnostic
    from netsleuth.diagnostics.conn.view import ConnView
    from netsleuth.kernel.context import KernelContext
    from netsleuth.spec.scope import Scope

__all__ = ["DIAGNOSTIC"]


def _open(config: ConnConfig, context: KernelContext | None) -> ConnDiagnostic:
    from netsleuth.diagnostics.conn.session import ConnDiagnostic

    return ConnDiagnostic(config, context)


def _view(config: ConnConfig) -> ConnView:
    from netsleuth.diagnostics.conn.view import ConnView

    return ConnView(timeline=not config.summary)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Here --dst names the server end and also takes a port: --dst 198.18.0.2:80, --dst "
        "[2001:db8::2]:443. --src and --sport name the client end."
    )


class _Shape(msgspec.Struct, frozen=True):
    """How the run loop runs conn: its --summary prints verdicts without timelines, but the kernel still
    has to send every event, so for the loop it is never a summary run."""

    duration: float | None
    summary: bool = False


def _run(config: ConnConfig, args: argparse.Namespace) -> int:
    from netsleuth.commands._runloop import run_session

    return run_session(
        _open(config, None),
        _Shape(config.duration),
        _view(config),
        json_lines=args.json,
        ready_file=args.ready_file,
    )


def _confine(config: ConnConfig, scope: Scope) -> Any:
    """A fleet task's scope reaches further than the namespace and address fields: conn's drop program and
    NAT lookups watch every namespace by design, so under a scope they watch only its namespaces (and, for
    an address scope, its addresses)."""
    return msgspec.structs.replace(
        config,
        confined_netns=tuple(netns.inode for netns in scope.namespaces),
        confined_networks=scope.networks,
    )


DIAGNOSTIC: DiagnosticSpec[ConnConfig] = DiagnosticSpec(
    name="conn",
    help="one timeline per connection (states, retransmits, drops, resets) ending in a verdict",
    config=ConnConfig,
    records=(ConnRecord, ConnSummary),
    open=_open,
    objects=("tcp", "drops"),
    # A connection names its sockets' namespaces and both addresses: a namespace scope is kept in the kernel
    # (the tcp program's namespace filter, and _confine for the drops and NAT join), an address scope by
    # the "either address" filter; the report itself is narrowed on the way out (ConnRecord.narrowed). A
    # fleet session ships the host's conntrack entries of its flows for the controller's join across hosts.
    scope=ScopeTraits(netns_field="netns", address_field="host", joins_conntrack=True, narrow=_confine),
    view=_view,
    cli=CliRun(add_arguments=_add_arguments, run=_run),
    needs=("can_trace", "btf", "raw_tp"),  # tp_btf, or raw_tp where it is missing; a perf buffer will do
)
