"""One merged timeline per fleet session: every host's records on one clock, joined by flow across hosts and
across NAT, ending in one per-hop verdict per flow.

Time: each record's wall-clock `time` is the host's; subtracting the host's measured clock offset (agent minus
controller) puts all hosts on the controller's clock, so "SYN left a" sorts before "dropped on c" even when
c's clock runs ahead.

Flows across NAT: the agents ship their conntrack entries as `conntrack` records at the end of a session
(FLEET-CONTRACT.md). `netsleuth.diagnostics.nat_join` - the same join the single-host `conn` uses - places
every packet seen anywhere on its flow's NAT path: the client's original tuple, then the tuple after each NAT.
A flow is named by that original tuple; flows no NAT touched are keyed by their unordered pair of endpoints
(the same from either side, as `conn` does). Hops are ordered by their position on the path (how many NATs
lie between them and the client), then by corrected time: conntrack entries are read at the end of the
session, so their own time says nothing about where in the path they sit.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple, NatHop, NatIndex
from netsleuth.packet import endpoint_text

__all__ = ["MergedTimeline", "iso_from_ns", "parse_time_ns"]

Endpoint = tuple[str, int]
_PairKey = tuple[str, frozenset[Endpoint]]

_BENIGN_DROPS = frozenset({"QUEUE_PURGE"})  # a closed socket's queues purged: part of a normal close
_OUTCOME_ORDER = {"nat-bypass": 0, "dropped": 1, "reset": 2, "unanswered": 3, "established": 4, "seen": 5}


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
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return (moment + datetime.timedelta(microseconds=rest // 1000)).isoformat(timespec="microseconds")


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


def _record_tuple(record: Mapping[str, Any]) -> FlowTuple | None:
    """The packet or socket pair a record names, in the direction the record gives it."""
    proto = str(record.get("proto") or "tcp")
    kind = record.get("type")
    if kind == "conn":
        client, server = _split(record.get("client")), _split(record.get("server"))
        return FlowTuple(proto, client, server) if client and server else None
    if kind == "conntrack":
        return FlowTuple.from_json(proto, record.get("orig") or {})
    src = _endpoint(record.get("saddr"), record.get("sport"))
    dst = _endpoint(record.get("daddr"), record.get("dport"))
    if src is None or dst is None or src == dst:
        return None
    return FlowTuple(proto, src, dst)


# `dropped [SYN] 198.18.0.5:48606 > 198.18.2.7:8080: ...`: the packet of a `conn` timeline drop (its JSON has
# the reason and rule but not the tuple, which differs from the connection's after a NAT).
_PACKET_IN_TEXT = re.compile(r"\] (\S+) > (\S+?):? ")
# `RST sent (no socket): a SYN|ACK segment from 198.18.2.7:8081 matched no socket on 198.18.0.5:43362`: the
# segment that drew the reset (its source, then where it arrived).
_RESET_IN_TEXT = re.compile(r"segment from (\S+) matched no socket on (\S+)")


def _packet_tuple(record: Mapping[str, Any]) -> FlowTuple | None:
    """The tuple of the packet itself for a conn timeline drop or reset, where it can be known."""
    if record.get("type") != "conn_event" or record.get("event") not in ("drop", "reset"):
        return None
    if record.get("saddr") is not None:
        return _record_tuple({**record, "type": "drop"})
    text = str(record.get("text") or "")
    found = _PACKET_IN_TEXT.search(text) or _RESET_IN_TEXT.search(text)
    if found is None:
        return None
    src, dst = _split(found.group(1).rstrip(":,")), _split(found.group(2).rstrip(":,"))
    return FlowTuple(str(record.get("proto") or "tcp"), src, dst) if src and dst else None


def _nat_entry(record: Mapping[str, Any], where: str) -> ConntrackEntry | None:
    """A conntrack record, or a `conn` timeline's NAT event (its before/after tuples), as a NAT entry."""
    if record.get("type") == "conntrack":
        return ConntrackEntry.from_record(record, where=where)
    if record.get("type") == "conn_event" and record.get("event") == "nat":
        proto = str(record.get("proto") or "tcp")
        before = FlowTuple.from_json(proto, record.get("before") or {})
        after = FlowTuple.from_json(proto, record.get("after") or {})
        if before is not None and after is not None:
            return ConntrackEntry(
                where=where, original=before, reply=after.reversed(), state=record.get("state")
            )
    return None


def _counts(names: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts


def _drop_text(record: Mapping[str, Any], host: str) -> str:
    netfilter = record.get("netfilter")
    if isinstance(netfilter, dict) and netfilter.get("rule"):
        return f'dropped on host {host} by "{netfilter["rule"]}"'
    reason = record.get("reason") or "an unknown reason"
    location = f" at {record['location']}" if record.get("location") else ""
    return f"dropped on host {host}: {reason}{location}"


def _carries_rst(record: Mapping[str, Any]) -> bool:
    """Is the dropped packet a TCP reset (`tcp_flags` as drops and conn write them: `RST`, `RST|ACK`)?"""
    flags = record.get("tcp_flags")
    return isinstance(flags, str) and "RST" in flags.split("|")


@dataclass(frozen=True)
class _Observation:
    """One thing one host saw of one flow, on the controller's clock."""

    host: str
    time_ns: int
    flow: FlowTuple  # as the host saw it
    kind: str  # sent | retransmit | drop | reset | established
    text: str
    directed: bool = False  # `flow` is known to be client -> server (a SYN sent, a conn report)
    # A drop of an RST segment: the consequence of a reset sent, on another host often, and placed after
    # it whatever the clocks say (hosts' corrected times are only as close as their offsets are known).
    of_reset: bool = False


class MergedTimeline:
    """Accumulates one session's records; `timeline()` and `verdicts()` can be asked at any moment."""

    def __init__(
        self,
        hostnames: Mapping[str, str] | None = None,
        max_entries: int = 100_000,
        netns_owner: Mapping[str, str] | None = None,
    ) -> None:
        """`netns_owner`: namespace name (or inode as text) -> the host id that holds it, from the registry,
        so an event one host reports about another host's namespace (a `conn` report joins the server's
        drop to the client's connection) is placed on the host where it happened."""
        self._hostnames = dict(hostnames or {})
        self._netns_owner = dict(netns_owner or {})
        # Hostnames several hosts share (namespaces of one machine) name nobody: "host <id>" is said instead.
        self._shared_names = {
            name for name, count in _counts(list(self._hostnames.values())).items() if count > 1
        }
        self._timeline_cache: tuple[tuple[int, int], list[dict[str, Any]]] | None = None
        self._offsets: dict[str, int] = {}
        # (corrected ns, arrival number, flow as recorded, the public entry): sorted on demand.
        self._entries: list[tuple[int, int, FlowTuple | None, dict[str, Any]]] = []
        self._observations: list[_Observation] = []
        self._conntrack: list[ConntrackEntry] = []
        self._conntrack_time: dict[ConntrackEntry, int] = {}
        self._max_entries = max_entries
        self.dropped_entries = 0  # beyond max_entries: counted, never silently forgotten
        self._sequence = 0

    @property
    def records(self) -> int:
        """Merged entries so far (kept or counted beyond the bound)."""
        return self._sequence

    def set_offset(self, host: str, offset_ns: int) -> None:
        self._offsets[host] = offset_ns

    def offset(self, host: str) -> int:
        return self._offsets.get(host, 0)

    # -- input ------------------------------------------------------------------------------------------
    def add(self, host: str, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Takes one record as the host sent it; returns the merged entries it became (a `conn` report
        becomes one entry per event of its timeline, then the report)."""
        entries = []
        if record.get("type") == "conn" and isinstance(record.get("timeline"), list):
            for event in record["timeline"]:
                if isinstance(event, dict):
                    entries.append(self._entry(host, {"type": "conn_event", **event}, record))
        entries.append(self._entry(host, record, None))
        return entries

    def _entry(self, host: str, record: Mapping[str, Any], conn: Mapping[str, Any] | None) -> dict[str, Any]:
        host_ns = parse_time_ns(record.get("time"))
        if host_ns is None and record.get("type") == "conn":
            times = [parse_time_ns(e.get("time")) for e in record.get("timeline", []) if isinstance(e, dict)]
            host_ns = max((t for t in times if t is not None), default=None)
        corrected = None if host_ns is None else host_ns - self.offset(host)
        flow = _record_tuple(conn if conn is not None else record)
        entry: dict[str, Any] = dict(record)
        entry["host"] = host
        if host_ns is not None and corrected is not None:
            entry["host_time"] = record.get("time") or iso_from_ns(host_ns)
            entry["time"] = iso_from_ns(corrected)
        self._sequence += 1
        if flow is not None:
            entry["flow"] = f"{flow.proto} {flow.text()}"
        where = self._owner(record, host)
        conntrack = _nat_entry(record, where)
        if conntrack is not None:
            self._conntrack.append(conntrack)
            self._conntrack_time.setdefault(conntrack, corrected or 0)
        elif flow is not None and corrected is not None:
            self._observe(where, corrected, record, _packet_tuple(record) or flow)
        if len(self._entries) < self._max_entries:
            self._entries.append((corrected if corrected is not None else 0, self._sequence, flow, entry))
        else:
            self.dropped_entries += 1
        return entry

    def _observe(self, host: str, time_ns: int, record: Mapping[str, Any], flow: FlowTuple) -> None:
        """A conn report's events carry the report's flow (client -> server); drops and resets their own."""
        kind = record.get("type")
        event = record.get("event") if kind == "conn_event" else kind
        new_state = record.get("new_state")
        observation: _Observation | None = None
        if event == "state" and new_state == "SYN_SENT":
            observation = _Observation(host, time_ns, flow, "sent", f"SYN left {self._where(host)}", True)
        elif event == "state" and new_state == "ESTABLISHED":
            observation = _Observation(host, time_ns, flow, "established", f"established on host {host}")
        elif event == "drop" and record.get("reason") not in _BENIGN_DROPS:
            text = _drop_text(record, host)
            observation = _Observation(host, time_ns, flow, "drop", text, of_reset=_carries_rst(record))
        elif event == "reset" and kind == "reset":
            verb = "sent by" if record.get("direction") in ("sent", "out", "tx") else "received on"
            observation = _Observation(
                host,
                time_ns,
                flow,
                "reset",
                f"reset {verb} host {host} ({record.get('cause') or 'no cause'})",
            )
        elif event == "reset":
            # `RST sent (no socket): <why>`: the why is in the conn report; the hop says what and where.
            what = str(record.get("text") or "reset").split(":", 1)[0]
            observation = _Observation(host, time_ns, flow, "reset", f"{what} on host {host}")
        elif event in ("retransmit", "synack_retransmit", "retrans"):
            text = record.get("text") or f"{record.get('kind', '')} retransmit".strip()
            observation = _Observation(host, time_ns, flow, "retransmit", f"{text} on host {host}")
        if observation is not None:
            self._observations.append(observation)

    def _owner(self, record: Mapping[str, Any], host: str) -> str:
        """The host whose namespace the record happened in (the reporting host when unknown)."""
        for key in ("netns_name", "netns"):
            value = record.get(key)
            if value is not None and str(value) in self._netns_owner:
                return self._netns_owner[str(value)]
        return host

    def _where(self, host: str) -> str:
        """`lb (host b)`; just `host b` when the hostname adds nothing (the same as the id, or shared by
        several hosts, as with namespaces of one machine)."""
        name = self._hostnames.get(host)
        return (
            f"{name} (host {host})"
            if name and name != host and name not in self._shared_names
            else f"host {host}"
        )

    # -- flows ------------------------------------------------------------------------------------------
    def _place(self, index: NatIndex, flow: FlowTuple) -> tuple[FlowTuple | _PairKey, int, bool]:
        """(the flow's identity, the packet's position on its NAT path, whether it went server -> client)."""
        placement = index.place(flow) if len(index) else None
        if placement is not None:
            return placement.path.original, placement.position, placement.reply
        return (flow.proto, flow.pair), 0, False

    def _flow_name(self, identity: FlowTuple | _PairKey, observations: list[_Observation]) -> str:
        if isinstance(identity, FlowTuple):
            return f"{identity.proto} {identity.text()}"
        directed = [o for o in observations if o.directed]
        first = min(directed or observations, key=lambda o: o.time_ns)
        return f"{first.flow.proto} {first.flow.text()}"

    def _nat_text(self, hop: NatHop) -> str:
        parts = []
        if hop.entry.dnat:
            parts.append(f"DNAT {endpoint_text(*hop.before.dst)} -> {endpoint_text(*hop.after.dst)}")
        if hop.entry.snat:
            parts.append(f"SNAT {endpoint_text(*hop.before.src)} -> {endpoint_text(*hop.after.src)}")
        return f"{', '.join(parts)} on {self._where(hop.where)}"

    # -- output -----------------------------------------------------------------------------------------
    def timeline(self) -> list[dict[str, Any]]:
        """Every kept entry, ordered by corrected time, its `flow` named after the NAT join (the client's
        original tuple), so the legs of one connection on different hosts share one name."""
        version = (self._sequence, len(self._conntrack))
        if self._timeline_cache is not None and self._timeline_cache[0] == version:
            return self._timeline_cache[1]  # asked again (a client polling) with nothing new: no re-sort
        index = NatIndex(self._conntrack)
        result = []
        for _ns, _seq, flow, entry in sorted(self._entries, key=lambda item: (item[0], item[1])):
            if flow is not None and len(index):
                placement = index.place(flow)
                if placement is not None:
                    entry = {**entry, "flow": f"{flow.proto} {placement.path.original.text()}"}
            result.append(entry)
        self._timeline_cache = (version, result)
        return result

    def verdicts(self, host_states: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
        """One verdict per flow any host saw something of; hosts that did not end normally are named."""
        index = NatIndex(self._conntrack)
        by_flow: dict[FlowTuple | _PairKey, list[tuple[_Observation, float, bool]]] = {}
        for observation in self._observations:
            identity, position, reply = self._place(index, observation.flow)
            by_flow.setdefault(identity, []).append((observation, float(position), reply))
        missing = sorted(
            (host, state) for host, state in (host_states or {}).items() if state.get("state") != "ended"
        )
        suffix = ""
        if missing:
            suffix = (
                " (partial: "
                + "; ".join(
                    f"host {host} {state.get('state')}"
                    + (f": {state['reason']}" if state.get("reason") else "")
                    for host, state in missing
                )
                + ")"
            )
        verdicts: list[dict[str, Any]] = []
        for identity, placed in by_flow.items():
            hops = self._hops(identity, placed, index)
            if not hops:
                continue
            verdicts.append(
                {
                    "type": "verdict",
                    "flow": self._flow_name(identity, [o for o, _, _ in placed]),
                    "outcome": self._outcome(hops),
                    "hops": hops,
                    "missing_hosts": [host for host, _ in missing],
                    "text": " -> ".join(hop["detail"] for hop in hops) + suffix,
                }
            )
        verdicts.sort(key=lambda v: (_OUTCOME_ORDER.get(v["outcome"], 9), v["flow"]))
        return verdicts

    def _hops(
        self, identity: FlowTuple | _PairKey, placed: list[tuple[_Observation, float, bool]], index: NatIndex
    ) -> list[dict[str, Any]]:
        # One hop per (host, what, text): a SYN retransmitted five times is one hop "(x5)".
        chosen: dict[tuple[str, str, str], tuple[_Observation, float]] = {}
        counts: dict[tuple[str, str, str], int] = {}
        seen: set[tuple[str, str, str, int]] = set()
        rows: list[tuple[float, float, int, dict[str, Any]]] = []
        bypass = self._bypass(identity, placed, index)
        if bypass is not None:
            rows.append(bypass)
        for observation, position, _reply in placed:
            # The same kernel event reported twice (the server's own drop record and the client's conn
            # report that joined it) counts once.
            exact = (observation.host, observation.kind, observation.text, observation.time_ns)
            if exact in seen:
                continue
            seen.add(exact)
            key = (observation.host, observation.kind, observation.text)
            counts[key] = counts.get(key, 0) + 1
            if key not in chosen or observation.time_ns < chosen[key][0].time_ns:
                # The client's own send comes before anything else seen of its tuple.
                chosen[key] = (observation, -1.0 if observation.kind == "sent" else position)
        rank = {"sent": 0, "retransmit": 1}
        for key, (observation, position) in chosen.items():
            order = 3 if observation.of_reset else rank.get(observation.kind, 2)
            detail = observation.text + (f" (x{counts[key]})" if counts[key] > 1 else "")
            hop = {
                "host": observation.host,
                "event": observation.kind,
                "detail": detail,
                "time": iso_from_ns(observation.time_ns),
            }
            rows.append((position, order, observation.time_ns, hop))
        if isinstance(identity, FlowTuple):
            for number, nat in enumerate(index.path(identity).hops):
                # Between the tuple it came in with (position n) and the one it leaves with (n + 1).
                time_ns = self._conntrack_time.get(nat.entry, 0)
                hop = {
                    "host": nat.where,
                    "event": "nat",
                    "detail": self._nat_text(nat),
                    "time": iso_from_ns(time_ns),
                }
                rows.append((number + 0.5, 2, time_ns, hop))
        rows.sort(key=lambda row: row[:3])
        hops = [row[3] for row in rows]
        # The client's retransmits are evidence, not a hop of the path: keep them only when nothing further
        # along the path explains the flow.
        if any(hop["event"] in ("drop", "reset", "established") for hop in hops):
            hops = [hop for hop in hops if hop["event"] != "retransmit"]
        return hops

    def _bypass(
        self, identity: FlowTuple | _PairKey, placed: list[tuple[_Observation, float, bool]], index: NatIndex
    ) -> tuple[float, float, int, dict[str, Any]] | None:
        """A reply that reached the client's host still carrying the address the NAT translated to (the
        server answered straight to the client, not back through the NAT host, so nothing undid the DNAT):
        the client has no socket for it and resets. Seen only by joining hosts: the client sees a stray
        SYN-ACK, the load balancer a half-open entry, the server a reset."""
        if not isinstance(identity, FlowTuple):
            return None
        clients = {o.host for o, _, _ in placed if o.kind == "sent"}
        strays = [(o, p) for o, p, reply in placed if reply and p >= 1 and o.host in clients]
        if not strays:
            return None
        observation, position = min(strays, key=lambda item: item[0].time_ns)
        nat = index.path(identity).hops[int(position) - 1]
        source = observation.flow.src if observation.flow.dst[0] == identity.src[0] else observation.flow.dst
        detail = (
            f"the reply from {endpoint_text(*source)} came straight back to host {observation.host}, "
            f"bypassing the NAT on {self._where(nat.where)} "
            f"(nothing undid the {nat.kind}: no socket expects it)"
        )
        hop = {
            "host": observation.host,
            "event": "bypass",
            "detail": detail,
            "time": iso_from_ns(observation.time_ns),
        }
        return (position, 1.5, observation.time_ns, hop)

    @staticmethod
    def _outcome(hops: list[dict[str, Any]]) -> str:
        events = {hop["event"] for hop in hops}
        if "bypass" in events:
            return "nat-bypass"
        if "drop" in events:
            return "dropped"
        if "reset" in events:
            return "reset"
        if "established" in events:
            return "established"
        if "sent" in events or "retransmit" in events:
            return "unanswered"
        return "seen"
