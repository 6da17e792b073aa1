"""ADAPTER, TO DELETE: the fleet's scope and forms for diagnostics that are not typed specs yet.

Issue 21 moves every diagnostic to one typed spec (netsleuth.spec): its config is a msgspec Struct whose
`ScopeTraits` say which fields a scope narrows, and its records are typed, so admission narrows the config
with msgspec.structs.replace and the last line checks records by their field types (spec.scope.RecordScope).
Until each diagnostic is converted, its config is JSON checked by its own reader and its records are
dicts, so the fleet keeps the old way for it here, and only here:

- `scoped_config`: the scope pushed into the JSON config's keys (`netns`, `k8s_namespace`, `host`);
- `narrow_to_scope`: a dataclass config's packet filters and NAT join confined (conn);
- `DictScope`: the last-line filter on a dict record, by key names;
- `config_schema`: a form's schema for a config without a type, from the typed fields of the same name.

Everything here takes the typed `Scope` admission resolved: the scope is one typed value either way. When
the last diagnostic is typed, `is_typed` is always true: delete this module and its callers' `untyped.`
branches (admission, scope_filter, diagnostic_source, controller/app, the session request).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from netsleuth.errors import UsageError
from netsleuth.kernel.netns import NetnsNames
from netsleuth.spec.options import IpNetwork
from netsleuth.spec.scope import Scope

if TYPE_CHECKING:
    from netsleuth.fleet.host_namespaces import NamespaceLookup
    from netsleuth.fleet.protocol import Task

__all__ = [
    "HOST_WIDE_VERDICTS",
    "DictScope",
    "config_schema",
    "is_typed",
    "narrow_to_scope",
    "scoped_config",
]

# diagnose's verdicts that are facts about the whole machine, not about one namespace: the per-CPU NET_RX
# budget (diagnostics/softirq/rules.py) is spent on every namespace's packets alike.
HOST_WIDE_VERDICTS = frozenset({"net-rx-budget"})
_HOST_WIDE = "*"


def is_typed(spec: object) -> bool:
    """Whether a registered diagnostic is a typed spec (netsleuth.spec.diagnostic.DiagnosticSpec)."""
    from netsleuth.spec.diagnostic import DiagnosticSpec

    return isinstance(spec, DiagnosticSpec)


def _network(text: object, where: str) -> IpNetwork:
    try:
        return ipaddress.ip_network(str(text), strict=False)
    except ValueError:
        raise UsageError(f"{where} {text!r} is not an address or CIDR") from None


# -- admission ------------------------------------------------------------------------------------------
def scoped_config(
    task: Task,
    scope: Scope,
    namespaces: NamespaceLookup,
    validate: Callable[[str, dict[str, Any]], object] | None,
    refused: Callable[[str, Task], Exception],
) -> dict[str, Any]:
    """An untyped diagnostic's JSON config with `scope` pushed into its `netns` / `k8s_namespace` / `host`
    keys, then checked by its own reader (`validate`)."""
    from netsleuth.diagnostics.registry import get_diagnostic

    name = task.diagnostic
    config = dict(task.config)
    asked = config.get("netns")
    if asked is not None and not isinstance(asked, str):
        raise refused("config.netns must be a namespace name", task)
    if scope.host_wide:
        if asked == _HOST_WIDE:
            del config["netns"]  # "*" as the user's netns filter: no filter
        elif asked is not None:
            try:
                config["netns"] = str(namespaces.netns(asked).inode)
            except UsageError:
                raise refused(f"network namespace {asked!r} does not exist on this host", task) from None
        return _validated(name, config, validate, refused, task)
    # (Every diagnostic that runs only host-wide is typed: its ScopeTraits.host_wide_only says why.)
    keys = get_diagnostic(name).keys
    inside = {netns.inode for netns in scope.namespaces}
    chosen = [key for key in ("netns", "pod", "k8s_namespace") if config.get(key) is not None]
    if chosen:
        key = chosen[0]
        value = str(config[key])
        try:
            if key == "netns":
                named = {namespaces.netns(value).inode}
            elif key == "pod":
                named = {namespaces.pod(value).inode}
            else:
                named = {netns.inode for netns in namespaces.k8s_namespace(value)}
        except UsageError as error:
            raise refused(str(error), task) from None
        if not named <= inside:
            raise refused(f"config.{key} {value!r} is outside the task's scope ({scope.describe()})", task)
        if key == "netns":
            (inode,) = named
            config["netns"] = str(inode)
    elif scope.k8s_namespace is not None and "k8s_namespace" in keys:
        config["k8s_namespace"] = scope.k8s_namespace
    elif len(scope.namespaces) == 1:
        config["netns"] = str(scope.namespaces[0].inode)
    else:
        raise refused(
            f"{name}'s kernel filter takes one network namespace, and Kubernetes namespace "
            f"{scope.k8s_namespace}'s pods have {len(scope.namespaces)} here",
            task,
        )
    if scope.networks:
        if "host" not in keys:
            # snoop's processes carry no address: nothing in the kernel or after it could narrow them.
            raise refused(f"{name} has no address filter, so an address scope cannot be enforced", task)
        hosts = config.get("host") or []
        if not isinstance(hosts, list) or not all(isinstance(item, str) for item in hosts):
            raise refused("config.host must be a list of addresses", task)
        for text in hosts:
            try:
                network = _network(text, "config.host")
            except UsageError as error:
                raise refused(str(error), task) from None
            if not any(
                network.version == outer.version and network.subnet_of(outer)  # type: ignore[arg-type]
                for outer in scope.networks
            ):
                raise refused(f"config.host {text!r} is outside the task's address scope", task)
        # No address filter asked: the scope itself becomes the filter ("either address" in the kernel).
        config["host"] = hosts or [str(network) for network in scope.networks]
    return _validated(name, config, validate, refused, task)


def _validated(
    name: str,
    config: dict[str, Any],
    validate: Callable[[str, dict[str, Any]], object] | None,
    refused: Callable[[str, Task], Exception],
    task: Task,
) -> dict[str, Any]:
    if validate is not None:
        # The diagnostic's own validation of its config (the CLI's flags, as JSON): a bad filter is a
        # refusal now, not an accepted task that fails in prepare.
        try:
            validate(name, config)
        except UsageError as error:
            raise refused(f"invalid config for {name}: {error}", task) from None
    return config


# -- the typed-at-open config of an untyped spec (dataclasses) --------------------------------------------
def narrow_to_scope(config: Any, scope: Scope, files: tuple[str, ...]) -> Any:
    """The dataclass config with every packet filter confined to the scope's namespace and, when the scope has
    addresses, to them (a filter already narrower is left alone: admission made the diagnostic's own filter
    the scope's or a part of it), and the NAT join's conntrack reads confined to the scope's namespaces
    (`files`, to enter them by). A host-wide scope changes nothing."""
    from netsleuth.diagnostics.filters import PacketFilter

    if scope.host_wide or not dataclasses.is_dataclass(config) or isinstance(config, type):
        return config
    namespaces = scope.namespaces
    changes: dict[str, Any] = {}
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if isinstance(value, PacketFilter):
            narrowed = value
            if narrowed.netns is None and not narrowed.netns_set:
                if len(namespaces) == 1:
                    narrowed = dataclasses.replace(narrowed, netns=namespaces[0].inode)
                else:
                    narrowed = dataclasses.replace(
                        narrowed, netns_set=frozenset(netns.inode for netns in namespaces)
                    )
            if scope.networks and not narrowed.hosts:
                # conn's drop filter leaves the server end out (after a DNAT packets no longer carry it);
                # under an address scope what does not carry a scope address may not be seen anyway.
                narrowed = dataclasses.replace(narrowed, hosts=scope.networks)
            if narrowed is not value:
                changes[item.name] = narrowed
        elif item.name == "conntrack_namespaces" and value is None:
            changes[item.name] = files
    return dataclasses.replace(config, **changes) if changes else config


# -- the last line, on dict records -----------------------------------------------------------------------
# Keys whose value names a network namespace (an inode, an `ip netns` name, or an inode as text).
_NETNS_KEYS = ("netns", "netns_name", "client_netns", "server_netns")
# Keys whose value is one address (conn's "client"/"server" are "addr:port": those do not parse, and conn
# carries saddr/daddr as well).
_ADDRESS_KEYS = ("saddr", "daddr", "client", "server", "address", "src", "dst")


def _addresses(record: Mapping[str, Any]) -> Iterator[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    for key in _ADDRESS_KEYS:
        value = record.get(key)
        if isinstance(value, str):
            try:
                yield ipaddress.ip_address(value)
            except ValueError:
                continue
    for direction in ("orig", "reply"):  # a conntrack record's tuples
        flow = record.get(direction)
        if isinstance(flow, Mapping):
            yield from _addresses(flow)


def _walk(value: object) -> Iterator[Mapping[str, Any]]:
    """Every mapping inside a free-form value (a verdict's evidence), itself included."""
    if isinstance(value, Mapping):
        yield value
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


class DictScope:
    """One task's scope on dict records, by key names: what scope_filter.ScopeFilter does for records of
    diagnostics that are not typed yet. `narrow` returns the record as it may leave (None: withheld) and how
    many entries of it were removed."""

    def __init__(self, scope: Scope, names: NetnsNames) -> None:
        self.scope = scope
        self._inodes = {netns.inode for netns in scope.namespaces}
        texts: set[str] = set()
        own = os.stat("/proc/self/ns/net").st_ino
        for netns in scope.namespaces:
            texts.add(str(netns.inode))
            for name in (netns.name, names.name_of(netns.inode)):
                if name:
                    texts.add(name)
            if netns.inode == own:
                texts.add("host")  # the label conntrack readers give the agent's own namespace
        self._names = frozenset(texts)

    def _netns_in_scope(self, value: object) -> bool | None:
        """True/False for a value naming a namespace; None when it names none (unknown, null)."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, int):
            if value == 0:
                return None  # the kernel could not tell: judged by the record's other facts
            return value in self._inodes
        if isinstance(value, str):
            text = value.removeprefix("netns ")
            return text in self._names if text else None
        return False

    def _namespaces(self, record: Mapping[str, Any]) -> list[bool]:
        found = [
            verdict for key in _NETNS_KEYS if (verdict := self._netns_in_scope(record.get(key))) is not None
        ]
        pod = record.get("pod")
        if isinstance(pod, Mapping) and isinstance(pod.get("namespace"), str):
            found.append(self.scope.holds_k8s_namespace(pod["namespace"]))
        return found

    def _addresses_in_scope(self, record: Mapping[str, Any]) -> bool | None:
        if not self.scope.networks:
            return None
        found = list(_addresses(record))
        if not found:
            return None
        return any(
            address.version == network.version and address in network
            for address in found
            for network in self.scope.networks
        )

    def inside(self, record: Mapping[str, Any], bare_ok: bool = False) -> bool:
        """A record (or an entry of one) is inside when every namespace it names is the scope's and, if it
        carries addresses, one is inside the scope's ranges. One that says neither is inside only a host-wide
        scope, or where its container already was (`bare_ok`: an entry of a record that was checked)."""
        namespaces = self._namespaces(record)
        if not all(namespaces):
            return False
        addresses = self._addresses_in_scope(record)
        if addresses is False:
            return False
        return bool(namespaces) or addresses is True or bare_ok

    def narrow(self, record: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
        kind = record.get("type")
        if kind == "summary":
            return self._summary(record)
        if kind == "conn":
            return self._conn(record)
        if kind == "verdict":
            return (record if self._verdict(record) else None), 0
        return (record if self.inside(record) else None), 0

    def _summary(self, summary: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """A summary always goes (it carries the exact totals); its groups only when inside the scope. A
        group names its namespace itself (drops) or through its example (resets, tcp)."""
        removed = 0
        narrowed = dict(summary)
        for key in ("groups", "napi"):
            groups = summary.get(key)
            if not isinstance(groups, list):
                continue
            kept = []
            for group in groups:
                example = group.get("example") if isinstance(group, Mapping) else None
                facts = {**example, **group} if isinstance(example, Mapping) else group
                if isinstance(facts, Mapping) and self.inside(facts, bare_ok=False):
                    kept.append(group)
            removed += len(groups) - len(kept)
            narrowed[key] = kept
        return narrowed, removed

    def _conn(self, conn: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
        """A connection stays when one of its sockets is inside; the timeline entries and NAT hops of other
        namespaces are removed (and its drop/reset counts with them)."""
        ends = [self._netns_in_scope(conn.get(key)) for key in ("client_netns", "server_netns")]
        if True not in ends or self._addresses_in_scope(conn) is False:
            return None, 0
        narrowed = dict(conn)
        removed = 0
        for key, verdict in zip(("client_netns", "server_netns"), ends, strict=True):
            if verdict is False:
                narrowed[key] = None  # the other end's namespace is not this task's to name
                removed += 1
        timeline = [entry for entry in conn.get("timeline") or [] if isinstance(entry, Mapping)]
        kept_entries = [entry for entry in timeline if self.inside(entry, bare_ok=True)]
        gone = [entry for entry in timeline if entry not in kept_entries]
        for event, count_key in (("drop", "drops"), ("reset", "resets")):
            lost = sum(1 for entry in gone if entry.get("event") == event)
            if lost and isinstance(conn.get(count_key), int):
                narrowed[count_key] = max(0, conn[count_key] - lost)
        hops = [hop for hop in conn.get("nat") or [] if isinstance(hop, Mapping)]
        kept_hops = [hop for hop in hops if self._netns_in_scope(hop.get("where")) is not False]
        removed += len(timeline) - len(kept_entries) + len(hops) - len(kept_hops)
        narrowed["timeline"] = kept_entries
        narrowed["nat"] = kept_hops
        if removed:
            # The verdict was written from everything the tracker joined and may name what was removed.
            narrowed["verdict"] = (
                f"{conn.get('outcome', 'unknown')} (as seen inside this task's scope; "
                f"{removed} out-of-scope part(s) withheld)"
            )
        return narrowed, removed

    def _verdict(self, verdict: Mapping[str, Any]) -> bool:
        facts = list(_walk(verdict.get("evidence")))
        namespaces = [flag for fact in facts for flag in self._namespaces(fact)]
        if not all(namespaces):
            return False
        if any(self._addresses_in_scope(fact) is False for fact in facts):
            return False
        # A verdict about the path (devices, sysctls, listeners) was read inside the scope's namespace by
        # diagnose itself; one about the whole machine's CPUs is not this task's to see.
        return bool(namespaces) or verdict.get("category") not in HOST_WIDE_VERDICTS


# -- the form --------------------------------------------------------------------------------------------
def config_schema(keys: tuple[str, ...], title: str = "") -> dict[str, Any]:
    """A form's JSON Schema for an untyped config: each key with the typed field of the same name where the
    shared configs (spec.common) have one - the same meaning, label and help - else a text field."""
    from netsleuth.spec.common import PacketConfig
    from netsleuth.spec.schemas import config_schema as typed_schema

    shared = typed_schema(PacketConfig)
    known: dict[str, Any] = shared.get("properties", {})
    properties: dict[str, Any] = {}
    for key in keys:
        properties[key] = known.get(key) or {
            "type": "string",
            "title": key.replace("_", " "),
            "description": f"--{key.replace('_', '-')}",
            "x-flag": f"--{key.replace('_', '-')}",
        }
    properties["v"] = {"const": 1, "default": 1, "x-form": False}
    schema: dict[str, Any] = {
        "$schema": shared["$schema"],
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if "$defs" in shared:
        schema["$defs"] = shared["$defs"]
    if title:
        schema["title"] = title
    return schema
