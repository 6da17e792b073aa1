"""`profile`: on-CPU stacks sampled at --hz on every CPU (or only inside the NET_RX/NET_TX softirq), counted
in the kernel by process and stacks (bpf/profile.bpf.c); on the CLI also written as folded stacks, an SVG
flame graph and speedscope JSON (flamegraph.py, speedscope.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from netsleuth.diagnostics.profile.records import ProfileConfig, ProfileSummary, StackRecord
from netsleuth.spec.diagnostic import CliRun, DiagnosticSpec
from netsleuth.spec.scope import ScopeTraits

if TYPE_CHECKING:
    import argparse

    from netsleuth.diagnostics.model import DiagnosticSession
    from netsleuth.diagnostics.profile.view import ProfileView
    from netsleuth.kernel.context import KernelContext

__all__ = ["DIAGNOSTIC"]


def _open(config: ProfileConfig, context: KernelContext | None) -> DiagnosticSession:
    from netsleuth.diagnostics.profile.session import ProfileDiagnostic

    return ProfileDiagnostic(config, context)


def _view(_config: ProfileConfig) -> ProfileView:
    from netsleuth.diagnostics.profile.view import ProfileView

    return ProfileView()


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from netsleuth.diagnostics.profile.view import add_output_arguments

    add_output_arguments(parser)


def _run(config: ProfileConfig, args: argparse.Namespace) -> int:
    from netsleuth.diagnostics.profile.view import run_profile

    return run_profile(config, args)


DIAGNOSTIC: DiagnosticSpec[ProfileConfig] = DiagnosticSpec(
    name="profile",
    help="on-CPU stacks on every CPU (or inside NET_RX/NET_TX softirqs): flame graph, folded, speedscope",
    config=ProfileConfig,
    records=(StackRecord, ProfileSummary),
    open=_open,
    objects=("profile",),
    # Its --netns selects the sampled tasks in the kernel, but a stack carries no namespace.
    scope=ScopeTraits(
        netns_field=None,
        address_field=None,
        host_wide_only=(
            "its stacks carry no namespace, and a sample's kernel frames include softirq work done for any "
            "namespace's packets"
        ),
    ),
    view=_view,
    cli=CliRun(add_arguments=_add_arguments, run=_run),
    needs=("can_trace", "btf", "ring_buffer", "perf_event_profiling"),  # a CPU clock per CPU samples it
)
