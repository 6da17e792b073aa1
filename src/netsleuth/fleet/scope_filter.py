"""The last line of a task's scope on the agent: no record outside it leaves the host, and what was held back
is counted.

The first line is in the kernel: admission.py pushes the scope into the diagnostic's own netns and address
filters, and diagnostic_source.py narrows the typed config further where a diagnostic reaches beyond its
`netns` key (conn's drop program and NAT lookups watch every namespace by design). This module checks every
record the session is about to send anyway, because a diagnostic can still join facts from elsewhere in user
space (a conntrack lookup, a host-wide softirq verdict) and a scope the agent promised to keep must not depend
on every diagnostic getting that right:

- a record naming a network namespace (`netns`, `netns_name`, `client_netns`/`server_netns`, a conntrack
  record's label) must name the scope's; a record carrying addresses must have one inside the scope's address
  ranges ("either address", the kernel filter's meaning);
- a `conn` report keeps only the timeline entries and NAT hops inside the scope (its counts follow, and its
  verdict, which may name what was removed, says so instead);
- a summary keeps only the groups inside the scope; a `diagnose` verdict whose evidence names another
  namespace, or that is a host-wide fact (per-CPU softirq load), is withheld;
- a record carrying neither a namespace nor an address (a profile stack) passes only a host-wide scope.

Everything withheld is counted (`withheld_records`, `withheld_entries`), and the host's `ended` status says
so: totals stay honest when the agent holds something back.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from netsleuth.kernel.netns import NetnsNames

__all__ = [
    "HOST_WIDE_VERDICTS",
    "EnforcedScope",
    "ScopeFilter",
]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# diagnose's verdicts that are facts about the whole machine, not about one namespace: the per-CPU NET_RX
# budget (diagnose/softirq_rules.py) is spent on every namespace's packets alike.
HOST_WIDE_VERDICTS = frozenset({"net-rx-budget"})
# Keys whose value names a network namespace (an inode, an `ip netns` name, or an inode as text).
_NETNS_KEYS = ("netns", "netns_name", "client_netns", "server_netns")
# Keys whose value is one address (conn's "client"/"server" are "addr:port": those do not parse, and conn
# carries saddr/daddr as well).
_ADDRESS_KEYS = ("saddr", "daddr", "client", "server", "address", "src", "dst")
_OWN_NETNS = "/proc/self/ns/net"


@dataclass(frozen=True)
class EnforcedScope:
    """What a task may see on this host, as admission decided it.

    `netns` is what the diagnostic's netns filter was given (an `ip netns` name or a namespace file), None
    only for a host-wide scope; `networks` the address ranges (empty: any address)."""

    host_wide: bool
    netns: str | None
    networks: tuple[Network, ...] = ()

    def describe(self) -> str:
        if self.host_wide:
            return "host-wide"
        where = "this host's own namespace" if self.netns == _OWN_NETNS else f"netns {self.netns}"
        if self.networks:
            where += " and " + ", ".join(str(network) for network in self.networks)
        return where


def _netns_names(netns: str, names: NetnsNames) -> tuple[int | None, frozenset[str]]:
    """The inode of the scope's namespace and every text a record may name it by."""
    path = netns if "/" in netns else f"/run/netns/{netns}"
    try:
        inode: int | None = os.stat(path).st_ino
    except OSError:
        inode = None  # gone since admission: nothing the diagnostic reports can be in it
    texts = set() if "/" in netns else {netns}
    if inode is not None:
        texts.add(str(inode))
        name = names.name_of(inode)
        if name:
            texts.add(name)
        if inode == os.stat(_OWN_NETNS).st_ino:
            texts.add("host")  # the label conntrack readers give the agent's own namespace
    return inode, frozenset(texts)


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


class ScopeFilter:
    """Checks records against one task's scope and counts what it holds back. Thread-safe counters: the
    session thread filters, the status is read from the same thread, but nothing here assumes it."""

    def __init__(self, scope: EnforcedScope, names: NetnsNames | None = None) -> None:
        self.scope = scope
        self._inode: int | None = None
        self._names: frozenset[str] = frozenset()
        if not scope.host_wide and scope.netns is not None:
            self._inode, self._names = _netns_names(scope.netns, names or NetnsNames())
        self._lock = threading.Lock()
        self.withheld_records = 0
        self.withheld_entries = 0  # timeline entries, NAT hops, summary groups removed from kept records

    @property
    def withheld(self) -> int:
        return self.withheld_records + self.withheld_entries

    def note(self) -> str | None:
        """The sentence for the host's status, when anything was held back."""
        if not self.withheld:
            return None
        parts = []
        if self.withheld_records:
            parts.append(f"{self.withheld_records} record(s)")
        if self.withheld_entries:
            parts.append(f"{self.withheld_entries} entr(ies) of kept records")
        return (
            f"withheld {self.withheld} out-of-scope ({' and '.join(parts)}; scope: {self.scope.describe()})"
        )

    # -- the checks ------------------------------------------------------------------------------------
    def _netns_in_scope(self, value: object) -> bool | None:
        """True/False for a value naming a namespace; None when it names none (unknown, null)."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, int):
            if value == 0:
                return None  # the kernel could not tell: judged by the record's other facts
            return value == self._inode
        if isinstance(value, str):
            text = value.removeprefix("netns ")
            return text in self._names if text else None
        return False

    def _namespaces(self, record: Mapping[str, Any]) -> list[bool]:
        return [
            verdict for key in _NETNS_KEYS if (verdict := self._netns_in_scope(record.get(key))) is not None
        ]

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

    def _inside(self, record: Mapping[str, Any], bare_ok: bool = False) -> bool:
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

    # -- records ---------------------------------------------------------------------------------------
    def keep(self, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """The records (some narrowed) that may leave the host; the rest counted."""
        if self.scope.host_wide:
            return list(records)
        kept = []
        withheld = entries = 0
        for record in records:
            narrowed, removed = self._narrow(record)
            entries += removed
            if narrowed is None:
                withheld += 1
            else:
                kept.append(narrowed)
        with self._lock:
            self.withheld_records += withheld
            self.withheld_entries += entries
        return kept

    def keep_alike(self, record: dict[str, Any], count: int) -> bool:
        """Whether `count` records alike `record` - the same but for their time, as a batch's drops of one
        kind (netsleuth.diagnostics.drop_batch) - may leave the host; counted as `keep` would count them.
        Only for records that are kept or withheld whole (not summaries, conn reports or verdicts)."""
        if record.get("type") in ("summary", "conn", "verdict"):
            raise ValueError(f"a {record.get('type')} record is narrowed, not kept whole")
        if self.scope.host_wide or self._inside(record):
            return True
        with self._lock:
            self.withheld_records += count
        return False

    def _narrow(self, record: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
        kind = record.get("type")
        if kind == "summary":
            return self._summary(record)
        if kind == "conn":
            return self._conn(record)
        if kind == "verdict":
            return (record if self._verdict(record) else None), 0
        return (record if self._inside(record) else None), 0

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
                if isinstance(facts, Mapping) and self._inside(facts, bare_ok=False):
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
        kept_entries = [entry for entry in timeline if self._inside(entry, bare_ok=True)]
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
