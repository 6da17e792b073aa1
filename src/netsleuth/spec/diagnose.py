"""What a diagnostic gives `diagnose`: a `DiagnoseWatch` on its spec (`DiagnosticSpec.diagnose`).

`diagnose` watches one window with every diagnostic that contributes one, each opened by its `open` under
diagnose's shared inputs (`WatchInputs`: the packet filter resolved once on this host, the kernel context,
the window's length), so every program attaches once and all of them count the same packets. When the
window ends, each contribution's `rules` turn what its session saw (`Watched`: the records it kept and its
typed summary) into verdicts (netsleuth.spec.verdict), with what diagnose read around the window
(`Window`). What spans two diagnostics - one fault seen by two of them - is diagnose's own work
(netsleuth.diagnose.correlate), on the same typed records.

A contribution that cannot start (its programs do not load on this kernel) leaves the diagnosis to the
others and says why, unless it is `required`: the one diagnose cannot run without (drops, whose totals and
attachment the diagnosis reports).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from netsleuth.diagnostics.filters import PacketFilter
    from netsleuth.diagnostics.model import DiagnosticSession
    from netsleuth.kernel.context import KernelContext
    from netsleuth.kernel.reasons import DropReasons
    from netsleuth.spec.verdict import Verdict

__all__ = ["DiagnoseWatch", "WatchInputs", "Watched", "Window", "lazy"]


class WatchInputs(msgspec.Struct, frozen=True, dict=True):  # dict: room for its cached property
    """What every contribution opens under: diagnose's packet filter, resolved on this host (the namespace as
    an inode, a pod as its namespaces), the run's kernel context, and the window's length in seconds."""

    packet_filter: PacketFilter
    context: KernelContext
    duration: float

    @functools.cached_property
    def drop_reasons(self) -> DropReasons | None:
        """This kernel's drop reason names (read once from BTF for every watch), None where it has none."""
        from netsleuth.errors import EnvironmentProblem
        from netsleuth.kernel.reasons import load_drop_reasons

        try:
            return load_drop_reasons()
        except EnvironmentProblem:
            return None


class Watched(msgspec.Struct, frozen=True):
    """What one contribution's session saw in the window: the records it kept (at most its `keep`) and its
    summary."""

    records: Sequence[Any]
    summary: Any


class Window(msgspec.Struct, frozen=True):
    """What diagnose read around the window, for every contribution's rules.

    `sysctls` are the settings read when it ended; `host_netns` this host's own namespace and `netns_file`
    a file to enter another by (a fix runs where its fault is: netsleuth.netns_command.in_netns); unset, a
    fix is placed by the namespace's `ip netns` name alone. `watched_netns` is the one namespace diagnose was
    narrowed to, if it was (None: the host, or several namespaces). `resets_by_flow` is what TCP sent resets
    for, by (address, port) - a drop verdict quotes them (netsleuth.diagnose.correlate.resets_by_flow)."""

    seconds: float
    sysctls: Mapping[str, str] = msgspec.field(default_factory=dict)
    host_netns: int | None = None
    netns_file: Callable[[int], str | None] | None = None
    watched_netns: int | None = None
    resets_by_flow: Mapping[tuple[str | None, int | None], int] = msgspec.field(default_factory=dict)

    def netns_of_fix(self, netns: int, netns_name: str | None) -> str | None:
        """The namespace a fix for something in `netns` must run in, as `in_netns` takes it: its `ip netns`
        name, else a file of a process inside it; None for this host's own. A namespace with neither (every
        process gone) gets its inode, so the printed command fails to enter it rather than change the host."""
        if netns_name:
            return netns_name
        if self.host_netns is None or netns in (0, self.host_netns):
            return None
        path = self.netns_file(netns) if self.netns_file is not None else None
        return path or str(netns)


class DiagnoseWatch(msgspec.Struct, frozen=True):
    """A diagnostic's part of `diagnose`.

    `watched` names what it watches in a problem line ("DNS not watched: ..."); `open(inputs)` gives its
    session for the window (nothing attached until `start`); `rules(watched, window)` its verdicts;
    `keep` how many of the records its session yields while watching its rules read (0: it judges its
    summary alone); `required`: diagnose cannot run without it (exactly one: the diagnosis reports its
    totals and how it attached); `progress(session)` its part of the terminal's progress line
    ("12 resets, 3 retransmits"); `own_events(session)`: events of netsleuth's own footprint it left out
    (the diagnosis says how many); `notes(session)`: what the diagnosis says about it besides the session's
    own notes.
    """

    watched: str
    open: Callable[[WatchInputs], DiagnosticSession]
    rules: Callable[[Watched, Window], list[Verdict]]
    keep: int = 0
    required: bool = False
    progress: Callable[[Any], str] | None = None
    own_events: Callable[[Any], int] | None = None
    notes: Callable[[Any], list[str]] | None = None


def lazy(module: str, name: str) -> Callable[..., Any]:
    """`module.name`, imported when first called: a spec declares its diagnose part without importing the
    rules (a `netsleuth dns` run never loads them)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = f"{module}.{name}"
    return call
