"""One merged timeline per fleet session: every host's records on the controller's clock, joined by flow
across hosts and across NAT, ending in one per-hop verdict per flow.

Time: each record's wall-clock `time` is the host's; subtracting the host's measured clock offset (agent minus
controller, NTP-style from the ping exchange) puts all hosts on one clock, so "SYN left a" sorts before
"dropped on c" even when c's clock runs ahead.

Flows: a flow is identified like `conn` does on one host, by its unordered pair of endpoints (the same from
either side). Across NAT the pair changes on the NAT host; its conntrack entry has the pre-NAT pair (the orig
tuple) and the post-NAT pair (the reply tuple, read backwards), and the two are joined (union-find). The
agents ship their conntrack entries as "conntrack" records at the end of a session (FLEET-CONTRACT.md).
Hops are ordered by how many NATs lie between them and the client, then by corrected time: conntrack entries
are read at the end, so their own time says nothing about where in the path they sit.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ConntrackTuple",
    "FlowKey",
    "MergedTimeline",
    "conntrack_from_record",
    "endpoint_text",
    "parse_time_ns",
]

Endpoint = tuple[str, int]
FlowKey = tuple[str, frozenset[Endpoint]]  # (proto, {endpoint, endpoint})

_BENIGN_DROPS = frozenset({"QUEUE_PURGE"})  # a closed socket's queues purged: part of a normal close
_FLOW_TYPES = frozenset({"drop", "reset", "abort", "state", "retrans", "connect", "life", "queue"})


def parse_time_ns(text: object) -> int | None:
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    # Integer arithmetic: float seconds would lose the microseconds at today's epoch.
    delta = moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def iso_from_ns(ns: int) -> str:
    seconds, rest = divmod(ns, 1_000_000_000)
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC) + datetime.timedelta(
        microseconds=rest // 1000
    )
    return moment.isoformat(timespec="microseconds")


def endpoint_text(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _endpoint(address: object, port: object) -> Endpoint | None:
    if isinstance(address, str) and address and isinstance(port, int) and not isinstance(port, bool):
        return (address, port)
    return None


def _split(text: object) -> Endpoint | None:
    """`198.18.0.2:80` / `[2001:db8::2]:80` -> (address, port)."""
    if not isinstance(text, str):
        return None
    address, _, port = text.rpartition(":")
    if not port.isdigit() or not address:
        return None
    return (address.strip("[]"), int(port))


@dataclass(frozen=True)
class ConntrackTuple:
    """One conntrack entry as an agent read it: the orig tuple (as the first packet arrived) and the reply
    tuple (as the answer is expected). DNAT shows as orig.dst != reply.src, SNAT as orig.src != reply.dst."""

    host: str
    netns: str
    proto: str
    orig_src: Endpoint
    orig_dst: Endpoint
    reply_src: Endpoint
    reply_dst: Endpoint
    state: str | None

    @property
    def orig_key(self) -> FlowKey:
        return (self.proto, frozenset((self.orig_src, self.orig_dst)))

    @property
    def reply_key(self) -> FlowKey:
        return (self.proto, frozenset((self.reply_src, self.reply_dst)))

    @property
    def dnat(self) -> bool:
        return self.orig_dst != self.reply_src

    @property
    def snat(self) -> bool:
        return self.orig_src != self.reply_dst

    def nat_text(self) -> str:
        parts = []
        if self.dnat:
            parts.append(f"DNAT {endpoint_text(*self.orig_dst)} -> {endpoint_text(*self.reply_src)}")
        if self.snat:
            parts.append(f"SNAT {endpoint_text(*self.orig_src)} -> {endpoint_text(*self.reply_dst)}")
        return ", ".join(parts)


def conntrack_from_record(host: str, record: Mapping[str, Any]) -> ConntrackTuple | None:
    orig, reply = record.get("orig"), record.get("reply")
    if not isinstance(orig, dict) or not isinstance(reply, dict):
        return None
    points = [
        _endpoint(orig.get("src"), orig.get("sport")),
        _endpoint(orig.get("dst"), orig.get("dport")),
        _endpoint(reply.get("src"), reply.get("sport")),
        _endpoint(reply.get("dst"), reply.get("dport")),
    ]
    if any(point is None for point in points):
        return None
    orig_src, orig_dst, reply_src, reply_dst = (point for point in points if point is not None)
    state = record.get("state")
    return ConntrackTuple(
        host=host,
        netns=str(record.get("netns") or ""),
        proto=str(record.get("proto") or "tcp"),
        orig_src=orig_src,
        orig_dst=orig_dst,
        reply_src=reply_src,
        reply_dst=reply_dst,
        state=state if isinstance(state, str) else None,
    )


@dataclass(frozen=True)
class _Observation:
    """One thing one host saw of one flow, on the controller's clock."""

    host: str
    time_ns: int
    key: FlowKey
    kind: str  # sent | state | retransmit | drop | reset | established | nat | conntrack | other
    text: str
    source: Endpoint | None = None  # who sent the packet, where known (drops, resets)
    detail: dict[str, Any] = field(default_factory=dict)


class _UnionFind:
    def __init__(self) -> None:
        self._parent: dict[FlowKey, FlowKey] = {}

    def find(self, key: FlowKey) -> FlowKey:
        parent = self._parent.setdefault(key, key)
        if parent != key:
            parent = self._parent[key] = self.find(parent)
        return parent

    def union(self, first: FlowKey, second: FlowKey) -> None:
        a, b = self.find(first), self.find(second)
        if a != b:
            # Deterministic root (the smaller key), so the same input always names flows the same way.
            low, high = sorted((a, b), key=_key_sort)
            self._parent[high] = low


def _key_sort(key: FlowKey) -> tuple[str, list[Endpoint]]:
    return (key[0], sorted(key[1]))


def _record_key(record: Mapping[str, Any]) -> tuple[FlowKey, Endpoint, Endpoint] | None:
    """(key, source, destination) of a record that names one packet or socket pair."""
    proto = str(record.get("proto") or "tcp")
    kind = record.get("type")
    if kind == "conn":
        client, server = _split(record.get("client")), _split(record.get("server"))
        if client is None or server is None:
            return None
        return ((proto, frozenset((client, server))), client, server)
    if kind == "conntrack":
        entry = record.get("orig")
        if isinstance(entry, dict):
            src = _endpoint(entry.get("src"), entry.get("sport"))
            dst = _endpoint(entry.get("dst"), entry.get("dport"))
            if src is not None and dst is not None:
                return ((proto, frozenset((src, dst))), src, dst)
        return None
    src = _endpoint(record.get("saddr"), record.get("sport"))
    dst = _endpoint(record.get("daddr"), record.get("dport"))
    if src is None or dst is None or src == dst:
        return None
    return ((proto, frozenset((src, dst))), src, dst)


def _drop_text(record: Mapping[str, Any], host: str) -> str:
    netfilter = record.get("netfilter")
    if isinstance(netfilter, dict) and netfilter.get("rule"):
        return f'dropped on host {host} by "{netfilter["rule"]}"'
    reason = record.get("reason") or "an unknown reason"
    location = f" at {record['location']}" if record.get("location") else ""
    return f"dropped on host {host}: {reason}{location}"


def _packet_name(flags: object) -> str:
    """`SYN` / `SYN-ACK` / `RST` from the drops record's `SYN|ACK` style flags."""
    names = set(flags.split("|")) if isinstance(flags, str) else set()
    if "SYN" in names:
        return "SYN-ACK" if "ACK" in names else "SYN"
    if "RST" in names:
        return "RST"
    return "packet"


class MergedTimeline:
    """Accumulates one session's records; `timeline()` and `verdicts()` can be asked at any moment."""

    def __init__(self, hostnames: Mapping[str, str] | None = None, max_entries: int = 100_000) -> None:
        self._hostnames = dict(hostnames or {})
        self._offsets: dict[str, int] = {}
        self._entries: list[dict[str, Any]] = []
        self._observations: list[_Observation] = []
        self._conntrack: list[ConntrackTuple] = []
        self._max_entries = max_entries
        self.dropped_entries = 0  # beyond max_entries: counted, never silently forgotten
        self._sequence = 0

    def set_offset(self, host: str, offset_ns: int) -> None:
        self._offsets[host] = offset_ns

    def offset(self, host: str) -> int:
        return self._offsets.get(host, 0)

    # -- input ------------------------------------------------------------------------------------------
    def add(self, host: str, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Takes one record as the host sent it; returns the merged entries it became (a `conn` report
        becomes one entry per event of its timeline plus the report)."""
        entries = []
        kind = record.get("type")
        if kind == "conn" and isinstance(record.get("timeline"), list):
            for event in record["timeline"]:
                if isinstance(event, dict):
                    entries.append(self._entry(host, {"type": "conn_event", **event}, record))
        entries.append(self._entry(host, record, None))
        return [entry for entry in entries if entry]

    def _entry(self, host: str, record: Mapping[str, Any], conn: Mapping[str, Any] | None) -> dict[str, Any]:
        host_ns = parse_time_ns(record.get("time"))
        if host_ns is None and record.get("type") == "conn":
            times = [parse_time_ns(e.get("time")) for e in record.get("timeline", []) if isinstance(e, dict)]
            known = [t for t in times if t is not None]
            host_ns = max(known) if known else None
        corrected = None if host_ns is None else host_ns - self.offset(host)
        keyed = _record_key(conn if conn is not None else record)
        entry: dict[str, Any] = dict(record)
        entry["host"] = host
        if host_ns is not None and corrected is not None:
            entry["host_time"] = record.get("time") or iso_from_ns(host_ns)
            entry["time"] = iso_from_ns(corrected)
        self._sequence += 1
        entry["_seq"] = self._sequence
        entry["_ns"] = corrected if corrected is not None else 0
        if keyed is not None:
            key, _src, _dst = keyed
            entry["_key"] = key
            entry["flow"] = self._flow_text(key)
        if record.get("type") == "conntrack":
            entry_ct = conntrack_from_record(host, record)
            if entry_ct is not None:
                self._conntrack.append(entry_ct)
        if keyed is not None and corrected is not None:
            self._observe(host, corrected, record, conn, keyed)
        if len(self._entries) < self._max_entries:
            self._entries.append(entry)
        else:
            self.dropped_entries += 1
        return self._public(entry)

    def _observe(
        self,
        host: str,
        time_ns: int,
        record: Mapping[str, Any],
        conn: Mapping[str, Any] | None,
        keyed: tuple[FlowKey, Endpoint, Endpoint],
    ) -> None:
        key, src, _dst = keyed
        kind = record.get("type")
        observation: _Observation | None = None
        if kind == "drop":
            if record.get("reason") not in _BENIGN_DROPS:
                observation = _Observation(
                    host,
                    time_ns,
                    key,
                    "drop",
                    _drop_text(record, host),
                    src,
                    {"netfilter": record.get("netfilter"), "packet": _packet_name(record.get("tcp_flags"))},
                )
        elif kind == "reset":
            direction = record.get("direction")
            cause = record.get("cause") or ""
            verb = "sent by" if direction in ("sent", "out", "tx") else "received on"
            observation = _Observation(
                host, time_ns, key, "reset", f"reset {verb} host {host} ({cause})", src
            )
        elif kind == "state" and record.get("new_state") == "SYN_SENT":
            observation = _Observation(host, time_ns, key, "sent", f"SYN left {self._where(host)}", src)
        elif kind == "state" and record.get("new_state") == "ESTABLISHED":
            observation = _Observation(host, time_ns, key, "established", f"established on host {host}", src)
        elif kind == "conn_event" and conn is not None:
            client = _split(conn.get("client"))
            event, text = record.get("event"), str(record.get("text") or "")
            if event == "state" and record.get("new_state") == "SYN_SENT":
                observation = _Observation(
                    host, time_ns, key, "sent", f"SYN left {self._where(host)}", client
                )
            elif event == "state" and record.get("new_state") == "ESTABLISHED":
                observation = _Observation(host, time_ns, key, "established", f"established on host {host}")
            elif event == "drop" and record.get("reason") not in _BENIGN_DROPS:
                observation = _Observation(host, time_ns, key, "drop", _drop_text(record, host))
            elif event == "reset":
                observation = _Observation(host, time_ns, key, "reset", f"{text} on host {host}")
            elif event in ("retransmit", "synack_retransmit"):
                observation = _Observation(host, time_ns, key, "retransmit", f"{text} on host {host}")
        elif kind == "conntrack":
            entry = conntrack_from_record(host, record)
            if entry is not None and (entry.dnat or entry.snat):
                observation = _Observation(
                    host,
                    time_ns,
                    entry.orig_key,
                    "nat",
                    f"{entry.nat_text()} on {self._where(host, 'on')}",
                    entry.orig_src,
                    {"reply_key": entry.reply_key},
                )
            elif entry is not None:
                state = f" ({entry.state})" if entry.state else ""
                observation = _Observation(
                    host,
                    time_ns,
                    key,
                    "conntrack",
                    f"tracked by conntrack on host {host}{state}",
                    entry.orig_src,
                )
        if observation is not None:
            self._observations.append(observation)

    def _where(self, host: str, style: str = "left") -> str:
        name = self._hostnames.get(host)
        if style == "on":
            return f"{name} (host {host})" if name else f"host {host}"
        return f"{name} (host {host})" if name else f"host {host}"

    # -- flows ------------------------------------------------------------------------------------------
    def _groups(self) -> _UnionFind:
        groups = _UnionFind()
        for entry in self._conntrack:
            groups.union(entry.orig_key, entry.reply_key)
        return groups

    def _flow_text(self, key: FlowKey, groups: _UnionFind | None = None) -> str:
        """The flow as the client sees it: the orig tuple of the first NAT (or the pair as it is)."""
        groups = groups or self._groups()
        root = groups.find(key)
        replies = {entry.reply_key for entry in self._conntrack}
        for entry in sorted(self._conntrack, key=lambda e: _key_sort(e.orig_key)):
            if groups.find(entry.orig_key) == root and entry.orig_key not in replies:
                return f"{entry.proto} {endpoint_text(*entry.orig_src)} > {endpoint_text(*entry.orig_dst)}"
        for observation in sorted(self._observations, key=lambda o: o.time_ns):
            if groups.find(observation.key) == root and observation.source is not None:
                other = next(iter(observation.key[1] - {observation.source}), observation.source)
                return f"{key[0]} {endpoint_text(*observation.source)} > {endpoint_text(*other)}"
        first, second = sorted(key[1])
        return f"{key[0]} {endpoint_text(*first)} > {endpoint_text(*second)}"

    def _depths(self, groups: _UnionFind) -> dict[FlowKey, int]:
        """How many NATs lie between the client and each pair: 0 for the client's pair, +1 per NAT."""
        depth: dict[FlowKey, int] = {}
        replies = {entry.reply_key for entry in self._conntrack}
        nat = [entry for entry in self._conntrack if entry.dnat or entry.snat]
        frontier = [entry.orig_key for entry in nat if entry.orig_key not in replies]
        for key in frontier:
            depth[key] = 0
        while frontier:
            following = []
            for key in frontier:
                for entry in nat:
                    if entry.orig_key == key and entry.reply_key not in depth:
                        depth[entry.reply_key] = depth[key] + 1
                        following.append(entry.reply_key)
            frontier = following
        return depth

    # -- output -----------------------------------------------------------------------------------------
    @staticmethod
    def _public(entry: Mapping[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in entry.items() if not key.startswith("_")}

    def timeline(self) -> list[dict[str, Any]]:
        """Every kept entry, ordered by corrected time, with its flow named after the NAT join."""
        groups = self._groups()
        names: dict[FlowKey, str] = {}
        ordered = sorted(self._entries, key=lambda e: (e["_ns"], e["_seq"]))
        result = []
        for entry in ordered:
            public = self._public(entry)
            key = entry.get("_key")
            if key is not None:
                root = groups.find(key)
                if root not in names:
                    names[root] = self._flow_text(key, groups)
                public["flow"] = names[root]
            result.append(public)
        return result

    def verdicts(self, host_states: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
        """One verdict per flow that any host saw something of; missing hosts are named."""
        groups = self._groups()
        depths = self._depths(groups)
        by_flow: dict[FlowKey, list[_Observation]] = {}
        for observation in self._observations:
            by_flow.setdefault(groups.find(observation.key), []).append(observation)
        missing = sorted(
            (host, state) for host, state in (host_states or {}).items() if state.get("state") != "ended"
        )
        verdicts: list[dict[str, Any]] = []
        for root, observations in by_flow.items():
            hops = self._hops(observations, depths)
            if not hops:
                continue
            outcome = self._outcome(hops)
            text = " -> ".join(hop["detail"] for hop in hops)
            if missing:
                text += (
                    " (partial: "
                    + "; ".join(
                        f"host {host} {state.get('state')}"
                        + (f": {state.get('reason')}" if state.get("reason") else "")
                        for host, state in missing
                    )
                    + ")"
                )
            verdicts.append(
                {
                    "type": "verdict",
                    "flow": self._flow_text(root, groups),
                    "outcome": outcome,
                    "hops": hops,
                    "missing_hosts": [host for host, _ in missing],
                    "text": text,
                }
            )
        order = {"dropped": 0, "reset": 1, "unanswered": 2, "established": 3, "seen": 4}
        verdicts.sort(key=lambda v: (order.get(v["outcome"], 9), v["flow"]))
        return verdicts

    def _hops(self, observations: list[_Observation], depths: Mapping[FlowKey, int]) -> list[dict[str, Any]]:
        chosen: dict[tuple[str, str, str], _Observation] = {}
        counts: dict[tuple[str, str, str], int] = {}
        observed_hosts = {o.host for o in observations if o.kind not in ("conntrack",)}
        for observation in observations:
            if observation.kind == "conntrack" and observation.host in observed_hosts:
                continue  # the host said something better about this flow
            # One hop per (host, what, text): a SYN retransmitted five times is one hop "x5".
            hop_key = (observation.host, observation.kind, observation.text)
            counts[hop_key] = counts.get(hop_key, 0) + 1
            if hop_key not in chosen or observation.time_ns < chosen[hop_key].time_ns:
                chosen[hop_key] = observation

        def position(observation: _Observation) -> tuple[float, int, int]:
            depth: float = depths.get(observation.key, 0)
            if observation.kind == "nat":
                depth += 0.5  # between the pair it came in on and the pair it leaves with
            elif observation.kind == "sent":
                depth = -1  # the client's own send precedes everything else on its pair
            rank = {"sent": 0, "retransmit": 1}.get(observation.kind, 2)
            return (depth, rank, observation.time_ns)

        hops = []
        for hop_key, observation in sorted(chosen.items(), key=lambda item: position(item[1])):
            detail = observation.text
            if counts[hop_key] > 1:
                detail += f" (x{counts[hop_key]})"
            hops.append(
                {
                    "host": observation.host,
                    "event": observation.kind,
                    "detail": detail,
                    "time": iso_from_ns(observation.time_ns),
                }
            )
        # Retransmits on the client are evidence, not a hop of the path: keep them only when nothing
        # further along the path explains the flow.
        if any(hop["event"] in ("drop", "reset", "established") for hop in hops):
            hops = [hop for hop in hops if hop["event"] != "retransmit"]
        return hops

    @staticmethod
    def _outcome(hops: list[dict[str, Any]]) -> str:
        events = {hop["event"] for hop in hops}
        if "drop" in events:
            return "dropped"
        if "reset" in events:
            return "reset"
        if "established" in events:
            return "established"
        if "sent" in events or "retransmit" in events:
            return "unanswered"
        return "seen"
