"""The scope of a session as one typed value, from the role that grants it to the kernel filter and the last
line on the way out.

A `Netns` is an inode plus its name on this host, resolved once. A `Scope` is host-wide, one namespace, or
the pods of one Kubernetes namespace on this host (their namespaces, resolved once through the container
runtime), optionally with address ranges. A diagnostic's `ScopeTraits` say how its config is narrowed to a
scope (which field the kernel filters the namespace by, which the addresses by, which a Kubernetes
namespace by, and a hook for what reaches further than those fields) and whether it can be narrowed at
all; records say which of their fields name a namespace, an address or a pod's Kubernetes namespace by
their types (`NetnsField`, `AddressField` / `AddressText`, `K8sNamespaceField`), so the last-line filter
reads typed fields, never guesses from key names.
"""

from __future__ import annotations

import functools
import ipaddress
import types
import typing
from collections.abc import Callable, Hashable, Iterator
from typing import Annotated, Any, NamedTuple, cast

import msgspec

from netsleuth.spec.options import IpNetwork

__all__ = [
    "AddressField",
    "AddressText",
    "K8sNamespaceField",
    "Netns",
    "NetnsField",
    "NetnsLabels",
    "RecordScope",
    "Scope",
    "ScopeRole",
    "ScopeTraits",
    "scoped_values",
]


class ScopeRole(NamedTuple):
    """A marker on a record field's type: what the field tells about where the record happened."""

    role: str  # "netns" (an inode) | "address" (one IP address as text) | "k8s_namespace" (a pod's)


NetnsField = Annotated[int, ScopeRole("netns")]
AddressField = Annotated[str | None, ScopeRole("address")]
# The same where the record always has the address (a route lookup's destination): the schema says so.
AddressText = Annotated[str, ScopeRole("address")]
# The Kubernetes namespace of the pod a record names (spec.parts.PodRef): under a Kubernetes namespace scope a
# record naming another's pod is outside it, whatever its network namespace says.
K8sNamespaceField = Annotated[str, ScopeRole("k8s_namespace")]


class Netns(NamedTuple):
    """A network namespace of this host: its inode (what the kernel filters by) and its `ip netns` name
    (None when it has none)."""

    inode: int
    name: str | None

    def __str__(self) -> str:
        return self.name or str(self.inode)


class Scope(msgspec.Struct, frozen=True):
    """What one session may see: every namespace of the host (`host_wide`); one namespace (`netns`); or the
    pods of one Kubernetes namespace on this host (`k8s_namespace`, with their network namespaces as resolved
    once when the task was admitted: `pod_netns`) - plus, for the last two, optionally some address ranges
    ("either address", the kernel filter's meaning)."""

    host_wide: bool
    netns: Netns | None = None
    networks: tuple[IpNetwork, ...] = ()
    k8s_namespace: str | None = None
    pod_netns: tuple[Netns, ...] = ()

    def __post_init__(self) -> None:
        chosen = [self.host_wide, self.netns is not None, self.k8s_namespace is not None]
        if sum(chosen) != 1:
            raise ValueError("a scope is host-wide, one namespace, or one Kubernetes namespace's pods")
        if self.host_wide and self.networks:
            raise ValueError("a host-wide scope names no addresses")
        if self.k8s_namespace is not None and not self.pod_netns:
            # An empty set would be no kernel filter at all: a scope that sees nothing is refused instead.
            raise ValueError("a Kubernetes namespace scope names its pods' network namespaces")

    @property
    def namespaces(self) -> tuple[Netns, ...]:
        """The network namespaces inside the scope (empty for host-wide: all of them)."""
        if self.netns is not None:
            return (self.netns,)
        return self.pod_netns

    def holds_netns(self, inode: int) -> bool:
        return self.host_wide or any(netns.inode == inode for netns in self.namespaces)

    def holds_k8s_namespace(self, name: str) -> bool:
        """Whether a pod of Kubernetes namespace `name` is inside: only its own under a Kubernetes scope."""
        return self.k8s_namespace is None or name == self.k8s_namespace

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
        if self.k8s_namespace is not None:
            where = f"Kubernetes namespace {self.k8s_namespace} ({len(self.pod_netns)} pod namespace(s) here)"
        else:
            where = f"netns {self.netns}"
        if self.networks:
            where += " and " + ", ".join(str(network) for network in self.networks)
        return where


class ScopeTraits(msgspec.Struct, frozen=True):
    """How a diagnostic is kept inside a scope.

    `netns_field`: the config field the kernel filters one namespace by (None, or a name its config lacks:
    it cannot be kept inside a namespace, so it runs only host-wide); `address_field`: the config field
    holding "either address" filters an address scope narrows (None: its records carry no address, so an
    address scope cannot be enforced); `k8s_namespace_field`: the config field that chooses a Kubernetes
    namespace's pods, which the kernel filters as a set of namespaces (None or absent: a Kubernetes scope
    whose pods here share one namespace is held by `netns_field`, any other is refused); `host_wide_only`:
    why it cannot be kept inside a namespace at all (its records carry no namespace); `joins_conntrack`: its
    flows are joined across hosts with each host's conntrack entries.

    `narrow(config, scope)`: for a diagnostic whose reach goes beyond those fields (conn's drop program and
    NAT lookups watch every namespace by design; diagnose's watches each have their own filter), the config
    confined to the scope there too. It gets the config already narrowed on the fields above, returns it
    (msgspec.structs.replace), and raises netsleuth.errors.UsageError for a scope it cannot keep.
    """

    netns_field: str | None = "netns"
    address_field: str | None = "host"
    k8s_namespace_field: str | None = "k8s_namespace"
    host_wide_only: str | None = None
    joins_conntrack: bool = False
    narrow: Callable[[Any, Scope], Any] | None = None

    def field_of(self, config_type: type, role: str) -> str | None:
        """The config field this diagnostic narrows for `role` ("netns", "address", "k8s_namespace"), None
        when it declares none or its config has no such field: a scope it cannot push into a field is
        refused, never left unenforced."""
        name = {
            "netns": self.netns_field,
            "address": self.address_field,
            "k8s_namespace": self.k8s_namespace_field,
        }[role]
        fields: tuple[str, ...] = getattr(config_type, "__struct_fields__", ())
        return name if name is not None and name in fields else None


class NetnsLabels:
    """Whether a namespace as a label names it - its `ip netns` name, its inode (as a number or as text),
    `netns NAME` (a NAT hop's `where`), `host` (the conntrack reader's label for the agent's own) - is one
    of a scope's: how a conn report's timeline and a conntrack record say where they were seen."""

    def __init__(self, scope: Scope) -> None:
        import os

        own = os.stat("/proc/self/ns/net").st_ino
        self._inodes = {netns.inode for netns in scope.namespaces}
        texts = {str(netns.inode) for netns in scope.namespaces}
        texts.update(netns.name for netns in scope.namespaces if netns.name)
        if own in self._inodes:
            texts.add("host")
        self._texts = frozenset(texts)

    def holds(self, value: object) -> bool | None:
        """True/False for a value naming a namespace; None when it names none (unknown: 0, null, empty)."""
        if value is None or value == 0 or isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value in self._inodes
        if not isinstance(value, str):
            return False
        text = value.removeprefix("netns ")
        return text in self._texts if text else None


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
        pods = scoped_values(record, "k8s_namespace")
        if not all(isinstance(name, str) and self.scope.holds_k8s_namespace(name) for name in pods):
            return False
        return not addresses or any(
            isinstance(text, str) and self.scope.holds_address(text) for text in addresses
        )

    def narrow(self, record: Any) -> tuple[Any | None, int]:
        """The record as it may leave (None: withheld) and how many of its parts were removed.

        A summary always leaves (it carries the exact totals): each of its lists of parts that say where
        they happened (groups with their example) keeps only the parts inside. A record type with more to
        narrow than that (a connection report's timeline) defines `narrowed(scope)` returning the same
        pair; every other record is kept or withheld whole."""
        if self.scope.host_wide:
            return record, 0
        own = getattr(record, "narrowed", None)
        if callable(own):
            narrowed, removed = own(self.scope)
            return narrowed, int(removed)
        from netsleuth.spec.summary import Summary

        # Every summary by its tag, not only spec.summary.Summary's: diagnose's (DiagnoseSummary) is its own
        # Record, names no namespace, and withheld it would leave the session without its end.
        if isinstance(record, Summary) or getattr(type(record).__struct_config__, "tag", None) == "summary":
            return self._summary(record)
        return (record if self.allows(record) else None), 0

    def _summary(self, summary: Any) -> tuple[Any, int]:
        import msgspec

        changes: dict[str, Any] = {}
        removed = 0
        for name, role, nested in _scoped_fields(cast(Hashable, type(summary))):
            value = getattr(summary, name, None)
            if role is not None or not nested or not isinstance(value, list | tuple):
                continue
            # Only parts that can say where they happened are judged (a list of per-CPU counts is not).
            kept = [
                part for part in value if not _carries_scope(cast(Hashable, type(part))) or self.allows(part)
            ]
            if len(kept) != len(value):
                removed += len(value) - len(kept)
                changes[name] = type(value)(kept)
        return (msgspec.structs.replace(summary, **changes) if changes else summary), removed


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


@functools.cache
def _carries_scope(kind: Hashable) -> bool:
    """Whether records of this Struct class can hold a marked value, at any depth."""
    import msgspec

    if not (isinstance(kind, type) and issubclass(kind, msgspec.Struct)):
        return False
    hints = typing.get_type_hints(kind, include_extras=True)
    for name, role, _nested in _scoped_fields(kind):
        if role is not None or any(_carries_scope(inner) for inner in _struct_types(hints.get(name))):
            return True
    return False


def _struct_types(hint: object) -> Iterator[type]:
    import msgspec

    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        yield hint
    for argument in typing.get_args(hint):
        yield from _struct_types(argument)


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
