"""`conn`'s config and records: which connections a user asks for, and what each connection's report (its
timeline and verdict) and the run's summary read as. Every field is a key of today's JSON, computed when the
report is made (endpoint texts, errno names, the namespace's name); keys a record carries only sometimes are
UNSET.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from netsleuth.diagnostics.tcp.records import TcpConfig
from netsleuth.spec.configs import ConfigError
from netsleuth.spec.options import FILTERS, IpNetwork, Opt
from netsleuth.spec.records import Record, WallTime
from netsleuth.spec.scope import AddressText, NetnsLabels
from netsleuth.spec.summary import ClockPart, TotalsPart

if TYPE_CHECKING:
    from netsleuth.spec.scope import Scope

__all__ = [
    "ConnConfig",
    "ConnRecord",
    "ConnSummary",
    "FlowPart",
    "NatHopPart",
    "TimelineEntry",
    "split_endpoint",
]

# A server end as --dst takes it here: an address or CIDR, with the server's port if one is given.
ServerEnd = Annotated[
    str,
    Meta(min_length=1, extra={"words": "a server end: ADDR[/LEN], ADDR:PORT or [ADDR6]:PORT"}),
]

_PORT_WORDS = "is not a port: give a number from 1 to 65535"
_ADDRESS_WORDS = "is not an IP address or CIDR (e.g. 198.18.0.1, 198.18.0.0/15, 2001:db8::/32)"


def _port(text: str, endpoint: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= 65535:
        raise ConfigError("dst", f"{endpoint!r}: {text!r} {_PORT_WORDS}", flag="--dst")
    return int(text)


def split_endpoint(text: str) -> tuple[str, int | None]:
    """`198.18.0.2:80` / `[2001:db8::2]:80` -> (address, port); a bare address or prefix has no port."""
    if text.startswith("["):
        address, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError("dst", f"{text!r}: write an IPv6 endpoint as [ADDR]:PORT", flag="--dst")
        return address, _port(rest[1:], text) if rest else None
    if text.count(":") == 1:
        address, _, port = text.partition(":")
        return address, _port(port, text)
    return text, None


# -- config --------------------------------------------------------------------------------------------


class ConnConfig(TcpConfig, frozen=True, kw_only=True):
    """A socket's filters, where --dst names the server end and may carry its port; the tcp program is
    filtered by either end, the exact selection of connections is made in user space (session.py)."""

    # The kernel still sends every event (the verdicts need them): only the text leaves the timelines out.
    summary: Annotated[bool, Opt("print only each connection's verdict, not its timeline")] = False
    # A server end, not only an address: the type differs from the packet filters' `dst` (mypy's complaint),
    # the JSON key and the flag are the same.
    dst: Annotated[
        tuple[ServerEnd, ...],
        Opt(
            "the server end: an address or CIDR, and its port if any (198.18.0.2:80, [2001:db8::2]:443; "
            "repeatable)",
            label="server end",
            metavar="ADDR[:PORT]",
            group=FILTERS,
        ),
    ] = ()  # type: ignore[assignment]
    # Set by a fleet session (fleet/diagnostic_source.py for_the_fleet): also report, as their own records,
    # the drops and resets no connection here claimed - the connection's socket is on another host, and
    # the controller joins them with that host's report.
    report_unclaimed: bool = False
    # Set by a fleet task's scope (the spec's narrowing hook): the namespaces (inodes) and address ranges
    # the drop program and the NAT join are confined to. Empty: every namespace, by design - the drop that
    # kills a connection is often in another namespace (docs/conn.md).
    confined_netns: tuple[int, ...] = ()
    confined_networks: tuple[IpNetwork, ...] = ()

    def servers(self) -> tuple[tuple[IpNetwork, int | None], ...]:
        """Each --dst as (network, port or None)."""
        found = []
        for text in self.dst:
            address, port = split_endpoint(text)
            try:
                network = ipaddress.ip_network(address, strict=False)
            except ValueError:
                raise ConfigError("dst", f"{address!r} {_ADDRESS_WORDS}", flag="--dst") from None
            found.append((network, port))
        return tuple(found)

    def destinations(self) -> tuple[IpNetwork, ...]:
        return tuple(network for network, _ in self.servers())

    def server_port(self) -> int | None:
        """The server's port, from --dst or --dport (check() made sure they agree)."""
        ports = {port for _, port in self.servers() if port is not None}
        return next(iter(ports), None) or self.dport

    def check(self) -> None:
        super().check()
        ports = {port for _, port in self.servers() if port is not None}
        if len(ports) > 1:
            raise ConfigError(
                "dst", "endpoints with different ports cannot be combined: give one server port", flag="--dst"
            )
        if ports and self.dport is not None and self.dport not in ports:
            raise ConfigError("dport", "and the port in --dst disagree", flag="--dport")


# -- records -------------------------------------------------------------------------------------------


class FlowPart(msgspec.Struct, frozen=True, kw_only=True):
    """One direction of a flow, source > destination."""

    src: str
    sport: int
    dst: str
    dport: int


class NatHopPart(msgspec.Struct, frozen=True, kw_only=True):
    """One NAT on the connection's path, from conntrack (netsleuth.diagnostics.nat_join): the flow (client ->
    server direction) before and after it, and where it was read (`netns lb`)."""

    kind: str  # "DNAT", "SNAT", "DNAT+SNAT", "REDIRECT"
    where: str
    before: FlowPart
    after: FlowPart
    state: str | None  # conntrack's TCP state
    status: tuple[str, ...]  # IPS_* names without the prefix


class TimelineEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One event of a connection's timeline. `netns` is where it was seen, as its name (or inode as text);
    each kind of event carries its own keys (the rest are left out)."""

    time: WallTime
    event: str  # state | retransmit | synack_retransmit | drop | reset | abort | error | nat
    netns: str
    text: str
    old_state: str | UnsetType | None = UNSET  # state
    new_state: str | UnsetType | None = UNSET  # state
    kind: str | UnsetType = UNSET  # retransmit ("SYN", "tail loss probe"...); nat ("DNAT"...)
    state: str | UnsetType | None = UNSET  # retransmit: the socket's; nat: conntrack's
    errno: str | UnsetType = UNSET  # error, abort
    reason: str | UnsetType | None = UNSET  # drop: the drop reason; reset: the kernel's reset reason
    location: str | UnsetType = UNSET  # drop
    # drop: the firewall's hook, table, chain and rule, as drops words them (free-form there too).
    netfilter: dict[str, Any] | UnsetType | None = UNSET
    reason_inferred: bool | UnsetType = UNSET  # drop: the reason inferred from the location
    tcp_flags: str | UnsetType = UNSET  # drop (the fleet merge places a dropped RST after its reset)
    direction: str | UnsetType = UNSET  # reset
    cause_code: str | UnsetType = UNSET  # reset, abort
    where: str | UnsetType = UNSET  # nat
    before: FlowPart | UnsetType = UNSET  # nat
    after: FlowPart | UnsetType = UNSET  # nat
    status: tuple[str, ...] | UnsetType = UNSET  # nat


class ConnRecord(Record, frozen=True, kw_only=True, tag="conn"):
    """One finished (or, at the end, still running) connection: its endpoints and the namespaces of its
    sockets, what happened to it, its timeline oldest first, and the verdict. The owner's keys are there when
    the connecting process is known."""

    client: str  # "198.18.0.1:41234", "[2001:db8::1]:41234"
    server: str
    family: int
    saddr: AddressText
    sport: int
    daddr: AddressText
    dport: int
    client_netns: str | int | None  # the namespace's name, else its inode; None when no socket was seen
    server_netns: str | int | None
    established: bool
    connect_latency_ms: float | None
    duration_s: float
    syn_retransmits: int
    synack_retransmits: int
    retransmits: dict[str, int]  # by kind
    drops: int
    resets: int
    errno: str | None
    bytes_sent: int | None  # the client's bytes the server acked (tcpi_bytes_acked)
    bytes_received: int | None
    nat: tuple[NatHopPart, ...]
    outcome: str  # refused | timeout | abandoned | failed | pending | reset | closed | open
    verdict: str
    timeline: tuple[TimelineEntry, ...]
    pid: int | UnsetType | None = UNSET
    comm: str | UnsetType = UNSET
    owner: str | UnsetType = UNSET
    container: str | UnsetType | None = UNSET
    container_name: str | UnsetType = UNSET

    def narrowed(self, scope: Scope) -> tuple[ConnRecord | None, int]:
        """The report as it may leave a fleet task's scope (spec.scope.RecordScope.narrow): kept when one of
        its sockets is inside; the other end's namespace, and the timeline entries and NAT hops seen outside,
        are removed (its drop and reset counts with them), and the verdict - written from everything the
        tracker joined - says that parts were withheld. The second value: how many parts were removed."""
        labels = NetnsLabels(scope)
        ends = [labels.holds(self.client_netns), labels.holds(self.server_netns)]
        if True not in ends or not any(scope.holds_address(address) for address in (self.saddr, self.daddr)):
            return None, 0
        changes: dict[str, Any] = {}
        removed = 0
        for key, inside in zip(("client_netns", "server_netns"), ends, strict=True):
            if inside is False:
                changes[key] = None  # the other end's namespace is not this task's to name
                removed += 1
        kept = tuple(entry for entry in self.timeline if labels.holds(entry.netns) is not False)
        gone = [entry for entry in self.timeline if labels.holds(entry.netns) is False]
        for event, count in (("drop", "drops"), ("reset", "resets")):
            lost = sum(1 for entry in gone if entry.event == event)
            if lost:
                changes[count] = max(0, getattr(self, count) - lost)
        hops = tuple(hop for hop in self.nat if labels.holds(hop.where) is not False)
        removed += len(gone) + len(self.nat) - len(hops)
        if removed:
            changes["timeline"], changes["nat"] = kept, hops
            changes["verdict"] = (
                f"{self.outcome} (as seen inside this task's scope; {removed} out-of-scope part(s) withheld)"
            )
        return (msgspec.structs.replace(self, **changes) if changes else self), removed


class ConnSummary(Record, frozen=True, kw_only=True, tag="summary"):
    """The run's end. Not a spec.summary.Summary: its exact totals are per kind of tcp event (`events`) and
    of the drop program (`drops`), and its count is of connections by outcome."""

    diagnostic: str = "conn"
    connections: int
    outcomes: dict[str, int]
    events: dict[str, TotalsPart]  # "state", "retrans", "reset_sent"...
    drops: TotalsPart
    attach: str
    interrupted: bool
    clock: ClockPart
