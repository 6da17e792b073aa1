"""The scope of a session as one typed value, from the role that grants it to the kernel filter and the last
line on the way out.

A `Netns` is an inode plus its name on this host, resolved once. A `Scope` is either host-wide or one
namespace (plus, optionally, address ranges). A diagnostic's `ScopeTraits` say how its config is narrowed to
a scope (which field the kernel filters the namespace by, which the addresses by) and whether it can be
narrowed at all; records say which of their fields name a namespace or an address by their types
(`NetnsField`, `AddressField` / `AddressText`), so the last-line filter reads typed fields, never guesses
from key names.
"""

from __future__ import annotations

import functools
import ipaddress
import types
import typing
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Annotated, NamedTuple, cast

from netsleuth.spec.options import IpNetwork

__all__ = [
    "AddressField",
    "AddressText",
    "Netns",
    "NetnsField",
    "RecordScope",
    "Scope",
    "ScopeRole",
    "ScopeTraits",
    "scoped_values",
]


class ScopeRole(NamedTuple):
    """A marker on a record field's type: what the field tells about where the record happened."""

    role: str  # "netns" (an inode) | "address" (one IP address as text)


NetnsField = Annotated[int, ScopeRole("netns")]
AddressField = Annotated[str | None, ScopeRole("address")]
# The same where the record always has the address (a route lookup's destination): the schema says so.
AddressText = Annotated[str, ScopeRole("address")]


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


class RecordScope:
    """The last line of a scope on the way out: whether a typed record stays inside it, read from the fields
    its class marks as naming a namespace (`NetnsField`) or an address (`AddressField`) - at any depth of
    nested records, optional parts and lists of parts - never from key names.

    A record that names a namespace must name only the scope's; a record that carries addresses must have
    one inside the scope's ranges ("either address", as the kernel filter); a record that carries neither
    (a profile stack) passes only a host-wide scope.
    """

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def allows(self, record: object) -> bool:
        if self.scope.host_wide:
            return True
        netns = list(scoped_values(record, "netns"))
        addresses = [value for value in scoped_values(record, "address") if value]
        if not netns and not addresses:
            return False
        if not all(isinstance(inode, int) and self.scope.holds_netns(inode) for inode in netns):
            return False
        return not addresses or any(
            isinstance(text, str) and self.scope.holds_address(text) for text in addresses
        )


def scoped_values(record: object, role: str) -> Iterator[object]:
    """Every value of `record` whose field type is marked with ScopeRole(role), depth first."""
    for name, inner_role, nested in _scoped_fields(cast(Hashable, type(record))):
        value = getattr(record, name, None)
        if value is None:
            continue
        if inner_role == role:
            yield value
        elif nested:
            for item in value if isinstance(value, list | tuple) else (value,):
                yield from scoped_values(item, role)


@functools.cache
def _scoped_fields(kind: Hashable) -> tuple[tuple[str, str | None, bool], ...]:
    """(field, role or None, may hold nested records) of a Struct class; fields that can hold neither a
    marked value nor a Struct are left out, so checking a record costs only what it can hold."""
    import msgspec

    if not (isinstance(kind, type) and issubclass(kind, msgspec.Struct)):
        return ()
    hints = typing.get_type_hints(kind, include_extras=True)
    fields: list[tuple[str, str | None, bool]] = []
    for name in kind.__struct_fields__:
        hint = hints.get(name)
        role = _role(hint)
        if role is not None:
            fields.append((name, role, False))
        elif _holds_struct(hint):
            fields.append((name, None, True))
    return tuple(fields)


def _role(hint: object) -> str | None:
    for meta in getattr(hint, "__metadata__", ()):
        if isinstance(meta, ScopeRole):
            return meta.role
    for argument in typing.get_args(hint):
        if typing.get_origin(hint) is not typing.Annotated:
            role = _role(argument)
            if role is not None and typing.get_origin(hint) in (types.UnionType, typing.Union):
                return role
    return None


def _holds_struct(hint: object) -> bool:
    import msgspec

    if isinstance(hint, type):
        return issubclass(hint, msgspec.Struct)
    return any(_holds_struct(argument) for argument in typing.get_args(hint))
