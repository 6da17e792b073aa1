"""Join a flow's packets through NAT with conntrack's original <-> reply tuples. Pure: no I/O, no clock.

A conntrack entry records a flow twice (include/uapi/linux/netfilter/nf_conntrack_tuple_common.h,
`IP_CT_DIR_ORIGINAL`/`IP_CT_DIR_REPLY`): the *original* tuple as the first packet arrived, and the *reply*
tuple the answer is expected to carry. NAT rewrites the reply tuple (nf_nat_setup_info), so reading the reply
tuple backwards gives the original direction as it leaves the NAT:

    original  198.18.70.1:40000 > 198.18.70.2:80       (the client's connect())
    reply     198.18.71.2:8080  > 198.18.70.1:40000    (DNAT: what the server answers)
    translated 198.18.70.1:40000 > 198.18.71.2:8080    (= reply reversed: the SYN after the NAT)

DNAT shows as original.dst != reply.src, SNAT as original.src != reply.dst. Several NATs in a row (a client
behind one load balancer behind another, on one host or many) chain: one hop's translated tuple is the next
hop's original tuple. A packet seen anywhere on the path, in either direction, is placed on that chain.

Entries carry a `where` label chosen by whoever read them ("netns lb" on one host, "host b netns lb" in a
fleet): nothing here knows hosts or namespaces, so the single-host `conn` and the fleet's cross-host merge
call the same functions on entries collected wherever they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from netsleuth.packet import endpoint_text

__all__ = [
    "ConntrackEntry",
    "FlowTuple",
    "NatHop",
    "NatIndex",
    "NatPath",
    "Placement",
]

Endpoint = tuple[str, int]

# UAPI include/uapi/linux/netfilter/nf_conntrack_common.h enum ip_conntrack_status: bit -> name (no IPS_).
STATUS_BITS = (
    "EXPECTED",
    "SEEN_REPLY",
    "ASSURED",
    "CONFIRMED",
    "SRC_NAT",
    "DST_NAT",
    "SEQ_ADJUST",
    "SRC_NAT_DONE",
    "DST_NAT_DONE",
    "DYING",
    "FIXED_TIMEOUT",
    "TEMPLATE",
    "NAT_CLASH",
    "HELPER",
    "OFFLOAD",
    "HW_OFFLOAD",
)


def status_names(status: int) -> tuple[str, ...]:
    return tuple(name for bit, name in enumerate(STATUS_BITS) if status & (1 << bit))


@dataclass(frozen=True)
class FlowTuple:
    """One direction of a flow: proto ("tcp", "udp", ...) and source > destination."""

    proto: str
    src: Endpoint
    dst: Endpoint

    def reversed(self) -> FlowTuple:
        return FlowTuple(self.proto, self.dst, self.src)

    @property
    def pair(self) -> frozenset[Endpoint]:
        """Both ends, unordered: how `conn` keys a connection whichever side reports it."""
        return frozenset((self.src, self.dst))

    def text(self) -> str:
        return f"{endpoint_text(*self.src)} > {endpoint_text(*self.dst)}"

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src[0], "sport": self.src[1], "dst": self.dst[0], "dport": self.dst[1]}

    @classmethod
    def from_json(cls, proto: str, raw: Mapping[str, Any]) -> FlowTuple | None:
        try:
            src = (str(raw["src"]), int(raw["sport"]))
            dst = (str(raw["dst"]), int(raw["dport"]))
        except (KeyError, TypeError, ValueError):
            return None
        return cls(proto, src, dst)


@dataclass(frozen=True)
class ConntrackEntry:
    """One conntrack entry and where it was read."""

    where: str
    original: FlowTuple
    reply: FlowTuple
    family: int = 4
    state: str | None = None  # the TCP conntrack state ("SYN_SENT"), None for other protocols
    status: tuple[str, ...] = ()  # IPS_* names without the prefix
    mark: int = 0

    @property
    def translated(self) -> FlowTuple:
        """The original direction as it leaves this NAT."""
        return self.reply.reversed()

    @property
    def dnat(self) -> bool:
        return self.original.dst != self.reply.src

    @property
    def snat(self) -> bool:
        return self.original.src != self.reply.dst

    @property
    def is_nat(self) -> bool:
        return self.dnat or self.snat

    @property
    def redirect(self) -> bool:
        """A DNAT that keeps the address and changes only the port: what `-j REDIRECT` (and nftables
        `redirect`) make - the packet goes to this host itself, to another port (a sidecar's capture)."""
        return self.dnat and not self.snat and self.reply.src[0] == self.original.dst[0]

    def to_record(self, netns: str, time: str) -> dict[str, Any]:
        """The fleet's `conntrack` record, shipped beside a session's records (docs/fleet-api.md)."""
        return {
            "type": "conntrack",
            "v": 1,
            "time": time,
            "netns": netns,
            "family": self.family,
            "proto": self.original.proto,
            "state": self.state,
            "orig": self.original.to_json(),
            "reply": self.reply.to_json(),
            "status": list(self.status),
            "mark": self.mark,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any], where: str) -> ConntrackEntry | None:
        """An entry from a `conntrack` record (as `to_record` writes it); None when a tuple is incomplete."""
        proto = str(record.get("proto") or "tcp")
        original = FlowTuple.from_json(proto, record.get("orig") or {})
        reply = FlowTuple.from_json(proto, record.get("reply") or {})
        if original is None or reply is None:
            return None
        state, status = record.get("state"), record.get("status") or ()
        return cls(
            where=where,
            original=original,
            reply=reply,
            family=int(record.get("family") or (6 if ":" in original.src[0] else 4)),
            state=state if isinstance(state, str) else None,
            status=tuple(str(name) for name in status),
            mark=int(record.get("mark") or 0),
        )


@dataclass(frozen=True)
class NatHop:
    """One translation on the path: the flow (client -> server direction) before and after it."""

    entry: ConntrackEntry
    before: FlowTuple
    after: FlowTuple

    @property
    def where(self) -> str:
        return self.entry.where

    @property
    def kind(self) -> str:
        if self.entry.redirect:
            return "REDIRECT"
        kinds = [name for name, changed in (("DNAT", self.entry.dnat), ("SNAT", self.entry.snat)) if changed]
        return "+".join(kinds)

    def translation(self, arrow: str = "→") -> str:
        """`DNAT 198.18.70.2:80 → 198.18.71.2:8080`, `REDIRECT 198.18.2.7:9000 → :15006`."""
        if self.entry.redirect:
            return f"REDIRECT {endpoint_text(*self.before.dst)} {arrow} :{self.after.dst[1]}"
        parts = []
        if self.entry.dnat:
            parts.append(f"DNAT {endpoint_text(*self.before.dst)} {arrow} {endpoint_text(*self.after.dst)}")
        if self.entry.snat:
            parts.append(f"SNAT {endpoint_text(*self.before.src)} {arrow} {endpoint_text(*self.after.src)}")
        return ", ".join(parts)

    def text(self) -> str:
        """`DNAT 198.18.70.2:80 → 198.18.71.2:8080 in netns lb`."""
        return f"{self.translation()} in {self.where}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "where": self.where,
            "before": self.before.to_json(),
            "after": self.after.to_json(),
            "state": self.entry.state,
            "status": list(self.entry.status),
        }


@dataclass(frozen=True)
class NatPath:
    """A flow from the client's original tuple through every NAT that was found, in path order."""

    original: FlowTuple
    hops: tuple[NatHop, ...] = ()

    @property
    def forms(self) -> tuple[FlowTuple, ...]:
        """The flow's tuple before the first NAT, then after each (client -> server direction)."""
        return (self.original, *(hop.after for hop in self.hops))

    def text(self, upto: int | None = None) -> str:
        """`DNAT ... in netns lb, then SNAT ... in netns gw` for the first `upto` hops (all by default)."""
        return ", then ".join(hop.text() for hop in self.hops[:upto])


@dataclass(frozen=True)
class Placement:
    """Where a packet sits on its flow's NAT path: after `position` hops (0: as the client sent it), and
    whether it travelled the reply direction (server -> client)."""

    path: NatPath
    position: int
    reply: bool

    @property
    def translated(self) -> bool:
        return self.position > 0


@dataclass
class NatIndex:
    """The entries of one or many namespaces/hosts, indexed by the tuples a NAT hop starts and ends with.

    Entries that translate nothing (a plain tracked flow) are left out: they join nothing. When several
    entries claim the same tuple (the same addresses reused on two hosts), the first by `where` wins, so the
    answer does not depend on the order entries were collected in.
    """

    entries: Iterable[ConntrackEntry]
    _by_original: dict[FlowTuple, ConntrackEntry] = field(init=False, default_factory=dict)
    _by_translated: dict[FlowTuple, ConntrackEntry] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        nat = sorted((entry for entry in self.entries if entry.is_nat), key=lambda entry: entry.where)
        self.entries = tuple(nat)
        for entry in nat:
            self._by_original.setdefault(entry.original, entry)
            self._by_translated.setdefault(entry.translated, entry)

    def __len__(self) -> int:
        return len(self._by_original)

    def upstream(self, flow: FlowTuple) -> FlowTuple:
        """The client's original tuple of a flow seen (client -> server direction) somewhere downstream."""
        seen = {flow}
        while (entry := self._by_translated.get(flow)) is not None and entry.original not in seen:
            flow = entry.original
            seen.add(flow)
        return flow

    def path(self, original: FlowTuple) -> NatPath:
        """Every NAT hop from the client's original tuple on (client -> server direction)."""
        hops: list[NatHop] = []
        flow, seen = original, {original}
        while (entry := self._by_original.get(flow)) is not None and entry.translated not in seen:
            hops.append(NatHop(entry, flow, entry.translated))
            flow = entry.translated
            seen.add(flow)
        return NatPath(original, tuple(hops))

    def place(self, packet: FlowTuple) -> Placement | None:
        """Where a packet seen anywhere belongs: its flow's path and its position on it. None when no NAT
        touches it (its tuple is then the flow's own, and needs no join)."""
        for reply, forward in ((False, packet), (True, packet.reversed())):
            origin = self.upstream(forward)
            path = self.path(origin)
            if path.hops and forward in path.forms:
                return Placement(path, path.forms.index(forward), reply)
        return None
