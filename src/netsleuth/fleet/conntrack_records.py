"""The conntrack side of a fleet session: what lets the controller follow a flow across NAT, say when each
translation happened, and tell a packet that skipped one.

From prepare on, the agent listens to conntrack's events in the namespaces the task's scope allows (its
namespace, or every one for a host-wide scope; kernel/conntrack_events.py), so an entry created - and even
created and destroyed - inside the window is seen, with the moment its NAT was set up (the NEW event). At the
end it ships one `conntrack` record per entry of the session's flows (nat_join.ConntrackEntry.to_record, the
format the controller's merge reads) with:
- `created`: when the NEW event arrived (the translation's time; read by a helper process, so late by its
  wake-up, ~0.3 ms idle, a few ms on a loaded host), or the kernel's own creation time where the operator
  turned on net.netfilter.nf_conntrack_timestamp (exact: kept in the table and in DESTROY events); null for
  an entry older than the session (in the table at the end, no NEW event in the window: a long-lived
  connection);
- `destroyed`: when the DESTROY event arrived, or null;
- `states`: the TCP states the events showed, with their times (at most 16).
`time` is `created` when known (the timeline places the hop there), else the end of the session.

An entry belongs when either of its directions matches the session's filters as a packet would: the
original tuple as the client sent it, or the reply tuple turned around - the same flow after the NAT - so a
DNATed flow filtered on `dport 80` (before the NAT) or on `dport 8080` (after it) is found either way.

It also ships a `conntrack_stats` record for each namespace where conntrack found packets INVALID during the
window (its per-namespace counter at T0 and at the end, over ctnetlink): how many, and the namespace's
nf_conntrack_tcp_be_liberal. INVALID packets are not NATed - that is how a packet skips a DNAT or a
sidecar's REDIRECT.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple
from netsleuth.errors import NetsleuthError
from netsleuth.kernel.conntrack import ConntrackReader, Namespace, list_namespaces
from netsleuth.kernel.conntrack_events import ConntrackEvent, ConntrackEvents
from netsleuth.kernel.netns import NetnsNames
from netsleuth.kernel.netns_exec import read_file_in_netns

__all__ = [
    "MAX_CONNTRACK_RECORDS",
    "ConntrackWatch",
    "entry_matches",
    "joins_conntrack",
]

MAX_CONNTRACK_RECORDS = 512  # per host and session (docs/fleet.md)
_MAX_STATES = 16  # state changes kept per entry
_LIBERAL = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Key = tuple[str, FlowTuple, FlowTuple]  # where, original, reply: what stays fixed over an entry's life


def _networks(value: object) -> list[_Network]:
    items = value if isinstance(value, list) else [value] if isinstance(value, str) else []
    networks = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(str(item), strict=False))
        except ValueError:
            continue  # the diagnostic's own validation has refused it already
    return networks


def _in(address: str, networks: Sequence[_Network]) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(parsed in network for network in networks)


def _port(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _direction_matches(flow: FlowTuple, config: Mapping[str, Any]) -> bool:
    proto = config.get("proto")
    if isinstance(proto, str) and proto not in ("any", "all") and flow.proto != proto:
        return False
    (src_addr, src_port), (dst_addr, dst_port) = flow.src, flow.dst
    checks = (
        ("dport", lambda port: dst_port == port),
        ("sport", lambda port: src_port == port),
        ("port", lambda port: port in (src_port, dst_port)),
    )
    for key, check in checks:
        wanted = _port(config.get(key))
        if wanted is not None and not check(wanted):
            return False
    address_checks: tuple[tuple[str, Callable[[list[_Network]], bool]], ...] = (
        ("host", lambda nets: _in(src_addr, nets) or _in(dst_addr, nets)),
        ("src", lambda nets: _in(src_addr, nets)),
        ("dst", lambda nets: _in(dst_addr, nets)),
    )
    for key, address_check in address_checks:
        networks = _networks(config.get(key))
        if networks and not address_check(networks):
            return False
    return True


def joins_conntrack(diagnostic: str) -> bool:
    """Whether a fleet session of `diagnostic` ships conntrack entries for the controller's NAT join: its
    spec says so (ScopeTraits.joins_conntrack)."""
    from netsleuth.diagnostics.registry import get_diagnostic

    return bool(get_diagnostic(diagnostic).scope.joins_conntrack)


def entry_matches(entry: ConntrackEntry, config: Mapping[str, Any]) -> bool:
    return _direction_matches(entry.original, config) or _direction_matches(entry.translated, config)


def _iso(ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(ns // 1_000_000_000, datetime.UTC)
    return (moment + datetime.timedelta(microseconds=ns % 1_000_000_000 // 1000)).isoformat(
        timespec="microseconds"
    )


def _labels(namespaces: list[Namespace], names: NetnsNames) -> dict[str, str]:
    """The name each namespace's records carry, by reader label: its `ip netns` name, `host` for the
    agent's own (what scope_filter.py accepts for it), else its inode."""
    labels = {}
    for inode, path, where in namespaces:
        labels[where] = "host" if path is None else names.name_of(inode) or str(inode)
    return labels


@dataclass
class _Life:
    """What the events of the window showed of one entry."""

    entry: ConntrackEntry  # as last seen (its state, status)
    first_ns: int
    created_ns: int | None = None
    destroyed_ns: int | None = None
    states: list[tuple[int, str]] = field(default_factory=list)

    def to_record(self, label: str) -> dict[str, Any]:
        when = self.created_ns if self.created_ns is not None else self.first_ns
        return {
            **self.entry.to_record(label, _iso(when)),
            "created": _iso(self.created_ns) if self.created_ns is not None else None,
            "destroyed": _iso(self.destroyed_ns) if self.destroyed_ns is not None else None,
            "states": [{"time": _iso(ns), "state": state} for ns, state in self.states],
        }


def _older(entry: ConntrackEntry, label: str, end_ns: int) -> dict[str, Any]:
    """An entry of the table at the end that no event of the window showed: older than the session."""
    record = entry.to_record(label, _iso(end_ns))
    return {**record, "created": None, "destroyed": None, "states": []}


def _created_in_window(record: dict[str, Any], stamped: int | None, t0_ns: int) -> dict[str, Any]:
    """An entry the kernel says it created inside the window, though no NEW event was read for it (lost,
    or cut): its kernel time."""
    if stamped is None or stamped < t0_ns:
        return record
    return {**record, "time": _iso(stamped), "created": _iso(stamped)}


def _lives(
    events: list[ConntrackEvent], t0_ns: int, end_ns: int, stamped: Mapping[_Key, int]
) -> dict[_Key, _Life]:
    """What the window's events showed of each entry. `stamped`: when the kernel created entries, where it
    keeps that (nf_conntrack_timestamp=1: in the table and in DESTROY events, not in NEW): exact, so it
    replaces the NEW event's arrival."""
    lives: dict[_Key, _Life] = {}
    for event in events:
        if not t0_ns <= event.wall_ns <= end_ns:
            continue  # before T0 (prepare) or after the end: outside the window every host reports
        entry = event.entry
        key = (entry.where, entry.original, entry.reply)
        life = lives.setdefault(key, _Life(entry, event.wall_ns))
        life.entry = entry
        if event.kind == "new":
            life.created_ns = event.wall_ns
        elif event.kind == "destroy":
            life.destroyed_ns = event.wall_ns
        if event.created_ns is not None and life.created_ns is not None:
            life.created_ns = event.created_ns
        state = entry.state
        if state and (not life.states or life.states[-1][1] != state) and len(life.states) < _MAX_STATES:
            life.states.append((event.wall_ns, state))
    for key, life in lives.items():
        if life.created_ns is not None and key in stamped:
            life.created_ns = stamped[key]
    return lives


class ConntrackWatch:
    """One session's conntrack: events from creation on (create it in prepare, before the traffic), the
    INVALID counters at T0 (`mark`) and at the end, and the table at the end (`finish`).

    `namespaces`: `ip netns` names or namespace files to watch, None for every namespace of the host."""

    def __init__(
        self,
        config: Mapping[str, Any],
        namespaces: Sequence[str] | None,
        names: NetnsNames | None = None,
    ) -> None:
        self._config = dict(config)
        names = names or NetnsNames(refresh_interval=5.0)
        self._namespaces = list_namespaces(names, namespaces)
        self._labels = _labels(self._namespaces, names)
        self._reader = ConntrackReader(proto=None, names=names, namespaces=namespaces, watch_destroyed=False)
        self._events = ConntrackEvents(
            self._namespaces, wanted=lambda entry: entry_matches(entry, self._config)
        )
        self._baseline: dict[str, int] = {}

    def start(self) -> None:
        self._events.start()

    def mark(self) -> None:
        """At T0: the INVALID counters the window counts from."""
        self._baseline = self._reader.invalid_counts()

    def finish(self, t0_ns: int, end_ns: int) -> tuple[list[dict[str, Any]], list[str]]:
        """(records, notes): the entries of the session's flows and each namespace's INVALID count over
        the window."""
        table = [entry for entry in self._reader.entries() if entry_matches(entry, self._config)]
        lives = _lives(self._events.take(), t0_ns, end_ns, self._reader.created)
        records = [life.to_record(self._label(life.entry.where)) for life in lives.values()]
        records += [
            _created_in_window(
                _older(entry, self._label(entry.where), end_ns), self._reader.created.get(key), t0_ns
            )
            for entry in table
            if (key := (entry.where, entry.original, entry.reply)) not in lives
        ]
        notes: list[str] = []
        if len(records) > MAX_CONNTRACK_RECORDS:
            notes.append(
                f"{len(records) - MAX_CONNTRACK_RECORDS} conntrack entries beyond {MAX_CONNTRACK_RECORDS} cut"
            )
            records = records[:MAX_CONNTRACK_RECORDS]
        records += self._stats(end_ns)
        if self._events.lost or self._events.cut:
            notes.append(
                f"conntrack events lost: {self._events.lost} overrun read(s), {self._events.cut} beyond the "
                "buffer (NAT hop times may be missing)"
            )
        notes.extend(self._events.problems)
        notes.extend(self._reader.problems.values())
        return records, notes

    def _stats(self, end_ns: int) -> list[dict[str, Any]]:
        now = self._reader.invalid_counts()
        paths = {where: path for _, path, where in self._namespaces}
        records = []
        for where, count in sorted(now.items()):
            if where not in self._baseline:
                continue  # unreadable at T0: no window to count over
            invalid = count - self._baseline[where]
            if invalid <= 0:
                continue  # nothing to explain: no record (a quiet stream for the usual case)
            record: dict[str, Any] = {
                "type": "conntrack_stats",
                "v": 1,
                "time": _iso(end_ns),
                "netns": self._label(where),
                "invalid": invalid,
                "invalid_total": count,
                # What decides whether out-of-window segments are INVALID: one read inside the namespace.
                "be_liberal": _read_int(_LIBERAL, paths.get(where)),
            }
            records.append(record)
        return records

    def _label(self, where: str) -> str:
        return self._labels.get(where, where.removeprefix("netns "))

    def close(self) -> None:
        self._events.close()
        self._reader.close()


def _read_int(path: str, netns_path: str | None) -> int | None:
    try:
        text = read_file_in_netns(path, netns_path)
    except (NetsleuthError, OSError):
        return None
    return int(text.strip()) if text and text.strip().isdigit() else None
