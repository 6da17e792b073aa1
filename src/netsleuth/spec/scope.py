"""The scope of a session as one typed value, from the role that grants it to the kernel filter and the last
line on the way out.

A `Netns` is an inode plus its name on this host, resolved once. A `Scope` is either host-wide or one
namespace (plus, optionally, address ranges). A diagnostic's `ScopeTraits` say how its config is narrowed to
a scope (which field the kernel filters the namespace by, which the addresses by) and whether it can be
narrowed at all; records say which of their fields name a namespace or an address by their types
(`NetnsField`, `AddressField`), so the last-line filter reads typed fields, never guesses from key names.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Annotated, NamedTuple

from netsleuth.spec.options import IpNetwork

__all__ = [
    "AddressField",
    "Netns",
    "NetnsField",
    "Scope",
    "ScopeRole",
    "ScopeTraits",
]


class ScopeRole(NamedTuple):
    """A marker on a record field's type: what the field tells about where the record happened."""

    role: str  # "netns" (an inode) | "address" (one IP address as text)


NetnsField = Annotated[int, ScopeRole("netns")]
AddressField = Annotated[str | None, ScopeRole("address")]


class Netns(NamedTuple):
    """A network namespace of this host: its inode (what the kernel filters by) and its `ip netns` name
    (None when it has none)."""

    inode: int
    name: str | None

    def __str__(self) -> str:
        return self.name or str(self.inode)


@dataclass(frozen=True)
class Scope:
    """What one session may see: every namespace of the host, or one namespace and optionally some address
    ranges inside it ("either address", the kernel filter's meaning)."""

    host_wide: bool
    netns: Netns | None = None
    networks: tuple[IpNetwork, ...] = ()

    def __post_init__(self) -> None:
        if self.host_wide and (self.netns is not None or self.networks):
            raise ValueError("a host-wide scope names no namespace or addresses")
        if not self.host_wide and self.netns is None:
            raise ValueError("a namespace scope names its namespace")

    def holds_netns(self, inode: int) -> bool:
        return self.host_wide or (self.netns is not None and self.netns.inode == inode)

    def holds_address(self, text: str) -> bool:
        if self.host_wide or not self.networks:
            return True
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def describe(self) -> str:
        if self.host_wide:
            return "host-wide"
        where = f"netns {self.netns}"
        if self.networks:
            where += " and " + ", ".join(str(network) for network in self.networks)
        return where


@dataclass(frozen=True)
class ScopeTraits:
    """How a diagnostic is kept inside a scope.

    `netns_field`: the config field the kernel filters the namespace by (None: it has none, so it can only
    run host-wide); `address_field`: the config field holding "either address" filters an address scope
    narrows (None: its records carry no address, so an address scope cannot be enforced);
    `host_wide_only`: why it cannot be kept inside a namespace at all (its records carry no namespace);
    `joins_conntrack`: its flows are joined across hosts with each host's conntrack entries."""

    netns_field: str | None = "netns"
    address_field: str | None = "host"
    host_wide_only: str | None = None
    joins_conntrack: bool = False
