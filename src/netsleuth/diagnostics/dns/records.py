"""`dns`'s config and records: what a user asks for, and an answer joined with its query, a timeout (with the
drop behind it), an answer with no query, a dropped DNS packet, and the closing summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from netsleuth.spec.common import PacketConfig
from netsleuth.spec.configs import ConfigError
from netsleuth.spec.options import Opt, Port
from netsleuth.spec.parts import PodRef
from netsleuth.spec.records import Record, WallTime
from netsleuth.spec.scope import AddressText, NetnsField
from netsleuth.spec.summary import Summary

__all__ = [
    "TIMEOUT_RCODE",
    "DnsAnswer",
    "DnsConfig",
    "DnsDrop",
    "DnsQuery",
    "DnsRecord",
    "DnsRow",
    "DnsSummary",
    "DnsTimeout",
    "DnsUnmatched",
    "dns_drop",
    "drop_cause",
    "timeout_record",
]

TIMEOUT_RCODE = "TIMEOUT"  # --rcode TIMEOUT keeps timeouts when filtering by response code
_RCVBUF_REASONS = ("SOCKET_RCVBUFF", "UDP_RCVBUFF", "SOCKET_RCV_SHUTDOWN")

# -- config --------------------------------------------------------------------------------------------

# A name or a suffix (`example.com` keeps `www.example.com`): labels of 1 to 63 characters, 253 in all
# (254 with the root's dot).
DnsName = Annotated[
    str,
    Meta(
        pattern=r"^([^.]{1,63}\.)*[^.]{1,63}\.?$",
        max_length=254,
        extra={"words": "a DNS name (labels of 1 to 63 characters)"},
    ),
]
# A response code by name (NXDOMAIN, any case) or number, or TIMEOUT: checked in DnsConfig.check.
Rcode = str | Annotated[int, Meta(ge=0, le=15)]
Milliseconds = Annotated[float, Meta(ge=0, extra={"words": "a number of milliseconds, 0 or more"})]
TimeoutSeconds = Annotated[
    float, Meta(gt=0, le=3600, extra={"words": "a number of seconds over 0 and up to 3600"})
]


class DnsConfig(PacketConfig, frozen=True, kw_only=True):
    name: Annotated[tuple[DnsName, ...], Opt("only this name or names under it (repeatable)")] = ()
    rcode: Annotated[
        tuple[Rcode, ...],
        Opt(
            "only answers with this response code (NOERROR, NXDOMAIN, SERVFAIL, ...; TIMEOUT keeps timeouts; "
            "repeatable)",
            label="response code",
        ),
    ] = ()
    slow: Annotated[
        Milliseconds | None, Opt("only answers that took at least MS milliseconds", metavar="MS")
    ] = None
    timeout: Annotated[
        TimeoutSeconds,
        Opt("a query with no answer after this long is a timeout (default 5)", metavar="SECONDS"),
    ] = 5.0
    dns_port: Annotated[Port, Opt("the servers' DNS port (default 53)", label="DNS port", metavar="PORT")] = (
        53
    )

    def check(self) -> None:
        super().check()
        from netsleuth.diagnostics.dns.wire import rcode_number

        for given in self.rcode:
            if str(given).upper() != TIMEOUT_RCODE and rcode_number(str(given)) is None:
                raise ConfigError(
                    "rcode",
                    f"{given!r} is not a DNS response code (e.g. NOERROR, NXDOMAIN, SERVFAIL, REFUSED, a "
                    "number 0-15, or TIMEOUT)",
                    flag="--rcode",
                )

    def names(self) -> tuple[str, ...]:
        """--name as compared: lower case, without the root's dot."""
        return tuple(name.lower().rstrip(".") for name in self.name)

    def name_wanted(self, name: str | None) -> bool:
        if not self.name:
            return True
        if name is None:
            return False
        lowered = name.lower().rstrip(".")
        return any(lowered == wanted or lowered.endswith("." + wanted) for wanted in self.names())

    def rcode_numbers(self) -> frozenset[int]:
        """The response codes --rcode keeps (TIMEOUT is none: it keeps timeouts)."""
        from netsleuth.diagnostics.dns.wire import rcode_number

        numbers = (rcode_number(str(given)) for given in self.rcode if str(given).upper() != TIMEOUT_RCODE)
        return frozenset(number for number in numbers if number is not None)

    @property
    def filter_rcodes(self) -> bool:
        """--rcode given (maybe only TIMEOUT: then no answer is shown)."""
        return bool(self.rcode)

    @property
    def keep_timeouts(self) -> bool:
        """Timeouts are shown unless --rcode leaves TIMEOUT out."""
        return not self.rcode or any(str(given).upper() == TIMEOUT_RCODE for given in self.rcode)


# -- records -------------------------------------------------------------------------------------------


class DnsQuery(Record, frozen=True, kw_only=True):
    """Who asked what of whom: the keys an answer and a timeout share."""

    time: WallTime  # the query's first send
    pid: int | None
    comm: str
    owner: str  # how the process was found: "task" | "socket" | "kernel"
    container: str | None
    netns: NetnsField
    netns_name: str | None
    proto: str  # "udp" | "tcp"
    family: int
    client: AddressText  # "?" when the kernel could not read it
    client_port: int
    server: AddressText
    server_port: int
    id: int
    name: str
    qtype: str
    retransmits: int
    container_name: str | msgspec.UnsetType = msgspec.UNSET  # the runtime's name of `container` (CRI)
    pod: PodRef | msgspec.UnsetType = msgspec.UNSET  # the pod whose namespace asked


class DnsAnswer(DnsQuery, frozen=True, kw_only=True, tag="dns"):
    latency_ms: float
    rcode: str
    answer_count: int
    answers: tuple[str, ...]
    truncated: bool
    tcp_retry: bool  # a TCP query retrying a truncated UDP answer to the same process, name and type


def drop_cause(drop: DnsDrop, asker: tuple[int | None, str] | None = None) -> str:
    """A dropped DNS packet in words; `asker` (pid, comm) names the process when the socket's owner could not
    be (it had exited)."""
    where = f" (netns {drop.netns_name or drop.netns})"
    if drop.rule:
        return f'{drop.direction} dropped by firewall rule "{drop.rule}" ({drop.hook} hook){where}'
    if drop.reason in _RCVBUF_REASONS or "RCVBUF" in drop.reason:
        pid, comm = (drop.pid, drop.comm) if drop.pid or asker is None else asker
        who = f"{comm}[{pid}]" if pid else "the client"
        return f"{drop.direction} dropped: the receive buffer of {who} was full{where}"
    return f"{drop.direction} dropped by the kernel: {drop.reason} at {drop.location}{where}"


class DnsDrop(Record, frozen=True, kw_only=True, tag="dns_drop"):
    """A DNS packet the kernel dropped on this host, named (reason, place, rule, owner)."""

    time: WallTime
    direction: str  # "query" | "answer"
    reason: str
    location: str
    proto: str | None
    saddr: AddressText | None
    daddr: AddressText | None
    sport: int | None
    dport: int | None
    id: int | None
    name: str | None
    pid: int | None
    comm: str
    owner: str
    netns: NetnsField
    netns_name: str | None
    rule: str | None  # the firewall rule, when the reason is NETFILTER_DROP and it is found
    hook: str | None
    # The firewall matcher's own description of the rule (table, chain, rule number, backend...): free-form,
    # as each firewall backend words it.
    netfilter: dict[str, Any] | None
    cause: str  # drop_cause(): the drop in words


class DnsTimeout(DnsQuery, frozen=True, kw_only=True, tag="dns_timeout"):
    """No answer reached the process within --timeout: none came, or the kernel dropped it on the way."""

    waited_ms: float
    answer_arrived_ms: float | None  # the answer reached the socket after this long, then was dropped
    cause: str
    drop: DnsDrop | None  # the drop of this query or its answer on this host, when one was seen


class DnsUnmatched(Record, frozen=True, kw_only=True, tag="dns_unmatched"):
    """An answer for which no query was pending: asked before the trace started, or a late answer to a
    query already reported as a timeout (`late`)."""

    time: WallTime
    pid: int | None
    comm: str
    netns: NetnsField
    proto: str | None
    client: AddressText
    client_port: int
    server: AddressText
    id: int
    name: str | None
    rcode: str
    late: bool


DnsRecord = DnsAnswer | DnsTimeout | DnsUnmatched | DnsDrop


def dns_drop(**keys: Any) -> DnsDrop:
    """A DnsDrop of these keys (all but `cause`) with its cause in words."""
    drop = DnsDrop(**keys, cause="")
    return msgspec.structs.replace(drop, cause=drop_cause(drop))


def timeout_record(
    query: Mapping[str, Any], waited_ms: float, drop: DnsDrop | None, answer_arrived_ms: float | None
) -> DnsTimeout:
    """The timeout of a query (its DnsQuery keys), with the drop behind it when one was seen."""
    if drop is not None:
        cause = drop_cause(drop, (query["pid"], query["comm"]))
    else:
        cause = "no answer arrived on this host (lost on the way, or the server did not answer)"
    return DnsTimeout(
        **query,
        waited_ms=round(waited_ms, 3),
        answer_arrived_ms=None if answer_arrived_ms is None else round(answer_arrived_ms, 3),
        cause=cause,
        drop=drop,
    )


class DnsRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the summary: a process's queries to one server for one name suffix (summary.summary_rows).
    Latency percentiles are upper edges of the kernel's histogram buckets (at most 25 % high)."""

    pid: int | None
    comm: str
    server: str
    suffix: str
    queries: int
    answers: dict[str, int]  # by response code name
    timeouts: int
    truncated: int
    retransmits: int
    tcp_queries: int
    p50_ms: float | None
    p99_ms: float | None
    lookups: int  # queries of the names the application asked for
    search_expansions: int  # queries of search-list expansions, all answered NXDOMAIN
    amplification: float | None  # queries per lookup
    names: tuple[str, ...]  # the names asked for (the first 8)
    search_domains: tuple[str, ...]  # what the resolver appended to them: its search list as really used


class DnsSummary(Summary, frozen=True, kw_only=True, tag="summary"):
    filtered: int  # answers --rcode/--slow left out (not sampled: nothing is missing)
    queries: int
    answers: int
    unmatched: int
    untracked: int
    retransmits: int
    dns_drops: int
    timeouts: int
    rows: tuple[DnsRow, ...]
