"""Names for raw drops: reason, code location, stack, netns, the process that really owns the packet,
its container, the firewall rule, and source lines. The caches (kallsyms, netns names, socket owners, the
clock, firewall matchers) are the run's netsleuth.kernel.context.KernelContext: drops come in storms.

Process attribution follows netsleuth.diagnostics.attribution: the task only when the drop ran in that user
task's own context (the BPF program checks it runs on the task's stack, not an IRQ stack), else the process
holding the packet's socket (by its inode in /proc/PID/fd), else "kernel".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from netsleuth.diagnostics.attribution import Owner, drop_owner_facts
from netsleuth.diagnostics.drops import RawDrop, RawDropGroup
from netsleuth.diagnostics.schema import SCHEMA_VERSIONS
from netsleuth.diagnostics.tcp_context import iso_time
from netsleuth.kernel.context import KernelContext
from netsleuth.kernel.kallsyms import Kallsyms
from netsleuth.kernel.netns import current_netns_inode
from netsleuth.kernel.reasons import DropReasons
from netsleuth.kernel.symbolizer import SourceFrame, SourceSymbolizer
from netsleuth.packet import PacketTuple, tcp_flags_text

__all__ = ["DropEnricher", "DropGroup", "DropRecord", "Owner"]


@dataclass(frozen=True)
class DropRecord:
    time: float  # seconds since the epoch
    reason: str
    reason_code: int
    location: str
    location_address: int
    packet: PacketTuple
    owner: Owner
    netns: int
    netns_name: str | None
    ifname: str | None
    ifindex: int
    cpu: int
    sk_state: str | None
    stack: tuple[str, ...] | None
    source: tuple[SourceFrame, ...] | None
    netfilter: dict[str, Any] | None
    packet_bytes: bytes

    def to_json(self) -> dict[str, Any]:
        packet = self.packet
        data: dict[str, Any] = {
            "type": "drop",
            "v": SCHEMA_VERSIONS["drop"],
            "time": iso_time(self.time),
            "reason": self.reason,
            "reason_code": self.reason_code,
            "location": self.location,
            "family": packet.family,
            "proto": packet.proto_name,
            "saddr": packet.saddr,
            "daddr": packet.daddr,
            "sport": packet.sport,
            "dport": packet.dport,
            "length": packet.length,
            "pid": self.owner.pid,
            "comm": self.owner.comm,
            "owner": self.owner.source,
            "container": self.owner.container,
            "netns": self.netns,
            "netns_name": self.netns_name,
            "ifname": self.ifname,
            "ifindex": self.ifindex,
            "cpu": self.cpu,
            "sk_state": self.sk_state,
        }
        if packet.tcp_flags is not None:
            data["tcp_flags"] = tcp_flags_text(packet.tcp_flags)
        if packet.icmp_type is not None:
            data["icmp_type"] = packet.icmp_type
            data["icmp_code"] = packet.icmp_code
        if self.stack is not None:
            data["stack"] = list(self.stack)
        if self.source is not None:
            data["source"] = [frame.text() for frame in self.source]
        if self.netfilter is not None:
            data["netfilter"] = self.netfilter
        return data


@dataclass(frozen=True)
class DropGroup:
    reason: str
    location: str
    netns: int
    netns_name: str | None
    count: int
    bytes: int
    example: DropRecord

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "location": self.location,
            "netns": self.netns,
            "netns_name": self.netns_name,
            "count": self.count,
            "bytes": self.bytes,
            "example": self.example.to_json(),
        }


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
    ) -> None:
        self.reasons = reasons
        self.want_stack = want_stack
        self.context = context or KernelContext(kallsyms=kallsyms, firewall=explain_firewall)
        self._own_context = context is None
        self.symbolizer = SourceSymbolizer(vmlinux) if vmlinux else None
        self.explain_firewall = explain_firewall
        self._netfilter_reason = reasons.value("NETFILTER_DROP")
        self._source_cache: dict[int, tuple[SourceFrame, ...]] = {}

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

    def _source(self, address: int) -> tuple[SourceFrame, ...] | None:
        if self.symbolizer is None:
            return None
        cached = self._source_cache.get(address)
        if cached is None:
            cached = tuple(self.symbolizer.symbolize_address(address, self.context.kallsyms))
            self._source_cache[address] = cached
        return cached

    def _netfilter(self, raw: RawDrop, frames: tuple[int, ...]) -> dict[str, Any] | None:
        if raw.reason != self._netfilter_reason or not self.explain_firewall:
            return None
        from netsleuth.firewall import hook_from_stack

        context = self.context
        hook = hook_from_stack([context.function_name(address) for address in frames], raw.packet.family)
        result: dict[str, Any] = {"hook": hook, "table": None, "chain": None, "rule": None}
        if hook is None:
            return result
        if context.matcher(raw.netns) is None:
            result["problem"] = context.firewall_problems.get(raw.netns)
            return result
        verdict = context.firewall_verdict(raw.netns, raw.packet, hook, raw.ifname)
        if verdict is not None:
            result.update(verdict.to_json())
        return result

    def enrich(self, raw: RawDrop) -> DropRecord:
        context = self.context
        frames = _from_drop_site(raw.frames, raw.location)
        return DropRecord(
            time=context.wall_time(raw.monotonic_ns),
            reason=self.reasons.name(raw.reason),
            reason_code=raw.reason,
            location=context.symbol(raw.location),
            location_address=raw.location,
            packet=raw.packet,
            owner=self.owner(raw),
            netns=raw.netns,
            netns_name=context.netns_names.name_of(raw.netns),
            ifname=raw.ifname or None,
            ifindex=raw.ifindex,
            cpu=raw.cpu,
            sk_state=context.names.state(raw.sk_state) if raw.packet.proto == 6 else None,
            stack=tuple(context.symbol(address) for address in frames) if self.want_stack else None,
            source=self._source(raw.location),
            netfilter=self._netfilter(raw, frames),
            packet_bytes=raw.packet_bytes,
        )

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
        )
