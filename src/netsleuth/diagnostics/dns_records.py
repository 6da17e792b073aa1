"""The records of `dns`: an answer joined with its query, a timeout (with the drop behind it), an answer with
no query, a dropped DNS packet, and the closing summary. Frozen dataclasses; `to_json()` is declared in
netsleuth.diagnostics.dns_json and versioned in netsleuth.diagnostics.schema."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from netsleuth.diagnostics.attribution import Owner
from netsleuth.diagnostics.dns_summary import DnsSummaryRow
from netsleuth.diagnostics.schema import SCHEMA_VERSIONS
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.kernel.pods import Pod
from netsleuth.packet import PacketTuple

__all__ = [
    "DnsAnswer",
    "DnsDrop",
    "DnsQueryFacts",
    "DnsRecord",
    "DnsSummary",
    "DnsTimeout",
    "DnsTotals",
    "DnsUnmatched",
]


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class DnsQueryFacts:
    """Who asked what of whom: common to answers and timeouts."""

    time: float  # the query's first send, seconds since the epoch
    owner: Owner
    netns: int
    netns_name: str | None
    proto: str  # "udp" | "tcp"
    family: int
    client: str
    client_port: int
    server: str
    server_port: int
    id: int
    name: str
    qtype: str
    retransmits: int
    pod: Pod | None = None  # the Kubernetes pod whose network namespace asked

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "time": _iso(self.time),
            "pid": self.owner.pid,
            "comm": self.owner.comm,
            "owner": self.owner.source,
            "container": self.owner.container,
            "netns": self.netns,
            "netns_name": self.netns_name,
            "proto": self.proto,
            "family": self.family,
            "client": self.client,
            "client_port": self.client_port,
            "server": self.server,
            "server_port": self.server_port,
            "id": self.id,
            "name": self.name,
            "qtype": self.qtype,
            "retransmits": self.retransmits,
        }
        if self.owner.container_name:
            data["container_name"] = self.owner.container_name
        if self.pod is not None:
            data["pod"] = self.pod.to_json()
        return data


@dataclass(frozen=True)
class DnsDrop:
    """A DNS packet the kernel dropped on this host, named (reason, place, rule, owner)."""

    time: float
    direction: str  # "query" | "answer"
    reason: str
    location: str
    packet: PacketTuple
    id: int | None
    name: str | None
    owner: Owner
    netns: int
    netns_name: str | None
    rule: str | None  # the firewall rule, when the reason is NETFILTER_DROP and it is found
    hook: str | None
    netfilter: dict[str, Any] | None = None  # table, chain, rule number, backend (drops' matcher)

    def cause(self, asker: Owner | None = None) -> str:
        """In words; `asker` names the process when the socket's owner could not be (it had exited)."""
        where = f" (netns {self.netns_name or self.netns})"
        if self.rule:
            return f'{self.direction} dropped by firewall rule "{self.rule}" ({self.hook} hook){where}'
        if self.reason in ("SOCKET_RCVBUFF", "UDP_RCVBUFF", "SOCKET_RCV_SHUTDOWN") or "RCVBUF" in self.reason:
            owner = self.owner if self.owner.pid or asker is None else asker
            who = f"{owner.comm}[{owner.pid}]" if owner.pid else "the client"
            return f"{self.direction} dropped: the receive buffer of {who} was full{where}"
        return f"{self.direction} dropped by the kernel: {self.reason} at {self.location}{where}"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "dns_drop",
            "v": SCHEMA_VERSIONS["dns_drop"],
            "time": _iso(self.time),
            "direction": self.direction,
            "reason": self.reason,
            "location": self.location,
            "proto": self.packet.proto_name,
            "saddr": self.packet.saddr,
            "daddr": self.packet.daddr,
            "sport": self.packet.sport,
            "dport": self.packet.dport,
            "id": self.id,
            "name": self.name,
            "pid": self.owner.pid,
            "comm": self.owner.comm,
            "owner": self.owner.source,
            "netns": self.netns,
            "netns_name": self.netns_name,
            "rule": self.rule,
            "hook": self.hook,
            "netfilter": self.netfilter,
            "cause": self.cause(),
        }


@dataclass(frozen=True)
class DnsAnswer:
    query: DnsQueryFacts
    latency_ms: float
    rcode: str
    answer_count: int
    answers: tuple[str, ...]
    truncated: bool
    tcp_retry: bool  # a TCP query retrying a truncated UDP answer to the same process, name and type

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "dns",
            "v": SCHEMA_VERSIONS["dns"],
            **self.query.to_json(),
            "latency_ms": round(self.latency_ms, 3),
            "rcode": self.rcode,
            "answer_count": self.answer_count,
            "answers": list(self.answers),
            "truncated": self.truncated,
            "tcp_retry": self.tcp_retry,
        }


@dataclass(frozen=True)
class DnsTimeout:
    """No answer reached the process within --timeout: none came, or the kernel dropped it on the way."""

    query: DnsQueryFacts
    waited_ms: float
    drop: DnsDrop | None  # the drop of this query or its answer on this host, when one was seen
    answer_arrived_ms: float | None  # the answer reached the socket after this long, then was dropped

    @property
    def cause(self) -> str:
        if self.drop is not None:
            return self.drop.cause(self.query.owner)
        return "no answer arrived on this host (lost on the way, or the server did not answer)"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "dns_timeout",
            "v": SCHEMA_VERSIONS["dns_timeout"],
            **self.query.to_json(),
            "waited_ms": round(self.waited_ms, 3),
            "answer_arrived_ms": None if self.answer_arrived_ms is None else round(self.answer_arrived_ms, 3),
            "cause": self.cause,
            "drop": self.drop.to_json() if self.drop is not None else None,
        }


@dataclass(frozen=True)
class DnsUnmatched:
    """An answer for which no query was pending: asked before the trace started, or a late answer to a
    query already reported as a timeout (`late`)."""

    time: float
    owner: Owner
    netns: int
    proto: str
    client: str
    client_port: int
    server: str
    id: int
    name: str | None
    rcode: str
    late: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "dns_unmatched",
            "v": SCHEMA_VERSIONS["dns_unmatched"],
            "time": _iso(self.time),
            "pid": self.owner.pid,
            "comm": self.owner.comm,
            "netns": self.netns,
            "proto": self.proto,
            "client": self.client,
            "client_port": self.client_port,
            "server": self.server,
            "id": self.id,
            "name": self.name,
            "rcode": self.rcode,
            "late": self.late,
        }


@dataclass(frozen=True)
class DnsTotals:
    """The kernel's exact DNS counters (bpf/dns.h enum dns_stat) plus userspace's timeouts."""

    events: EventTotals
    queries: int
    answers: int
    unmatched: int
    untracked: int
    retransmits: int
    drops: int
    timeouts: int
    filtered: int = 0  # answers --rcode or --slow left out: counted, not missing

    def to_json(self) -> dict[str, Any]:
        return {
            **self.events.to_json(),
            "filtered": self.filtered,
            "queries": self.queries,
            "answers": self.answers,
            "unmatched": self.unmatched,
            "untracked": self.untracked,
            "retransmits": self.retransmits,
            "dns_drops": self.drops,
            "timeouts": self.timeouts,
        }


@dataclass(frozen=True)
class DnsSummary:
    totals: DnsTotals
    attach: str
    interrupted: bool
    rows: tuple[DnsSummaryRow, ...]
    clock: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "summary",
            "v": SCHEMA_VERSIONS["summary"],
            "diagnostic": "dns",
            **self.totals.to_json(),
            "attach": self.attach,
            "interrupted": self.interrupted,
            "clock": self.clock,
            "rows": [row.to_json() for row in self.rows],
        }


DnsRecord = DnsAnswer | DnsTimeout | DnsUnmatched | DnsDrop
