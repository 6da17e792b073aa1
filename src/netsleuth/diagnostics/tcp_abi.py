"""ctypes mirrors of bpf/tcp.h. Each is checked against the object's BTF size when the object is opened."""

from __future__ import annotations

import ctypes
import enum

__all__ = [
    "TCP_EXAMPLE_FRAMES",
    "TCP_MAX_FRAMES",
    "TCP_NO_STATE",
    "TCP_REASON_SYN_ACCEPT_QUEUE_FULL",
    "TCP_STACK_RANGES",
    "EventKind",
    "RetransKind",
    "SockFlag",
    "TcpConfigC",
    "TcpEventC",
    "TcpGroupC",
    "TcpGroupKeyC",
    "TcpRangeC",
    "TcpStat",
]

TCP_MAX_FRAMES = 32
TCP_EXAMPLE_FRAMES = 24
TCP_STACK_RANGES = 4
TCP_NO_STATE = 0xFF
# A SOCK_DROP reason of netsleuth's own (tcp.h): a SYN a listener discarded without a kernel drop reason.
TCP_REASON_SYN_ACCEPT_QUEUE_FULL = 0xFFFFFFFE


class EventKind(enum.IntEnum):
    """enum tcp_event_kind."""

    RESET_SENT = 0
    RESET_RECEIVED = 1
    RESET_FIREWALL = 2
    STATE = 3
    LIFE = 4
    CONNECT = 5
    RETRANS = 6
    SYNACK_RETRANS = 7
    ERROR = 8
    SOCK_DROP = 9
    RCVQ_FULL = 10
    MEM_LIMIT = 11

    @property
    def bit(self) -> int:
        return 1 << self.value


KIND_COUNT = len(EventKind)


class TcpStat(enum.IntEnum):
    """enum tcp_stat: index within one kind's block of the per-CPU tcp_stats array."""

    SEEN = 0
    MATCHED = 1
    EMITTED = 2
    SAMPLED = 3
    LOST = 4
    UNGROUPED = 5


STAT_COUNT = len(TcpStat)


class RetransKind(enum.IntEnum):
    """enum tcp_retrans_kind."""

    OTHER = 0
    SYN = 1
    TLP = 2
    TIMEOUT = 3
    FAST = 4


class SockFlag(enum.IntFlag):
    """TCP_SOCK_* bits of tcp_event.sock_flags."""

    LINGER = 1
    LINGER_ZERO = 2
    HAS_FILE = 4
    FULL = 8


class TcpRangeC(ctypes.Structure):
    c_name = "tcp_range"
    _fields_ = (("start", ctypes.c_uint64), ("end", ctypes.c_uint64))


class TcpConfigC(ctypes.Structure):
    c_name = "tcp_config"
    _fields_ = (
        ("thread_size", ctypes.c_uint64),
        ("tlp", TcpRangeC),
        ("rcv_state_process", TcpRangeC),
        ("netns", ctypes.c_uint32),
        ("sample_every", ctypes.c_uint32),
        ("emit_mask", ctypes.c_uint32),
        ("group_mask", ctypes.c_uint32),
        ("stack_mask", ctypes.c_uint32),
        ("consumed_reason", ctypes.c_uint32),
        ("not_dropped_reason", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("comm", ctypes.c_char * 16),
        ("port", ctypes.c_uint16),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("family", ctypes.c_uint8),
        ("filter_host", ctypes.c_uint8),
        ("filter_src", ctypes.c_uint8),
        ("filter_dst", ctypes.c_uint8),
        ("filter_owner", ctypes.c_uint8),
        ("has_reset_reason", ctypes.c_uint8),
        ("has_rx_sk", ctypes.c_uint8),
        ("group_flows", ctypes.c_uint8),
        ("has_retrans_err", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 3),
    )


class TcpEventC(ctypes.Structure):
    c_name = "tcp_event"
    _fields_ = (
        ("time_ns", ctypes.c_uint64),
        ("sk", ctypes.c_uint64),
        ("sock_ino", ctypes.c_uint64),
        ("born_ns", ctypes.c_uint64),
        ("value1", ctypes.c_uint64),
        ("value2", ctypes.c_uint64),
        ("value3", ctypes.c_uint64),
        ("netns", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("owner_pid", ctypes.c_uint32),
        ("reason", ctypes.c_uint32),
        ("seq", ctypes.c_uint32),
        ("ack", ctypes.c_uint32),
        ("unread", ctypes.c_uint32),
        ("unsent", ctypes.c_uint32),
        ("backlog", ctypes.c_uint32),
        ("max_backlog", ctypes.c_uint32),
        ("syn_queue", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("lport", ctypes.c_uint16),
        ("rport", ctypes.c_uint16),
        ("payload_len", ctypes.c_uint16),
        ("nr_frames", ctypes.c_uint16),
        ("laddr", ctypes.c_uint8 * 16),
        ("raddr", ctypes.c_uint8 * 16),
        ("kind", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("state", ctypes.c_uint8),
        ("old_state", ctypes.c_uint8),
        ("tcp_flags", ctypes.c_uint8),
        ("has_trigger", ctypes.c_uint8),
        ("side", ctypes.c_uint8),
        ("ca_state", ctypes.c_uint8),
        ("retransmits", ctypes.c_uint8),
        ("sock_flags", ctypes.c_uint8),
        ("retrans_kind", ctypes.c_uint8),
        ("in_task", ctypes.c_uint8),
        ("kthread", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 3),
        ("comm", ctypes.c_char * 16),
        ("owner_comm", ctypes.c_char * 16),
        ("ifname", ctypes.c_char * 16),
    )


class TcpGroupKeyC(ctypes.Structure):
    c_name = "tcp_group_key"
    _fields_ = (
        ("laddr", ctypes.c_uint8 * 16),
        ("raddr", ctypes.c_uint8 * 16),
        ("netns", ctypes.c_uint32),
        ("reason", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("lport", ctypes.c_uint16),
        ("rport", ctypes.c_uint16),
        ("kind", ctypes.c_uint8),
        ("state", ctypes.c_uint8),
        ("old_state", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("retrans_kind", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 3),
    )


class TcpGroupC(ctypes.Structure):
    c_name = "tcp_group"
    _fields_ = (
        ("count", ctypes.c_uint64),
        ("sum1", ctypes.c_uint64),
        ("sum2", ctypes.c_uint64),
        ("sum3", ctypes.c_uint64),
        ("max1", ctypes.c_uint64),
        ("example", TcpEventC),
        ("example_frames", ctypes.c_uint64 * TCP_EXAMPLE_FRAMES),
    )
