"""The tcp BPF object (bpf/tcp.bpf.c) in a session: choose programs, configure, load, attach, read.

Shared by `resets`, `tcp ...`, `conn` and `diagnose`: each asks for the event kinds it wants emitted, grouped
(--summary) or given a stack, and gets `RawTcpEvent`s, exact per-kind totals and groups back. Names (states,
reasons, owners) are attached by the enrichers (resets.py, events.py), not here.
"""

from __future__ import annotations

import ctypes
import functools
import ipaddress
import socket
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from netsleuth._generated.tcp_abi import (
    STAT_COUNT,
    TCP_NO_STATE,
    TCP_STACK_RANGES,
    EventKind,
    RetransKind,
    SockFlag,
    TcpConfigC,
    TcpEventC,
    TcpGroupC,
    TcpGroupKeyC,
    TcpMaps,
    TcpObject,
    TcpRangeC,
    TcpRodata,
)
from netsleuth.bpf.btf import Btf
from netsleuth.bpf.errors import BpfError
from netsleuth.bpf.features import require_tracing
from netsleuth.bpf.program_session import (
    TP_BTF_THEN_RAW_TP,
    PerfFallback,
    ProgramBacked,
    ProgramSession,
    Variant,
)
from netsleuth.bpf.skeleton import Skeleton, variant_programs
from netsleuth.diagnostics.filter_maps import OwnerInodeSync, fill_address_maps, fill_filter_config
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.diagnostics.tcp_existing import ExistingSockets, seed_existing_sockets
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError
from netsleuth.kernel.kallsyms import Kallsyms, default_kallsyms
from netsleuth.kernel.kconfig import thread_size
from netsleuth.kernel.netns import NetnsNames
from netsleuth.kernel.reasons import DropReasons

__all__ = [
    "RESET_KINDS",
    "KindTotals",
    "RawTcpEvent",
    "RawTcpGroup",
    "TcpSession",
    "TcpSessionConfig",
    "Trigger",
    "decode_event",
    "decode_record",
]

_EVENT_SIZE = ctypes.sizeof(TcpEventC)
_MODULE_CHECK_S = 2.0

# Which program serves each kind (tcp.bpf.c TCP_ENTRY names, without the _b/_r variant suffix).
_PROGRAM_OF: dict[EventKind, tuple[str, ...]] = {
    EventKind.RESET_SENT: ("nst_rst_sent",),
    EventKind.RESET_RECEIVED: ("nst_rst_recv",),
    EventKind.RESET_FIREWALL: ("nst_rst_fw",),
    EventKind.STATE: ("nst_state",),
    EventKind.LIFE: ("nst_state",),
    EventKind.CONNECT: ("nst_state",),
    EventKind.RETRANS: ("nst_retrans",),
    EventKind.SYNACK_RETRANS: ("nst_synack",),
    EventKind.ERROR: ("nst_error",),
    EventKind.SOCK_DROP: ("nst_skdrop", "nst_synq"),
    EventKind.RCVQ_FULL: ("nst_rcvq",),
    EventKind.MEM_LIMIT: ("nst_memlim",),
}
# The kinds that are a TCP reset: sent by the stack, received, sent by a firewall's REJECT.
RESET_KINDS = frozenset({EventKind.RESET_SENT, EventKind.RESET_RECEIVED, EventKind.RESET_FIREWALL})
_ALL_PROGRAMS = variant_programs(
    TcpObject,
    tuple(dict.fromkeys(name for names in _PROGRAM_OF.values() for name in names)),
    [variant.suffix for variant in TP_BTF_THEN_RAW_TP],
)

# The code that builds a firewall's TCP reset (net/ipv4/netfilter/nf_reject_ipv4.c, net/ipv6/netfilter/
# nf_reject_ipv6.c) and the modules it lives in when not built in.
_REJECT_FUNCTIONS = (("nf_send_reset", "nf_reject_ipv4"), ("nf_send_reset6", "nf_reject_ipv6"))
# Drop reasons that mean "a socket's queue or memory had no room" (include/net/dropreason-core.h).
QUEUE_DROP_REASONS = (
    "TCP_LISTEN_OVERFLOW",
    "SOCKET_RCVBUFF",
    "SOCKET_BACKLOG",
    "PROTO_MEM",
    "TCP_OFO_DROP",
    "TCP_OFO_QUEUE_PRUNE",
    "TCP_ZEROWINDOW",
)


@dataclass(frozen=True)
class TcpSessionConfig:
    packet_filter: PacketFilter = field(default_factory=PacketFilter)
    emit: frozenset[EventKind] = frozenset()
    group: frozenset[EventKind] = frozenset()
    stack: frozenset[EventKind] = frozenset()
    sample_every: int = 1
    group_flows: bool = False
    track_states: bool = True  # attach the state tracker for sides, ages and owners
    # Events through a perf buffer instead of the ring buffer: None = only when the kernel has no ring
    # buffers (< 5.8); True forces it (tests of that path on a newer kernel).
    perf_buffer: bool | None = None

    def __post_init__(self) -> None:
        if self.sample_every < 1:
            raise UsageError("--sample must be 1 (every event) or more")

    @property
    def kinds(self) -> frozenset[EventKind]:
        return self.emit | self.group


@dataclass(frozen=True)
class Trigger:
    """A TCP segment's header: the one an RST answered, or a firewall's RST itself."""

    flags: int
    seq: int
    ack: int
    length: int


class RawTcpEvent(NamedTuple):
    """One kernel event, decoded, before names are attached. A NamedTuple rather than a frozen dataclass:
    at storm rates its construction cost (a third of a dataclass's) is most of decoding."""

    kind: EventKind
    monotonic_ns: int
    sk: int
    sock_ino: int
    born_ns: int
    value1: int
    value2: int
    value3: int
    netns: int
    pid: int
    tid: int
    in_task: bool
    kthread: bool
    comm: str
    owner_pid: int
    owner_comm: str
    reason: int
    family: int
    laddr: str | None
    raddr: str | None
    lport: int
    rport: int
    state: int | None
    old_state: int | None
    trigger: Trigger | None
    side: str | None  # "client" (connect) | "server" (accepted) | None
    ca_state: int
    retransmits: int
    sock_flags: SockFlag
    retrans_kind: RetransKind
    unread: int
    unsent: int
    backlog: int
    max_backlog: int
    syn_queue: int
    ifindex: int
    ifname: str
    cpu: int
    frames: tuple[int, ...] = ()
    segs: int = 0  # RETRANS: segments the skb went out as (TcpRetransSegs counts these); SYNACK_RETRANS: 1
    # The socket existed before the trace (tcp_existing): born_ns is the trace's start, its age a lower bound.
    born_before_trace: bool = False


# One kind's counters (bpf/tcp.h), the same six as every program's.
KindTotals = EventTotals


@dataclass(frozen=True)
class RawTcpGroup:
    kind: EventKind
    count: int
    sum1: int
    sum2: int
    sum3: int
    max1: int
    example: RawTcpEvent
    segs: int = 0  # retransmitted segments of the group's events


@functools.lru_cache(maxsize=4096)
def _address(family: int, raw: bytes) -> str | None:
    """Text of an address; cached, since a storm repeats the same few addresses."""
    if family == 4:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    if family == 6:
        return str(ipaddress.IPv6Address(raw[:16]))  # the compressed form Python's ipaddress also prints
    return None


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def _struct_format(mirror: type[ctypes.Structure]) -> struct.Struct:
    """A struct.Struct reading the same bytes as a ctypes mirror, derived from its fields (one definition).
    Unpacking a whole record at once is several times faster than reading ctypes attributes one by one,
    which matters at the event rates a connect storm produces."""
    codes = {
        ctypes.c_uint64: "Q",
        ctypes.c_uint32: "I",
        ctypes.c_uint16: "H",
        ctypes.c_uint8: "B",
    }
    parts = []
    for _name, field_type in mirror._fields_:  # type: ignore[misc]
        if field_type in codes:
            parts.append(codes[field_type])
        else:  # u8 and char arrays: bytes
            parts.append(f"{ctypes.sizeof(field_type)}s")
    compiled = struct.Struct("<" + "".join(parts))
    if compiled.size != ctypes.sizeof(mirror):
        raise AssertionError(f"{mirror.__name__} has padding the struct format does not model")
    return compiled


_EVENT_FORMAT = _struct_format(TcpEventC)
_FIELD_INDEX = {name: index for index, (name, _type) in enumerate(TcpEventC._fields_)}
_KINDS = {kind.value: kind for kind in EventKind}
_RETRANS_KINDS = {kind.value: kind for kind in RetransKind}
_SIDES = {1: "client", 2: "server"}


@functools.lru_cache(maxsize=256)
def _sock_flags(value: int) -> SockFlag:
    return SockFlag(value)


def _decode(values: tuple[Any, ...], frames: tuple[int, ...]) -> RawTcpEvent:
    (
        time_ns, sk, sock_ino, born_ns, value1, value2, value3,
        netns, pid, tid, owner_pid, reason, seq, ack, unread, unsent, backlog, max_backlog, syn_queue,
        ifindex, cpu, lport, rport, payload_len, _nr_frames, laddr, raddr,
        kind, family, state, old_state, tcp_flags, has_trigger, side, ca_state, retransmits, sock_flags,
        retrans_kind, in_task, kthread, _pad, segs, comm, owner_comm, ifname,
    ) = values  # fmt: skip
    return RawTcpEvent(
        kind=_KINDS[kind],
        monotonic_ns=time_ns,
        sk=sk,
        sock_ino=sock_ino,
        born_ns=born_ns,
        value1=value1,
        value2=value2,
        value3=value3,
        netns=netns,
        pid=pid,
        tid=tid,
        in_task=bool(in_task),
        kthread=bool(kthread),
        comm=_text(comm) if in_task else "",
        owner_pid=owner_pid,
        owner_comm=_text(owner_comm),
        reason=reason,
        family=family,
        laddr=_address(family, laddr),
        raddr=_address(family, raddr),
        lport=lport,
        rport=rport,
        state=None if state == TCP_NO_STATE else state,
        old_state=None if old_state == TCP_NO_STATE else old_state,
        trigger=Trigger(tcp_flags, seq, ack, payload_len) if has_trigger else None,
        side=_SIDES.get(side),
        ca_state=ca_state,
        retransmits=retransmits,
        sock_flags=_sock_flags(sock_flags),
        retrans_kind=_RETRANS_KINDS.get(retrans_kind, RetransKind.OTHER),
        unread=unread,
        unsent=unsent,
        backlog=backlog,
        max_backlog=max_backlog,
        syn_queue=syn_queue,
        ifindex=ifindex,
        ifname=_text(ifname),
        cpu=cpu,
        frames=frames,
        segs=segs,
    )


def decode_event(event: TcpEventC, frames: tuple[int, ...] = ()) -> RawTcpEvent:
    return _decode(_EVENT_FORMAT.unpack(bytes(event)), frames)


def decode_record(record: bytes) -> RawTcpEvent:
    """A ring-buffer record: struct tcp_event, then nr_frames u64 kernel addresses."""
    values = _EVENT_FORMAT.unpack_from(record)
    count = values[_NR_FRAMES]
    frames = struct.unpack_from(f"<{count}Q", record, _EVENT_SIZE) if count else ()
    return _decode(values, frames)


_NR_FRAMES = _FIELD_INDEX["nr_frames"]


def _symbol_range(kallsyms: Kallsyms, name: str, module: str | None) -> tuple[int, int] | None:
    symbols = kallsyms.symbols_named(name) or (kallsyms.symbols_named(name, module) if module else [])
    for symbol in symbols:
        if symbol.size:
            return symbol.address, symbol.address + symbol.size
    return None


class TcpSession(ProgramBacked):
    """A live tcp trace. Use as a context manager; `start()` attaches, `close()` detaches everything."""

    def __init__(
        self,
        config: TcpSessionConfig,
        drop_reasons: DropReasons | None = None,
        kallsyms: Kallsyms | None = None,
        modules_path: Path = Path("/proc/modules"),
        variants: Sequence[Variant] = TP_BTF_THEN_RAW_TP,
    ) -> None:
        self.config = config
        self.drop_reasons = drop_reasons
        self.kallsyms = kallsyms or default_kallsyms()
        self._modules_path = modules_path
        self._programs = ProgramSession(
            TcpObject,
            _ALL_PROGRAMS,
            variants=variants,
            mirrors=(("tcp_event", TcpEventC), ("tcp_group", TcpGroupC), ("tcp_group_key", TcpGroupKeyC)),
        )
        self._owners = OwnerInodeSync(config.packet_filter)
        self.existing = ExistingSockets()  # sockets older than the trace, once started
        self.buffer = "ring"  # or "perf": where events travel (start() decides)
        self.has_reset_reason = False
        self._reject_filled = 0
        self._modules_checked = 0.0
        self._rcv_state_process = (
            _symbol_range(self.kallsyms, "tcp_rcv_state_process", None)
            if EventKind.SOCK_DROP in config.kinds
            else None
        )

    # -- start -----------------------------------------------------------------------------------------
    def _wanted_programs(self, kernel_btf: Btf) -> list[str]:
        wanted = {name for kind in self.config.kinds for name in _PROGRAM_OF[kind]}
        if self.config.track_states and wanted:
            wanted.add("nst_state")
        # skb:consume_skb passes the caller's address since 6.3; without it a SYN's listener is unknown.
        if (kernel_btf.tracepoint_arity("consume_skb") or 0) < 2 or not self._rcv_state_process:
            wanted.discard("nst_synq")
        return [name for name in _ALL_PROGRAMS if name in wanted]

    def _kernel_config(self, kernel_btf: Btf) -> TcpConfigC:
        packet_filter = self.config.packet_filter
        cfg = TcpConfigC()
        fill_filter_config(cfg, packet_filter, inherent=("proto",))  # every tcp program sees TCP only
        cfg.thread_size = thread_size()
        tlp = _symbol_range(self.kallsyms, "tcp_send_loss_probe", None)
        if tlp is not None:
            cfg.tlp.start, cfg.tlp.end = tlp
        if self._rcv_state_process is not None:
            cfg.rcv_state_process.start, cfg.rcv_state_process.end = self._rcv_state_process
        cfg.sample_every = self.config.sample_every
        cfg.emit_mask = sum(kind.bit for kind in self.config.emit)
        cfg.group_mask = sum(kind.bit for kind in self.config.group)
        cfg.stack_mask = sum(kind.bit for kind in self.config.stack)
        none = 0xFFFFFFFF
        reasons = self.drop_reasons
        consumed = reasons.consumed if reasons is not None else None
        not_dropped = reasons.not_dropped if reasons is not None else None
        cfg.consumed_reason = none if consumed is None else consumed
        cfg.not_dropped_reason = none if not_dropped is None else not_dropped
        self.has_reset_reason = (kernel_btf.tracepoint_arity("tcp_send_reset") or 0) >= 3
        cfg.has_reset_reason = int(self.has_reset_reason)
        cfg.has_rx_sk = int((kernel_btf.tracepoint_arity("kfree_skb") or 0) >= 4)
        cfg.group_flows = int(self.config.group_flows)
        cfg.has_retrans_err = int((kernel_btf.tracepoint_arity("tcp_retransmit_skb") or 0) >= 3)
        return cfg

    @property
    def programs(self) -> tuple[str, ...]:
        """The attached programs' full names (with their variant suffix)."""
        return self._programs.attached

    def start(self) -> None:
        found = require_tracing(ring_buffer=False)
        use_perf = self.config.perf_buffer if self.config.perf_buffer is not None else not found.ring_buffer
        perf = _PERF_FALLBACK if use_perf and self.config.emit else None
        self.buffer = "perf" if perf is not None else "ring"
        with Btf.vmlinux() as kernel_btf:
            programs = self._wanted_programs(kernel_btf)
            if not programs:
                raise UsageError("nothing to trace: no event kind selected")
            missing = [p for p in programs if kernel_btf.tracepoint_arity(_TRACEPOINT_OF[p]) is None]
            if missing:
                raise BpfError(
                    "this kernel lacks the tracepoint(s) "
                    + ", ".join(_TRACEPOINT_OF[p] for p in missing)
                    + " (TCP tracepoints need Linux 4.16 or newer, reset reasons 6.10)"
                )
            cfg = self._kernel_config(kernel_btf)
        self._programs.start(
            programs,
            (TcpRodata.cfg, cfg),
            fill_maps=self._fill_maps,
            ring=TcpMaps.events if self.config.emit else None,
            perf=perf,
        )
        # After attach, so a socket born during the walk is seen live instead (the walk keeps those).
        if "nst_state" in programs or "nst_synq" in programs:
            self.existing = seed_existing_sockets(self._programs.maps, self._netns_paths())

    def _netns_paths(self) -> list[str]:
        """The namespaces whose sockets the trace can report: the --netns one, else every one."""
        names = NetnsNames()
        wanted = self.config.packet_filter.netns
        inodes = [wanted] if wanted else names.inodes()
        return [path for inode in inodes if (path := names.path_of(inode)) is not None]

    def _fill_maps(self, tcp: Skeleton[TcpMaps]) -> None:
        fill_address_maps(tcp.maps, self.config.packet_filter)
        self._owners.refresh(tcp.maps, force=True)
        if EventKind.SOCK_DROP in self.config.kinds and self.drop_reasons is not None:
            queue_map = tcp.maps.queue_reasons
            for name in QUEUE_DROP_REASONS:
                value = self.drop_reasons.value(name)
                if value is not None:
                    queue_map.update(value.to_bytes(4, "little"), b"\x01")
        if EventKind.RESET_FIREWALL in self.config.kinds:
            self._fill_reject_ranges(tcp.maps, self.kallsyms)

    def _fill_reject_ranges(self, maps: TcpMaps, kallsyms: Kallsyms) -> None:
        ranges = maps.reject_ranges
        found = [
            found_range
            for name, module in _REJECT_FUNCTIONS
            if (found_range := _symbol_range(kallsyms, name, module)) is not None
        ]
        for index, (start, end) in enumerate(found[:TCP_STACK_RANGES]):
            ranges.update(index.to_bytes(4, "little"), bytes(TcpRangeC(start, end)))
        self._reject_filled = len(found)

    def _watch_reject_modules(self) -> None:
        """nf_reject_ipv4/6 may be modules loaded only when the first REJECT rule is added: pick them up."""
        if (
            not self._programs.started
            or EventKind.RESET_FIREWALL not in self.config.kinds
            or self._reject_filled >= len(_REJECT_FUNCTIONS)
        ):
            return
        now = time.monotonic()
        if now - self._modules_checked < _MODULE_CHECK_S:
            return
        self._modules_checked = now
        try:
            loaded = {line.split(" ", 1)[0] for line in self._modules_path.read_text().splitlines()}
        except OSError:
            return
        if any(module in loaded for _, module in _REJECT_FUNCTIONS):
            fresh = Kallsyms(self.kallsyms.path)
            self._fill_reject_ranges(self._programs.maps, fresh)

    # -- run -------------------------------------------------------------------------------------------
    def poll(self, timeout_ms: int) -> list[RawTcpEvent]:
        if self._programs.started:
            self._owners.refresh(self._programs.maps)
            self._watch_reject_modules()
        return self._decode_all(self._programs.poll(timeout_ms))

    def catch_up(self) -> list[RawTcpEvent]:
        """Everything queued now, without ending the run (a reader that goes on counting)."""
        return self._decode_all(self._programs.drain())

    def drain(self) -> list[RawTcpEvent]:
        """The run's last events: the programs stop first (every caller drains once, at its end), so the
        totals and groups read after it are final and agree."""
        return self._decode_all(self._programs.last_drain())

    def _decode_all(self, records: list[bytes]) -> list[RawTcpEvent]:
        events = [decode_record(record) for record in records]
        if self.existing.born_ns:
            events = [self._mark_existing(event) for event in events]
        return events

    def _mark_existing(self, event: RawTcpEvent) -> RawTcpEvent:
        if self.existing.existed_before(event.born_ns):
            return event._replace(born_before_trace=True)
        return event

    @property
    def perf_lost(self) -> int | None:
        """With the perf buffer: the records the kernel reported lost to it (equal to the LOST totals)."""
        return self._programs.perf_lost

    def totals(self) -> dict[EventKind, KindTotals]:
        if not self._programs.started:
            return {}
        sums = self._programs.counter_sums(TcpMaps.tcp_stats, len(EventKind) * STAT_COUNT)
        return {
            kind: KindTotals(*sums[kind.value * STAT_COUNT : (kind.value + 1) * STAT_COUNT])
            for kind in EventKind
        }

    def groups(self, kinds: Iterable[EventKind] | None = None) -> Iterator[RawTcpGroup]:
        wanted = set(kinds) if kinds is not None else None
        for _key, value_bytes in self._programs.entries(TcpMaps.tcp_groups):
            value = TcpGroupC.from_buffer_copy(value_bytes)
            kind = EventKind(value.example.kind)
            if wanted is not None and kind not in wanted:
                continue
            frames = tuple(value.example_frames[: value.example.nr_frames])
            yield RawTcpGroup(
                kind=kind,
                count=value.count,
                sum1=value.sum1,
                sum2=value.sum2,
                sum3=value.sum3,
                max1=value.max1,
                example=self._mark_existing(decode_event(value.example, frames)),
                segs=value.segs,
            )


# bpf/tcp.bpf.c: the perf event array and the switch that sends events there instead of the ring buffer.
_PERF_FALLBACK = PerfFallback(TcpMaps.events_perf, TcpRodata.ns_use_perfbuf)

_TRACEPOINT_OF = {
    "nst_rst_sent": "tcp_send_reset",
    "nst_rst_recv": "tcp_receive_reset",
    "nst_rst_fw": "net_dev_queue",
    "nst_state": "inet_sock_set_state",
    "nst_retrans": "tcp_retransmit_skb",
    "nst_synack": "tcp_retransmit_synack",
    "nst_error": "inet_sk_error_report",
    "nst_skdrop": "kfree_skb",
    "nst_synq": "consume_skb",
    "nst_rcvq": "sock_rcvqueue_full",
    "nst_memlim": "sock_exceed_buf_limit",
}
