"""Names for raw drops: reason, code location, stack, netns, the process that really owns the packet,
its container, the firewall rule, and source lines. Everything here is cached: drops come in storms.

Process attribution never reports the task a softirq happened to interrupt. In order:
1. the drop ran in a user task's own context (the BPF program checks it runs on that task's stack, not
   an IRQ stack): that task;
2. the packet belongs to a socket: the process holding that socket (by its inode in /proc/PID/fd);
3. neither: "kernel" (softirq, a kernel thread, or a packet no process owns).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any

from netsleuth.diagnostics.drops import RawDrop, RawDropGroup
from netsleuth.diagnostics.tcp_names import load_tcp_names
from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.kallsyms import Kallsyms, default_kallsyms
from netsleuth.kernel.netns import NetnsNames, current_netns_inode
from netsleuth.kernel.process import ContainerCache, SocketOwners
from netsleuth.kernel.reasons import DropReasons
from netsleuth.kernel.symbolizer import SourceFrame, SourceSymbolizer
from netsleuth.packet import PacketTuple, tcp_flags_text

__all__ = ["DropEnricher", "DropGroup", "DropRecord", "Owner"]


@dataclass(frozen=True)
class Owner:
    pid: int | None
    comm: str
    source: str  # "task" | "socket" | "kernel"
    container: str | None = None


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
            "time": datetime.datetime.fromtimestamp(self.time, datetime.UTC).isoformat(
                timespec="microseconds"
            ),
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
    """Turns RawDrops into DropRecords. Holds the caches; create one per run."""

    def __init__(
        self,
        reasons: DropReasons,
        *,
        want_stack: bool = False,
        vmlinux: str | None = None,
        explain_firewall: bool = True,
        kallsyms: Kallsyms | None = None,
    ) -> None:
        self.reasons = reasons
        self.want_stack = want_stack
        self.kallsyms = kallsyms or default_kallsyms()
        self.netns_names = NetnsNames()
        self.tcp_names = load_tcp_names()
        self.owners = SocketOwners()
        self.container_of = ContainerCache()
        self.symbolizer = SourceSymbolizer(vmlinux) if vmlinux else None
        self.explain_firewall = explain_firewall
        self._netfilter_reason = reasons.value("NETFILTER_DROP")
        self._matchers: dict[int, Any] = {}
        self.firewall_problems: dict[int, str] = {}
        self._location_cache: dict[int, str] = {}
        self._source_cache: dict[int, tuple[SourceFrame, ...]] = {}
        # bpf_ktime_get_ns() is CLOCK_MONOTONIC; one offset turns it into wall-clock time.
        self._wall_offset = time.time() - time.monotonic()

    def prepare(self, netns: int | None = None) -> None:
        """Read kallsyms and the netns names now, so the first drops are not delayed by it, and take the
        firewall's counter baseline of the traced namespace (this one unless --netns) before any drop: rules
        that can only be told apart by counter growth then count from the start of the trace."""
        self.kallsyms.load()
        self.netns_names.refresh()
        if self.explain_firewall:
            self._matcher(netns if netns is not None else current_netns_inode())

    def close(self) -> None:
        if self.symbolizer is not None:
            self.symbolizer.close()
        for matcher in self._matchers.values():
            close = getattr(matcher, "close", None)
            if close is not None:
                close()

    def _symbol(self, address: int) -> str:
        text = self._location_cache.get(address)
        if text is None:
            text = self.kallsyms.format(address)
            self._location_cache[address] = text
        return text

    def _function_names(self, frames: tuple[int, ...]) -> list[str]:
        names = []
        for address in frames:
            symbol = self.kallsyms.resolve(address)
            names.append(symbol.name if symbol else hex(address))
        return names

    def owner(self, raw: RawDrop) -> Owner:
        if raw.in_task and not raw.kthread and raw.pid:
            return Owner(raw.pid, raw.comm, "task", self.container_of(raw.pid))
        if raw.sock_ino:
            found = self.owners.owner(raw.sock_ino)
            if found is not None:
                return Owner(found.pid, found.comm, "socket", self.container_of(found.pid))
        return Owner(None, "kernel", "kernel")

    def _source(self, address: int) -> tuple[SourceFrame, ...] | None:
        if self.symbolizer is None:
            return None
        cached = self._source_cache.get(address)
        if cached is None:
            cached = tuple(self.symbolizer.symbolize_address(address, self.kallsyms))
            self._source_cache[address] = cached
        return cached

    def _matcher(self, netns: int) -> Any:
        if netns not in self._matchers:
            from netsleuth.firewall import FirewallMatcher

            # Without CAP_SYS_ADMIN (e.g. the agent's unit) another namespace cannot be entered: drops there
            # are still reported, with the hook and the reason the rule is missing.
            try:
                self._matchers[netns] = FirewallMatcher(self.netns_names.path_of(netns))
            except EnvironmentProblem as error:
                self._matchers[netns] = None
                self.firewall_problems[netns] = str(error)
        return self._matchers[netns]

    def _netfilter(self, raw: RawDrop, frame_names: list[str]) -> dict[str, Any] | None:
        if raw.reason != self._netfilter_reason or not self.explain_firewall:
            return None
        from netsleuth.firewall import hook_from_stack

        hook = hook_from_stack(frame_names, raw.packet.family)
        result: dict[str, Any] = {"hook": hook, "table": None, "chain": None, "rule": None}
        if hook is None:
            return result
        matcher = self._matcher(raw.netns)
        if matcher is None:
            result["problem"] = self.firewall_problems.get(raw.netns)
            return result
        incoming = hook in ("prerouting", "input", "forward")
        verdict = matcher.explain(
            raw.packet,
            hook,
            raw.ifname or None if incoming else None,
            raw.ifname or None if not incoming else None,
        )
        if verdict is not None:
            result.update(verdict.to_json())
        return result

    def enrich(self, raw: RawDrop) -> DropRecord:
        frames = _from_drop_site(raw.frames, raw.location)
        frame_names = self._function_names(frames) if frames else []
        return DropRecord(
            time=raw.monotonic_ns / 1e9 + self._wall_offset,
            reason=self.reasons.name(raw.reason),
            reason_code=raw.reason,
            location=self._symbol(raw.location),
            location_address=raw.location,
            packet=raw.packet,
            owner=self.owner(raw),
            netns=raw.netns,
            netns_name=self.netns_names.name_of(raw.netns),
            ifname=raw.ifname or None,
            ifindex=raw.ifindex,
            cpu=raw.cpu,
            sk_state=self.tcp_names.state(raw.sk_state) if raw.packet.proto == 6 else None,
            stack=tuple(self._symbol(address) for address in frames) if self.want_stack else None,
            source=self._source(raw.location),
            netfilter=self._netfilter(raw, frame_names),
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
