"""`drops`' config and records: what a user asks for, and what each dropped packet and each group of them
reads as. Every field is a key of today's JSON, computed when the record is built (the reason's name, the
symbol, the flags' words, the owner's words); keys a record carries only sometimes are UNSET.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from netsleuth._generated.drops_abi import DROPS_MAX_SNAPLEN
from netsleuth.spec.common import PacketConfig
from netsleuth.spec.configs import ConfigError
from netsleuth.spec.options import FILTERS, Opt
from netsleuth.spec.parts import PodRef
from netsleuth.spec.records import Record, WallTime
from netsleuth.spec.scope import AddressField, NetnsField
from netsleuth.spec.summary import Summary

__all__ = ["DropGroup", "DropRecord", "DropsConfig", "DropsSummary"]

# A drop reason as skb_drop_reason names it (NETFILTER_DROP, NO_SOCKET; with or without SKB_DROP_REASON_, any
# case): checked against the running kernel's names when the session opens, with a did-you-mean.
ReasonName = Annotated[
    str, Meta(pattern=r"^[A-Za-z0-9_]+$", extra={"words": "a drop reason name (e.g. NETFILTER_DROP)"})
]
Snaplen = Annotated[
    int,
    Meta(
        ge=0,
        le=DROPS_MAX_SNAPLEN,
        extra={"words": f"a number of packet bytes from 0 to {DROPS_MAX_SNAPLEN}"},
    ),
]

# -- config --------------------------------------------------------------------------------------------


class DropsConfig(PacketConfig, frozen=True, kw_only=True):
    reason: Annotated[
        tuple[ReasonName, ...], Opt("only this drop reason (repeatable)", metavar="REASON", group=FILTERS)
    ] = ()
    exclude_reason: Annotated[
        tuple[ReasonName, ...],
        Opt(
            "not this drop reason (repeatable)", label="not the drop reason", metavar="REASON", group=FILTERS
        ),
    ] = ()
    stack: Annotated[bool, Opt("print the kernel stack of each drop")] = False
    # The packet bytes the kernel copies with each drop: what --pcap writes (the CLI sets it with --pcap).
    snaplen: Annotated[Snaplen, Opt("packet bytes kept for --pcap (default 256)", metavar="BYTES")] = 0

    def check(self) -> None:
        super().check()
        if self.reason and self.exclude_reason:
            raise ConfigError(
                "exclude_reason", "cannot go with --reason: give one of them", flag="--exclude-reason"
            )
        if self.snaplen and self.summary:
            raise ConfigError(
                "snaplen", "needs individual drops: it cannot be combined with --summary", flag="--snaplen"
            )


# -- records -------------------------------------------------------------------------------------------


class DropRecord(Record, frozen=True, kw_only=True, tag="drop"):
    """One dropped packet: why (the kernel's reason), where (the function that freed it), the packet's
    headers, whose it was (netsleuth.diagnostics.attribution), in which namespace and on which device, and -
    for a firewall's drop - which rule. The keys are in the order the JSON always had them."""

    time: WallTime
    reason: str
    # This kernel's number for `reason`; with `reason_inferred`, its number for the inferred name (0: none).
    reason_code: int
    location: str  # the freeing call as symbol+offset
    family: int  # 4, 6, or 0 when the packet is not IP
    proto: str  # "tcp", "udp", "icmp"...; a protocol without a name as its number
    saddr: AddressField
    daddr: AddressField
    sport: int | None
    dport: int | None
    length: int
    pid: int | None
    comm: str
    owner: str  # "task" | "socket" | "kernel"
    container: str | None
    netns: NetnsField
    netns_name: str | None
    ifname: str | None
    ifindex: int
    cpu: int
    sk_state: str | None  # a TCP socket's state
    container_name: str | UnsetType = UNSET  # the container runtime's name for `container` (CRI)
    pod: PodRef | UnsetType = UNSET
    # `reason` was inferred from `location` (the kernel gave none, before 5.17), never the kernel's word.
    reason_inferred: bool | UnsetType = UNSET
    tcp_flags: str | UnsetType = UNSET  # "SYN", "ACK|PSH"...
    icmp_type: int | UnsetType = UNSET
    icmp_code: int | UnsetType = UNSET
    stack: tuple[str, ...] | UnsetType = UNSET  # --stack
    source: tuple[str, ...] | UnsetType = UNSET  # `function at file:line`, with a debug vmlinux
    # A firewall's drop: the netfilter hook, table, chain and rule, as the firewall matcher words them (and,
    # when it could not read the rules, the problem). Free-form like a reset's: the removal command
    # (netsleuth.firewall.removal) and the fleet's merge read either record's the same way.
    netfilter: dict[str, Any] | UnsetType = UNSET

    @property
    def tcp_flag_names(self) -> frozenset[str]:
        """The TCP flags as a set of names ("SYN", "ACK"...); empty for other protocols."""
        return frozenset(self.tcp_flags.split("|")) if isinstance(self.tcp_flags, str) else frozenset()

    @property
    def rule(self) -> str | None:
        """The firewall rule that dropped the packet, when one was named."""
        netfilter = self.netfilter
        return netfilter.get("rule") if isinstance(netfilter, dict) else None


class DropGroup(msgspec.Struct, frozen=True, kw_only=True):
    """Exact kernel count of one reason x location x netns, with its first drop as the example."""

    reason: str
    location: str
    netns: NetnsField
    netns_name: str | None
    count: int
    bytes: int
    example: DropRecord
    reason_inferred: bool | UnsetType = UNSET
    pod: PodRef | UnsetType = UNSET


class DropsSummary(Summary, frozen=True, kw_only=True, tag="summary"):
    groups: tuple[DropGroup, ...]  # largest first (groups_omitted, when an agent cut them, is the base's)
    reasons_inferred: bool | UnsetType = UNSET  # every group's reason was inferred (no kernel reasons)
