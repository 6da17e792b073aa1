"""The tcp family's configs and records (bpf/tcp.bpf.c serves them all): what a user asks `resets` and
`tcp life|states|retrans|connlat|queues` for, and what each reset, abort, connection, state change,
retransmit, connect and queue drop reads as. Every field is a key of today's JSON, computed when the record
is built (errno names, flag words, the owner's words); keys a record carries only sometimes are UNSET.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from netsleuth.diagnostics.attribution import Owner, owner_json
from netsleuth.packet import endpoint_text as packet_endpoint_text
from netsleuth.spec.common import SocketConfig
from netsleuth.spec.configs import ConfigError
from netsleuth.spec.options import Opt
from netsleuth.spec.parts import PodRef
from netsleuth.spec.records import Record, WallTime
from netsleuth.spec.scope import AddressField, NetnsField
from netsleuth.spec.summary import Summary, TotalsPart

__all__ = [
    "AbortRecord",
    "ConnectRecord",
    "ConntrackView",
    "LifeRecord",
    "QueueRecord",
    "ResetGroup",
    "ResetRecord",
    "ResetsConfig",
    "ResetsSummary",
    "RetransRecord",
    "StateRecord",
    "TcpConfig",
    "TcpGroup",
    "TcpRecord",
    "TcpSummary",
    "TriggerPart",
    "endpoint_text",
    "owner_fields",
]


def endpoint_text(address: str | None, port: int | None) -> str:
    """A socket's endpoint as packet.endpoint_text writes it, with `*:80` for an unbound (wildcard) address:
    on a socket 0.0.0.0 means "any", which a packet's address never does."""
    if address is not None and port is not None and address in ("0.0.0.0", "::"):
        return f"*:{port}"
    return packet_endpoint_text(address, port)


def owner_fields(owner: Owner) -> dict[str, Any]:
    """The owner as a record's fields (pid, comm, owner, container and, when known, container_name):
    `ResetRecord(**owner_fields(owner), ...)`."""
    return dict(owner_json(owner))


# -- configs -------------------------------------------------------------------------------------------


class TcpConfig(SocketConfig, frozen=True, kw_only=True):
    """A socket's filters: TCP events belong to sockets, so there is no interface to filter by."""

    def check(self) -> None:
        super().check()
        if self.proto not in (None, "tcp", 6):
            raise ConfigError("proto", "can only be tcp: this command traces TCP", flag="--proto")


class ResetsConfig(TcpConfig, frozen=True, kw_only=True):
    stack: Annotated[bool, Opt("print the kernel stack of each reset")] = False

    def check(self) -> None:
        super().check()
        if self.summary and self.stack:
            raise ConfigError(
                "stack", "needs individual resets: it cannot be combined with --summary", flag="--stack"
            )


# -- parts every record of the family shares -----------------------------------------------------------


class _Owned(Record, frozen=True, kw_only=True):
    """Who the event belongs to (netsleuth.diagnostics.attribution), as the JSON spells it."""

    pid: int | None
    comm: str
    owner: str  # "task" | "socket" | "kernel"
    container: str | None
    container_name: str | UnsetType = UNSET  # the container runtime's name for `container` (CRI)

    @property
    def owner_info(self) -> Owner:
        name = self.container_name if isinstance(self.container_name, str) else None
        return Owner(self.pid, self.comm, self.owner, self.container, name)


class TriggerPart(msgspec.Struct, frozen=True, kw_only=True):
    """The TCP segment an RST answered (or, for a firewall's RST, the one it rejected)."""

    flags: str  # "SYN", "ACK|PSH"...
    seq: int
    ack: int
    len: int
    inferred: bool | UnsetType = UNSET  # reconstructed from a firewall's RST, not read from the packet


class ConntrackView(msgspec.Struct, frozen=True):
    """conntrack in one namespace: loaded or not, the `invalid` counter (/proc/net/stat/nf_conntrack, summed
    over CPUs), its growth since the trace started, and nf_conntrack_tcp_be_liberal."""

    loaded: bool
    invalid: int | None = None
    invalid_delta: int | None = None
    be_liberal: int | None = None

    def text(self) -> str:
        if not self.loaded:
            return "conntrack is not loaded there"
        delta = f" (+{self.invalid_delta} during this trace)" if self.invalid_delta is not None else ""
        return f"conntrack invalid={self.invalid}{delta}, nf_conntrack_tcp_be_liberal={self.be_liberal}"


# -- resets --------------------------------------------------------------------------------------------


class ResetRecord(_Owned, frozen=True, kw_only=True, tag="reset"):
    """One RST sent (by the TCP stack or a firewall's REJECT) or received, with its cause in plain words."""

    time: WallTime
    direction: str  # "sent" | "received"
    by_firewall: bool
    state: str | None  # the socket's state; None: no socket
    reason: str | None  # the kernel's reset reason (None: this kernel gives none, before 6.10)
    reason_code: int | None
    trigger: TriggerPart | None  # None for an active reset (the socket aborted)
    cause: str
    cause_code: str  # netsleuth.diagnostics.causes
    check: str
    family: int
    proto: Literal["tcp"] = "tcp"
    saddr: AddressField  # the RST packet: from saddr:sport to daddr:dport
    sport: int
    daddr: AddressField
    dport: int
    local: str  # this side's endpoint, as text
    remote: str
    netns: NetnsField
    netns_name: str | None
    ifname: str | None
    side: str | None  # "client" (connect) | "server" (accepted)
    age_s: float | None  # since the connection started; None when it is older than the trace
    unread: int
    unsent: int
    linger_zero: bool
    # A firewall's RST: the netfilter hook, table, chain and rule (free-form: the rule's own details).
    netfilter: dict[str, Any] | UnsetType = UNSET
    conntrack: ConntrackView | UnsetType = UNSET  # an RST a listener sent for a non-SYN segment
    peer_cause: str | UnsetType = UNSET  # the cause the sending side's record gave, traced here too
    stack: tuple[str, ...] | UnsetType = UNSET  # --stack
    pod: PodRef | UnsetType = UNSET


class AbortRecord(_Owned, frozen=True, kw_only=True, tag="abort"):
    """A connection the kernel ended with an error and no RST (a retransmission or connect timeout...)."""

    time: WallTime
    direction: Literal["none"] = "none"
    errno: str  # "ETIMEDOUT"
    state: str | None  # the state that failed
    cause: str
    cause_code: str
    check: str
    family: int
    proto: Literal["tcp"] = "tcp"
    saddr: AddressField  # this side
    sport: int
    daddr: AddressField
    dport: int
    local: str
    remote: str
    retransmits: int
    netns: NetnsField
    netns_name: str | None
    side: str | None
    pod: PodRef | UnsetType = UNSET


class ResetGroup(msgspec.Struct, frozen=True, kw_only=True):
    """Exact kernel count of resets of one kind (direction, state, reason, local endpoint, netns)."""

    count: int
    example: ResetRecord | AbortRecord


class ResetsSummary(Summary, frozen=True, kw_only=True, tag="summary"):
    # The summary's own totals are the three kinds' sum; aborts come without an RST and are not in them.
    sent: TotalsPart  # by the TCP stack
    received: TotalsPart
    firewall: TotalsPart  # by REJECT rules
    aborts: int
    groups: tuple[ResetGroup, ...]


# -- tcp life | states | retrans | connlat | queues ------------------------------------------------------


class _TcpEvent(_Owned, frozen=True, kw_only=True):
    time: WallTime
    family: int
    proto: Literal["tcp"] = "tcp"
    saddr: AddressField  # this side
    sport: int
    daddr: AddressField
    dport: int
    netns: NetnsField
    netns_name: str | None
    pod: PodRef | UnsetType = UNSET


class LifeRecord(_TcpEvent, frozen=True, kw_only=True, tag="life"):
    """A connection's whole life, when it reaches CLOSE (like tcplife)."""

    side: str | None
    duration_s: float
    bytes_acked: int  # tcpi_bytes_acked: sequence space, SYN and FIN count one each
    bytes_received: int
    last_state: str | None
    born_before_trace: bool | UnsetType = UNSET  # opened before the trace: duration_s is a lower bound


class StateRecord(_TcpEvent, frozen=True, kw_only=True, tag="state"):
    """One TCP state change (like tcpstates)."""

    old_state: str | None
    new_state: str | None
    previous_state_s: float | None  # time spent in old_state; None when its start was not seen
    errno: str | None
    side: str | None


class RetransRecord(_TcpEvent, frozen=True, kw_only=True, tag="retrans"):
    """One retransmitted skb (like tcpretrans); TCP sends GSO skbs, so it may be several segments."""

    kind: str  # syn | synack | tlp | timeout | fast | other
    state: str | None
    flow_count: int  # retransmits of this flow seen so far in this run
    congestion_state: str | None
    segments: int
    synack_retransmits: int | UnsetType = UNSET  # a SYN-ACK's
    total_retrans: int | UnsetType = UNSET  # the others': the socket's counters
    srtt_us: int | UnsetType = UNSET
    cwnd: int | UnsetType = UNSET
    unanswered: int | UnsetType = UNSET
    error: int | UnsetType | None = UNSET


class ConnectRecord(_TcpEvent, frozen=True, kw_only=True, tag="connect"):
    """connect() to ESTABLISHED, or its failure (like tcpconnlat)."""

    latency_ms: float
    ok: bool
    errno: str | None


class QueueRecord(_TcpEvent, frozen=True, kw_only=True, tag="queue"):
    """An accept-queue overflow, or a receive-buffer, backlog or memory drop, with its owner and check."""

    what: str  # accept_queue_overflow | listen_drop | receive_buffer | socket_backlog | memory | ...
    reason: str | None  # the drop reason, when a drop
    state: str | None
    text: str
    check: str
    cause_code: str | None  # netsleuth.diagnostics.causes
    queued: int
    limit: int
    backlog: int | UnsetType = UNSET  # a listener's: its listen() backlog, somaxconn and SYN queue
    somaxconn: int | UnsetType | None = UNSET
    syn_queue: int | UnsetType = UNSET
    tcp_flags: str | UnsetType = UNSET  # the segment dropped, when known


TcpRecord = LifeRecord | StateRecord | RetransRecord | ConnectRecord | QueueRecord


class TcpGroup(msgspec.Struct, frozen=True, kw_only=True):
    """An exact in-kernel count of one kind of event, with what the kernel summed for it and an example."""

    count: int
    example: TcpRecord
    mean_duration_s: float | UnsetType = UNSET  # life
    max_duration_s: float | UnsetType = UNSET
    bytes_acked: int | UnsetType = UNSET
    bytes_received: int | UnsetType = UNSET
    mean_latency_ms: float | UnsetType = UNSET  # connlat
    max_latency_ms: float | UnsetType = UNSET
    mean_previous_state_s: float | UnsetType = UNSET  # states
    segments: int | UnsetType = UNSET  # retrans: segments (count is skbs); TcpRetransSegs counts segments


class TcpSummary(Summary, frozen=True, kw_only=True, tag="summary"):
    subcommand: str  # life | states | retrans | connlat | queues
    groups: tuple[TcpGroup, ...]
    netstat: dict[str, int] | UnsetType = UNSET  # queues: TcpExt counters' growth during the trace
    segments: int | UnsetType = UNSET  # retrans: retransmitted segments over every group
