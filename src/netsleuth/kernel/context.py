"""One kernel context per run: what every diagnostic needs to turn raw kernel events into records.

- kallsyms, with a cache of formatted addresses and stacks cut below the tracing machinery;
- network namespace names and paths (`NetnsNames`);
- socket owners and containers (`SocketOwners`, `ContainerCache`) and the owner attribution rules
  (netsleuth.diagnostics.attribution);
- pods: the Kubernetes pod of a network namespace and the name of a container, from the container runtime
  (`PodIndex`; nothing is asked, nor grpc loaded, on a host without a runtime socket);
- the clock: BPF timestamps are CLOCK_MONOTONIC (bpf_ktime_get_ns), so one offset, read once, turns them
  into wall-clock time; `clock.to_json()` goes into a summary so records of several hosts can be merged;
- one firewall matcher per namespace (its counter baseline is taken when first asked for it).

Drops, resets, tcp events and connections share one context when they run together (`diagnose`, `conn`, an
agent session): kallsyms is read once, netns names are scanned once, the clock is the same for all records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from netsleuth.diagnostics.attribution import Owner, OwnerFacts, attribute_owner
from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.kallsyms import Kallsyms, default_kallsyms
from netsleuth.kernel.netns import NetnsNames, current_netns_inode
from netsleuth.kernel.pods import Pod, PodIndex
from netsleuth.kernel.process import ContainerCache, SocketOwners

if TYPE_CHECKING:
    from netsleuth.diagnostics.tcp_names import TcpNames
    from netsleuth.firewall import FirewallMatcher, FirewallVerdict
    from netsleuth.packet import PacketTuple

__all__ = ["KernelClock", "KernelContext"]

# Frames of the tracing machinery itself, above the kernel function that hit the tracepoint.
_TRACING_PREFIXES = ("bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_", "bpf_get_stack")
_INCOMING_HOOKS = frozenset({"prerouting", "input", "forward"})


@dataclass(frozen=True)
class KernelClock:
    """CLOCK_MONOTONIC and the wall clock read at the same moment: the offset between the kernel's event
    timestamps and the time of day on this host."""

    monotonic_ns: int
    wall_ns: int

    @classmethod
    def now(
        cls,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> KernelClock:
        return cls(monotonic_ns(), wall_ns())

    @property
    def offset_ns(self) -> int:
        return self.wall_ns - self.monotonic_ns

    def wall_time(self, monotonic_ns: int) -> float:
        """A kernel timestamp as seconds since the epoch."""
        return (monotonic_ns + self.offset_ns) / 1e9

    def to_json(self) -> dict[str, int]:
        return {"monotonic_ns": self.monotonic_ns, "wall_ns": self.wall_ns, "offset_ns": self.offset_ns}


class KernelContext:
    """Caches for enrichment; create one per run (or per agent session) and share it between enrichers.

    `firewall`: `prepare` takes the firewall counter baseline of the traced namespace (enrichers that
    explain firewall drops or rejects ask for it in their own `prepare` too; it is taken once).
    """

    def __init__(
        self,
        names: TcpNames | None = None,
        kallsyms: Kallsyms | None = None,
        netns_names: NetnsNames | None = None,
        owners: SocketOwners | None = None,
        *,
        containers: Callable[[int], str | None] | None = None,
        firewall: bool = False,
        clock: KernelClock | None = None,
        pods: PodIndex | None = None,
    ) -> None:
        self._names = names
        self.kallsyms = kallsyms or default_kallsyms()
        self.netns_names = netns_names or NetnsNames()
        self.owners = owners or SocketOwners()
        self.containers = containers or ContainerCache(self.owners.proc_root)
        self.firewall = firewall
        self.clock = clock or KernelClock.now()
        self._own_pods = pods is None
        self.pods = pods if pods is not None else PodIndex(proc_root=self.owners.proc_root)
        self.firewall_problems: dict[int, str] = {}  # netns inode -> why its rules cannot be read
        self._symbols: dict[int, str] = {}
        self._matchers: dict[int, FirewallMatcher | None] = {}
        self._prepared = False

    # -- lifecycle ---------------------------------------------------------------------------------------
    def prepare(self, netns: int | None = None) -> None:
        """Read kallsyms, netns names and socket owners now, so the first events are not delayed by it, and
        take the firewall's counter baseline of the traced namespace (this one when `netns` is None) before
        any event: rules told apart only by counter growth then count from the start of the trace.
        Calling it again (a second enricher on the same context) only adds that namespace's baseline."""
        if not self._prepared:
            self.kallsyms.load()
            self.netns_names.refresh()
            self.owners.rescan()
            self._prepared = True
        if self.firewall:
            self.matcher(netns if netns is not None else current_netns_inode())

    def close(self) -> None:
        for matcher in self._matchers.values():
            close = getattr(matcher, "close", None)
            if close is not None:
                close()
        self._matchers.clear()
        if self._own_pods:
            self.pods.close()

    # -- names -------------------------------------------------------------------------------------------
    @property
    def names(self) -> TcpNames:
        """TCP state, reset reason and congestion state names of the running kernel (read on first use)."""
        if self._names is None:
            from netsleuth.diagnostics.tcp_names import load_tcp_names

            self._names = load_tcp_names()
        return self._names

    def wall_time(self, monotonic_ns: int) -> float:
        return self.clock.wall_time(monotonic_ns)

    @property
    def wall_offset_ns(self) -> int:
        return self.clock.offset_ns

    def netns_name(self, inode: int) -> str | None:
        return self.netns_names.name_of(inode) if inode else None

    def netns_label(self, inode: int) -> str:
        """How a sentence names the namespace: "netns NAME" (or its inode), with its pod where it is one's."""
        name = self.netns_name(inode)
        netns = f"netns {name}" if name else f"netns {inode}"
        pod = self.pod(inode)
        return f"pod {pod.ref}, {netns}" if pod is not None else netns

    def pod(self, inode: int) -> Pod | None:
        """The Kubernetes pod whose sandbox holds the namespace, None for any other namespace."""
        return self.pods.pod_of_netns(inode) if inode else None

    def netns_path(self, inode: int | None) -> str | None:
        """A file to enter the namespace with; None for this process's own (or an unknown) namespace."""
        return self.netns_names.path_of(inode) if inode else None

    def owner(self, facts: OwnerFacts) -> Owner:
        """Who owns the event (netsleuth.diagnostics.attribution), with its container's name (CRI)."""
        owner = attribute_owner(facts, self.owners, self.containers)
        if owner.container:
            found = self.pods.container(owner.container)
            if found is not None:
                return replace(owner, container_name=found.name)
        return owner

    # -- symbols -----------------------------------------------------------------------------------------
    def symbol(self, address: int) -> str:
        """`func+0xoff` (cached: events come in bursts from the same few places)."""
        text = self._symbols.get(address)
        if text is None:
            text = self.kallsyms.format(address)
            self._symbols[address] = text
        return text

    def function_name(self, address: int) -> str:
        return self.symbol(address).split("+", 1)[0]

    def stack(self, frames: Sequence[int]) -> tuple[str, ...]:
        """The kernel stack from the traced function outwards (our program's own frames removed)."""
        symbols = [self.symbol(address) for address in frames]
        start = 0
        for index, text in enumerate(symbols):
            if text.startswith(_TRACING_PREFIXES):
                start = index + 1
        return tuple(symbols[start:])

    def function_names(self, frames: Sequence[int]) -> list[str]:
        return [text.split("+", 1)[0] for text in self.stack(frames)]

    # -- firewall ----------------------------------------------------------------------------------------
    def matcher(self, netns: int) -> FirewallMatcher | None:
        """The namespace's firewall matcher; None (and a line in `firewall_problems`) when its rules cannot
        be read. Without CAP_SYS_ADMIN (e.g. the agent's unit) another namespace cannot be entered: events
        there are still reported, with the hook and the reason the rule is missing."""
        if netns not in self._matchers:
            from netsleuth.firewall import FirewallMatcher

            try:
                self._matchers[netns] = FirewallMatcher(self.netns_names.path_of(netns))
            except EnvironmentProblem as error:
                self._matchers[netns] = None
                self.firewall_problems[netns] = str(error)
        return self._matchers[netns]

    def firewall_verdict(
        self, netns: int, packet: PacketTuple, hook: str, ifname: str | None
    ) -> FirewallVerdict | None:
        """The rule that dropped or rejected `packet` at `hook`; `ifname` is the device the packet came in
        on for incoming hooks, went out through otherwise. None when no rule can be named."""
        matcher = self.matcher(netns)
        if matcher is None:
            return None
        incoming = hook in _INCOMING_HOOKS
        device = ifname or None
        return matcher.explain(packet, hook, device if incoming else None, None if incoming else device)
