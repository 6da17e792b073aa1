"""Names for raw drops: reason, code location, stack, netns, the process that really owns the packet,
its container, the firewall rule, and source lines. The caches (kallsyms, netns names, socket owners, the
clock, firewall matchers) are the run's netsleuth.kernel.context.KernelContext: drops come in storms.

Process attribution follows netsleuth.diagnostics.attribution: the task only when the drop ran in that user
task's own context (the BPF program checks it runs on the task's stack, not an IRQ stack), else the process
holding the packet's socket (by its inode in /proc/PID/fd), else "kernel".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from netsleuth.diagnostics.attribution import Owner, drop_owner_facts
from netsleuth.diagnostics.drops.decode import RawDrop, RawDropGroup
from netsleuth.diagnostics.drops.records import DropGroup, DropRecord
from netsleuth.kernel.context import KernelContext
from netsleuth.kernel.kallsyms import Kallsyms
from netsleuth.kernel.netns import current_netns_inode
from netsleuth.kernel.reasons import DropReasons
from netsleuth.kernel.symbolizer import SourceSymbolizer
from netsleuth.packet import PacketTuple, tcp_flags_text
from netsleuth.spec.parts import PodRef, pod_ref
from netsleuth.spec.records import WallTime

if TYPE_CHECKING:
    from msgspec import UnsetType

    from netsleuth.firewall import FirewallVerdict

__all__ = ["DropEnricher", "drop_record"]


def drop_record(
    *,
    time: float,
    reason: str,
    reason_code: int,
    location: str,
    packet: PacketTuple,
    owner: Owner,
    netns: int,
    netns_name: str | None,
    ifname: str | None,
    ifindex: int,
    cpu: int,
    sk_state: str | None,
    pod: PodRef | UnsetType = UNSET,
    reason_inferred: bool = False,
    stack: tuple[str, ...] | None = None,
    source: tuple[str, ...] | None = None,
    netfilter: dict[str, Any] | None = None,
) -> DropRecord:
    """A drop's record from what was named of it: the packet's headers and the owner become the record's
    keys (the flags as words), and what a drop does not have is left out of its JSON."""
    flags, icmp_type = packet.tcp_flags, packet.icmp_type
    return DropRecord(
        time=WallTime(time),
        reason=reason,
        reason_code=reason_code,
        location=location,
        family=packet.family,
        proto=packet.proto_name,
        saddr=packet.saddr,
        daddr=packet.daddr,
        sport=packet.sport,
        dport=packet.dport,
        length=packet.length,
        pid=owner.pid,
        comm=owner.comm,
        owner=owner.source,
        container=owner.container,
        netns=netns,
        netns_name=netns_name,
        ifname=ifname,
        ifindex=ifindex,
        cpu=cpu,
        sk_state=sk_state,
        container_name=owner.container_name or UNSET,
        pod=pod,
        reason_inferred=True if reason_inferred else UNSET,
        tcp_flags=tcp_flags_text(flags) if flags is not None else UNSET,
        icmp_type=icmp_type if icmp_type is not None else UNSET,
        icmp_code=packet.icmp_code if packet.icmp_code is not None else UNSET,
        stack=stack if stack is not None else UNSET,
        source=source if source is not None else UNSET,
        netfilter=netfilter if netfilter is not None else UNSET,
    )


_CACHE_LIMIT = 65536


def _from_drop_site(frames: tuple[int, ...], location: int) -> tuple[int, ...]:
    """The stack from the function that dropped the packet outwards: our program, the tracepoint glue and
    kfree_skb itself sit above `location` (the dropping call's return address) and explain nothing."""
    try:
        return frames[frames.index(location) :]
    except ValueError:
        return frames


class DropEnricher:
    """Turns RawDrops into DropRecords. One per run; pass the run's shared `context` (without one it makes
    its own from `kallsyms` and `explain_firewall`, and closes it)."""

    def __init__(
        self,
        reasons: DropReasons,
        *,
        want_stack: bool = False,
        vmlinux: str | None = None,
        explain_firewall: bool = True,
        kallsyms: Kallsyms | None = None,
        context: KernelContext | None = None,
        infer_reasons: bool = False,
    ) -> None:
        """`infer_reasons`: the drops carry no kernel reason; name each from its location instead
        (netsleuth.kernel.inferred_reasons) and mark it inferred."""
        self.reasons = reasons
        self.infer_reasons = infer_reasons
        self._inferred: dict[int, tuple[str, int]] = {}
        self.want_stack = want_stack
        self.context = context or KernelContext(kallsyms=kallsyms, firewall=explain_firewall)
        self._own_context = context is None
        self.symbolizer = SourceSymbolizer(vmlinux) if vmlinux else None
        self.explain_firewall = explain_firewall
        self._netfilter_reason = reasons.value("NETFILTER_DROP")
        self._source_cache: dict[int, tuple[str, ...]] = {}
        self._reason_names: dict[int, str] = {}
        self._states: dict[int | None, str | None] = {}
        self._hooks: dict[tuple[tuple[int, ...], int], str | None] = {}
        self._verdicts: dict[int, tuple[FirewallVerdict, dict[str, object]]] = {}

    @property
    def firewall_problems(self) -> dict[int, str]:
        return self.context.firewall_problems

    def prepare(self, netns: int | None = None) -> None:
        """Read kallsyms and the netns names now, so the first drops are not delayed by it, and take the
        firewall's counter baseline of the traced namespace (this one unless --netns) before any drop."""
        self.context.prepare(netns)
        if self.explain_firewall:
            self.context.matcher(netns if netns is not None else current_netns_inode())

    def close(self) -> None:
        if self.symbolizer is not None:
            self.symbolizer.close()
        if self._own_context:
            self.context.close()

    def owner(self, raw: RawDrop) -> Owner:
        return self.context.owner(drop_owner_facts(raw))

    def _source(self, address: int) -> tuple[str, ...] | None:
        """The source lines of the dropping call (`function at file:line`, inlined frames first)."""
        if self.symbolizer is None:
            return None
        cached = self._source_cache.get(address)
        if cached is None:
            frames = self.symbolizer.symbolize_address(address, self.context.kallsyms)
            cached = tuple(frame.text() for frame in frames)
            self._source_cache[address] = cached
        return cached

    def _hook(self, frames: tuple[int, ...], family: int) -> str | None:
        """The netfilter hook a drop's stack went through. A pure function of the frames' function names
        (kallsyms does not change during a run), so it is remembered for the run by (frames, family)."""
        key = (frames, family)
        if key in self._hooks:
            return self._hooks[key]
        from netsleuth.firewall import hook_from_stack

        if len(self._hooks) >= _CACHE_LIMIT:
            self._hooks.clear()
        hook = hook_from_stack([self.context.function_name(address) for address in frames], family)
        self._hooks[key] = hook
        return hook

    def _verdict_json(self, verdict: FirewallVerdict) -> dict[str, object]:
        # The matcher hands back the same verdict object while its reading of the rules is unchanged.
        cached = self._verdicts.get(id(verdict))
        if cached is None or cached[0] is not verdict:
            cached = (verdict, verdict.to_json())
            if len(self._verdicts) >= _CACHE_LIMIT:
                self._verdicts.clear()
            self._verdicts[id(verdict)] = cached
        return cached[1]

    def _inferred_reason(self, location: int) -> tuple[str, int]:
        """The reason inferred at `location`, and this kernel's number for it (0 where it has none)."""
        known = self._inferred.get(location)
        if known is None:
            from netsleuth.kernel.inferred_reasons import infer_reason

            name = infer_reason(self.context.function_name(location))
            known = self._inferred[location] = (name, self.reasons.value(name) or 0)
        return known

    def _netfilter(self, raw: RawDrop, frames: tuple[int, ...]) -> dict[str, Any] | None:
        if not self.explain_firewall or (not self.infer_reasons and raw.reason != self._netfilter_reason):
            return None
        context = self.context
        hook = self._hook(frames, raw.packet.family)
        result: dict[str, Any] = {"hook": hook, "table": None, "chain": None, "rule": None}
        if hook is None:
            return result
        if context.matcher(raw.netns) is None:
            result["problem"] = context.firewall_problems.get(raw.netns)
            return result
        verdict = context.firewall_verdict(raw.netns, raw.packet, hook, raw.ifname)
        if verdict is not None:
            result.update(self._verdict_json(verdict))
        return result

    def enrich(self, raw: RawDrop) -> DropRecord:
        return self.enrich_many((raw,))[0]

    def enrich_many(self, raws: Sequence[RawDrop]) -> list[DropRecord]:
        """Records for a batch of drops, the same as `enrich` of each.

        A storm is thousands of drops of a few kinds, so what is looked up is looked up once per batch
        (netns name, owner, firewall verdict), or once per run when it cannot change (reason, symbol, hook:
        kallsyms and the reason table are fixed). The firewall verdict is remembered for the batch by
        (netns, hook, packet tuple, device): everything the matcher reads of a packet is in that key (the
        tuple holds addresses, ports, protocol, TCP flags, ICMP type and length), and the matcher itself
        answers from one reading of the rules and counters until it re-reads them (netsleuth.firewall.matcher:
        at most every max_age, or min_refresh for drops only counters can tell apart), so rules told apart by
        counter growth are decided on the same reading as without the memo. A batch is read in
        milliseconds; nothing the memo covers would be re-read within it.
        """
        context = self.context
        reasons = self._reason_names
        symbol = context.symbol
        netns_names: dict[int, str | None] = {}
        pods: dict[int, PodRef | UnsetType] = {}
        owners: dict[tuple[int | None, str, int], Owner] = {}
        netfilters: dict[tuple[int, tuple[int, ...], PacketTuple, str], dict[str, Any] | None] = {}
        want_stack = self.want_stack
        netfilter_reason = self._netfilter_reason
        explain = self.explain_firewall
        wall_offset = context.wall_offset_ns
        source = self._source if self.symbolizer is not None else None
        infer = self.infer_reasons
        records: list[DropRecord] = []
        append = records.append
        for raw in raws:
            location = raw.location
            frames = _from_drop_site(raw.frames, location) if raw.frames else ()
            if infer:
                reason, reason_code = self._inferred_reason(location)
            else:
                reason_code = raw.reason
                named = reasons.get(reason_code)
                if named is None:
                    named = reasons[reason_code] = self.reasons.name(reason_code)
                reason = named
            netns = raw.netns
            if netns in netns_names:
                netns_name = netns_names[netns]
                pod = pods[netns]
            else:
                netns_name = netns_names[netns] = context.netns_names.name_of(netns)
                pod = pods[netns] = pod_ref(context.pod(netns))
            task = raw.in_task and not raw.kthread and raw.pid
            owner_key = (raw.pid if task else None, raw.comm, raw.sock_ino)
            owner = owners.get(owner_key)
            if owner is None:
                owner = owners[owner_key] = self.owner(raw)
            packet = raw.packet
            netfilter: dict[str, Any] | None = None
            if explain and (reason == "NETFILTER_DROP" if infer else reason_code == netfilter_reason):
                netfilter_key = (netns, frames, packet, raw.ifname)
                if netfilter_key in netfilters:
                    shared = netfilters[netfilter_key]
                else:
                    shared = netfilters[netfilter_key] = self._netfilter(raw, frames)
                netfilter = shared  # records are read-only: one dict per kind of drop and batch
            append(
                drop_record(
                    time=(raw.monotonic_ns + wall_offset) / 1e9,
                    reason=reason,
                    reason_code=reason_code,
                    location=symbol(location),
                    packet=packet,
                    owner=owner,
                    netns=netns,
                    netns_name=netns_name,
                    ifname=raw.ifname or None,
                    ifindex=raw.ifindex,
                    cpu=raw.cpu,
                    sk_state=self._state_name(raw.sk_state) if packet.proto == 6 else None,
                    pod=pod,
                    reason_inferred=infer,
                    stack=tuple(symbol(address) for address in frames) if want_stack else None,
                    source=source(location) if source is not None else None,
                    netfilter=netfilter,
                )
            )
        return records

    def _state_name(self, state: int | None) -> str | None:
        if state not in self._states:
            self._states[state] = self.context.names.state(state)
        return self._states[state]

    def enrich_group(self, group: RawDropGroup) -> DropGroup:
        example = self.enrich(group.example)
        return DropGroup(
            reason=example.reason,
            location=example.location,
            netns=group.netns,
            netns_name=example.netns_name,
            count=group.count,
            bytes=group.bytes,
            example=example,
            reason_inferred=example.reason_inferred,
            pod=example.pod,
        )
