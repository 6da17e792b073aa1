"""One merged timeline per fleet session: every host's records on one clock, joined by flow across hosts and
across NAT, ending in one per-hop verdict per flow.

Time: each record's wall-clock `time` is the host's; subtracting the host's measured clock offset (agent minus
controller) puts all hosts on the controller's clock. The timeline is sorted by that corrected time; a
verdict's hops are told in causal order (flow_verdict.py, causal_order.py): what happened before what
where it is known (a packet is received after it is sent, a socket's states follow each other), clocks only
where they differ by more than their uncertainty (half the round trip each offset was measured over), and
hops the clocks cannot order are marked concurrent rather than given an order.

Whose record: a record belongs to the host that sent it - the host of the subject it arrived on, which the
controller gives here. A record naming another host's namespace stays on its sender (and is marked so):
joins across hosts link records (a flow through a NAT is one flow), they never move one to another host.

Flows across NAT: the agents ship their conntrack entries as `conntrack` records (fleet/conntrack_records.py),
each with the time its NAT was set up (conntrack's NEW event) or null when it is older than the session.
`netsleuth.diagnostics.nat_join` - the same join the single-host `conn` uses - places every packet seen
anywhere on its flow's NAT path: the client's original tuple, then the tuple after each NAT. A flow is named
by that original tuple; flows no NAT touched are keyed by their unordered pair of endpoints (the same from
either side, as `conn` does).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple, NatIndex
from netsleuth.fleet.flow_verdict import (
    AppView,
    Hop,
    Observation,
    flow_verdict,
    group_observations,
    iso_from_ns,
    reply_bypass_hops,
    skipped_nat_hops,
)
from netsleuth.packet import endpoint_text

__all__ = ["MergedTimeline", "iso_from_ns", "parse_time_ns"]

Endpoint = tuple[str, int]
_PairKey = tuple[str, frozenset[Endpoint]]
_EntryKey = tuple[str, FlowTuple, FlowTuple]  # host, original, reply: one conntrack entry whatever its state

_BENIGN_DROPS = frozenset({"QUEUE_PURGE"})  # a closed socket's queues purged: part of a normal close
# Worst first: what an application saw break, then what nobody answered, then what worked.
_OUTCOME_ORDER = {
    "reset": 0,
    "refused": 0,
    "timeout": 1,
    "dropped": 1,
    "failed": 2,
    "unanswered": 3,
    "open": 4,
    "established": 5,
    "closed": 5,
    "seen": 6,
}


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


def _nat_entry(record: Mapping[str, Any], host: str) -> ConntrackEntry | None:
    """A conntrack record, or a `conn` timeline's NAT event (its before/after tuples), as a NAT entry."""
    if record.get("type") == "conntrack":
        return ConntrackEntry.from_record(record, where=host)
    if record.get("type") == "conn_event" and record.get("event") == "nat":
        proto = str(record.get("proto") or "tcp")
        before = FlowTuple.from_json(proto, record.get("before") or {})
        after = FlowTuple.from_json(proto, record.get("after") or {})
        if before is not None and after is not None:
            return ConntrackEntry(
                where=host, original=before, reply=after.reversed(), state=record.get("state")
            )
    return None


def _counts(names: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts


def _drop_texts(record: Mapping[str, Any], host: str) -> tuple[str, str]:
    """(the hop with its host, the same without it)."""
    netfilter = record.get("netfilter")
    flags = f"{record['tcp_flags']} " if record.get("tcp_flags") else ""
    if isinstance(netfilter, dict) and netfilter.get("rule"):
        return (
            f'dropped on host {host} by "{netfilter["rule"]}"',
            f'{flags}dropped by "{netfilter["rule"]}"',
        )
    reason = record.get("reason") or "an unknown reason"
    location = f" at {record['location']}" if record.get("location") else ""
    return f"dropped on host {host}: {reason}{location}", f"{flags}dropped: {reason}{location}"


def _carries_rst(record: Mapping[str, Any]) -> bool:
    """Is the dropped packet a TCP reset (`tcp_flags` as drops and conn write them: `RST`, `RST|ACK`)?"""
    flags = record.get("tcp_flags")
    return isinstance(flags, str) and "RST" in flags.split("|")


def _netns_named(record: Mapping[str, Any]) -> str | None:
    for key in ("netns_name", "netns"):
        value = record.get(key)
        if value is not None and not isinstance(value, bool):
            return str(value)
    return None


class MergedTimeline:
    """Accumulates one session's records; `timeline()` and `verdicts()` can be asked at any moment."""

    def __init__(
        self,
        hostnames: Mapping[str, str] | None = None,
        max_entries: int = 100_000,
        netns_owner: Mapping[str, str] | None = None,
    ) -> None:
        """`netns_owner`: namespace name (or inode as text) -> the host id that holds it, from the registry.
        Used only to mark a record that names a namespace of a host other than its sender
        (`claims_netns_of`, counted in `foreign_records`): such a record stays its sender's."""
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
        self._observations: list[Observation] = []
        self._conntrack: list[ConntrackEntry] = []
        self._nat_times: dict[_EntryKey, int | None] = {}  # corrected NEW time; None: older than the session
        self._nat_states: dict[_EntryKey, list[str]] = {}
        self._invalid: dict[tuple[str, str], dict[str, Any]] = {}  # (host, netns) -> conntrack_stats
        self._reports: list[tuple[FlowTuple, AppView]] = []
        self._max_entries = max_entries
        self.dropped_entries = 0  # beyond max_entries: counted, never silently forgotten
        self.foreign_records = 0  # records naming another host's namespace (kept on their sender)
        self._sequence = 0

    @property
    def records(self) -> int:
        """Merged entries so far (kept or counted beyond the bound)."""
        return self._sequence

    def set_offset(self, host: str, offset_ns: int) -> None:
        self._offsets[host] = offset_ns

    def offset(self, host: str) -> int:
        return self._offsets.get(host, 0)

    def _corrected(self, host: str, text: object) -> int | None:
        stamp = parse_time_ns(text)
        return None if stamp is None else stamp - self.offset(host)

    # -- input ------------------------------------------------------------------------------------------
    def add(self, host: str, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Takes one record as `host` sent it (the host of the subject it came on); returns the merged entries
        it became (a `conn` report becomes one entry per event of its timeline, then the report)."""
        entries = []
        if record.get("type") == "conn" and isinstance(record.get("timeline"), list):
            for event in record["timeline"]:
                if isinstance(event, dict):
                    entries.append(self._entry(host, {"type": "conn_event", **event}, record))
            self._report(host, record)
        entries.append(self._entry(host, record, None))
        return entries

    def _report(self, host: str, record: Mapping[str, Any]) -> None:
        """The client's own report: what the application saw (conn's outcome), kept for its flow."""
        flow = _record_tuple(record)
        outcome = record.get("outcome")
        if flow is None or not isinstance(outcome, str) or not record.get("client_netns"):
            return  # the server side's report says nothing of what the client's application saw
        duration = record.get("duration_s")
        errno = record.get("errno")
        self._reports.append(
            (
                flow,
                AppView(
                    host,
                    outcome,
                    errno if isinstance(errno, str) else None,
                    float(duration) if isinstance(duration, int | float) else None,
                ),
            )
        )

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
        named = _netns_named(record)
        owner = self._netns_owner.get(named) if named is not None else None
        if owner is not None and owner != host:
            entry["claims_netns_of"] = owner
            self.foreign_records += 1
        if record.get("type") == "conntrack_stats" and isinstance(record.get("invalid"), int):
            self._invalid[(host, str(record.get("netns") or ""))] = dict(record)
        conntrack = _nat_entry(record, host)
        if conntrack is not None:
            self._keep_nat(host, conntrack, record, corrected)
        elif flow is not None and corrected is not None:
            if record.get("type") == "reset":
                # Its tuple is local > remote; what arrived here is the other way round - the segment
                # that drew the RST, or the RST received.
                flow = flow.reversed()
            self._observe(host, corrected, record, _packet_tuple(record) or flow, owner)
        if len(self._entries) < self._max_entries:
            self._entries.append((corrected if corrected is not None else 0, self._sequence, flow, entry))
        else:
            self.dropped_entries += 1
        return entry

    def _keep_nat(
        self, host: str, entry: ConntrackEntry, record: Mapping[str, Any], corrected: int | None
    ) -> None:
        self._conntrack.append(entry)
        key = (host, entry.original, entry.reply)
        # An agent that watched conntrack's events says when the NAT was set up (null: older than the
        # session); a `conn` NAT event, or an agent that only read the table, when it was seen.
        created = self._corrected(host, record.get("created")) if "created" in record else corrected
        known = self._nat_times.get(key)
        if key not in self._nat_times or (created is not None and (known is None or created < known)):
            self._nat_times[key] = created
        states = [s.get("state") for s in record.get("states") or [] if isinstance(s, dict)]
        self._nat_states.setdefault(key, []).extend(str(s) for s in states if s)

    def _observe(
        self, host: str, time_ns: int, record: Mapping[str, Any], flow: FlowTuple, owner: str | None
    ) -> None:
        """A conn report's events carry the report's flow (client -> server); drops and resets their own."""
        kind = record.get("type")
        event = record.get("event") if kind == "conn_event" else kind
        new_state, old_state = record.get("new_state"), record.get("old_state")
        claim = (
            f" (a record naming a namespace of host {owner})" if owner is not None and owner != host else ""
        )
        made: tuple[str, str, str, dict[str, Any]] | None = None  # kind, text, what, extra fields
        if event == "state" and new_state == "SYN_SENT":
            made = ("sent", f"SYN left {self._where(host)}", "SYN left", {"directed": True})
        elif event == "state" and new_state == "ESTABLISHED" and old_state == "SYN_RECV":
            server = endpoint_text(*flow.dst)
            made = ("accepted", f"accepted by {server} on host {host}", f"accepted by {server}", {})
        elif event == "state" and new_state == "ESTABLISHED":
            made = ("established", f"established on host {host}", "established", {})
        elif event == "drop" and record.get("reason") not in _BENIGN_DROPS:
            text, what = _drop_texts(record, host)
            made = ("drop", text, what, {"of_reset": _carries_rst(record)})
        elif event == "reset" and kind == "reset":
            sent = record.get("direction") in ("sent", "out", "tx")
            verb = "sent by" if sent else "received on"
            cause = record.get("cause") or "no cause"
            made = (
                "reset",
                f"reset {verb} host {host} ({cause})",
                f"reset {'sent' if sent else 'received'} ({cause})",
                {"direction": "sent" if sent else "received"},
            )
        elif event == "reset":
            # `RST sent (no socket): <why>`: the why is in the conn report; the hop says what and where.
            what = str(record.get("text") or "reset").split(":", 1)[0]
            direction = record.get("direction") or ("sent" if what.startswith("RST sent") else "received")
            made = ("reset", f"{what} on host {host}", what, {"direction": direction})
        elif event in ("retransmit", "synack_retransmit", "retrans"):
            text = record.get("text") or f"{record.get('kind', '')} retransmit".strip()
            made = ("retransmit", f"{text} on host {host}", str(text), {})
        if made is None:
            return
        name, text, what, extra = made
        self._observations.append(
            Observation(host, time_ns, flow, name, text + claim, what, record=record, **extra)
        )

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

    def _flow_name(self, identity: FlowTuple | _PairKey, observations: list[Observation]) -> str:
        if isinstance(identity, FlowTuple):
            return f"{identity.proto} {identity.text()}"
        directed = [o for o in observations if o.directed]
        first = min(directed or observations, key=lambda o: o.time_ns)
        return f"{first.flow.proto} {first.flow.text()}"

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
        """One verdict per flow any host saw something of; hosts that did not end normally are named.
        `host_states`: each host's view (state, reason, and `rtt_ns`, the round trip its clock offset was
        measured over: half of it is how far that host's corrected times may be off)."""
        index = NatIndex(self._conntrack)
        by_flow: dict[FlowTuple | _PairKey, list[tuple[Observation, int, bool]]] = {}
        for observation in self._observations:
            identity, position, reply = self._place(index, observation.flow)
            by_flow.setdefault(identity, []).append((observation, position, reply))
        states = host_states or {}
        missing = sorted((host, state) for host, state in states.items() if state.get("state") != "ended")
        uncertainty = {
            host: int(state["rtt_ns"]) // 2
            for host, state in states.items()
            if isinstance(state.get("rtt_ns"), int)
        }
        verdicts: list[dict[str, Any]] = []
        for identity, placed in by_flow.items():
            hops = self._hops(identity, placed, index)
            if not hops:
                continue
            name = self._flow_name(identity, [o for o, _, _ in placed])
            verdicts.append(flow_verdict(name, hops, self._app_view(index, identity), uncertainty, missing))
        verdicts.sort(key=lambda v: (_OUTCOME_ORDER.get(v["outcome"], 9), v["flow"]))
        return verdicts

    def _app_view(self, index: NatIndex, identity: FlowTuple | _PairKey) -> AppView | None:
        for flow, view in reversed(self._reports):  # the latest report of the flow
            if self._place(index, flow)[0] == identity:
                return view
        return None

    def _hops(
        self, identity: FlowTuple | _PairKey, placed: list[tuple[Observation, int, bool]], index: NatIndex
    ) -> list[Hop]:
        grouped = group_observations(placed)
        if not isinstance(identity, FlowTuple):
            return [hop for hop, _ in grouped]
        path = index.path(identity)

        def states_of(entry: ConntrackEntry) -> list[str]:
            return self._nat_states.get((entry.where, entry.original, entry.reply), [])

        grouped = skipped_nat_hops(path, grouped, self._invalid, states_of, self._where)
        grouped = reply_bypass_hops(path, grouped, self._where)
        hops = [hop for hop, _ in grouped]
        for number, nat in enumerate(path.hops):
            created = self._nat_times.get((nat.where, nat.entry.original, nat.entry.reply))
            what = nat.translation("->")
            older = "" if created is not None else " (entry older than the session)"
            hops.append(
                Hop(
                    host=nat.where,
                    event="nat",
                    what=what,
                    detail=f"{what} on {self._where(nat.where)}{older}",
                    time_ns=created,
                    exact=False,  # conntrack's NEW, read off a socket: never early, maybe late
                    position=number,
                    nat_number=number,
                )
            )
        return hops
