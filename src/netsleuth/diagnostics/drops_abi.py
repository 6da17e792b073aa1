"""ctypes mirrors of bpf/drops.h. Each is checked against the object's BTF size when the object is opened."""

from __future__ import annotations

import ctypes

from netsleuth.diagnostics.packet_abi import PacketTupleC

__all__ = [
    "DROPS_EXAMPLE_FRAMES",
    "DROPS_MAX_SNAPLEN",
    "DropEvent",
    "DropGroupKey",
    "DropGroupValue",
    "DropStat",
    "DropsConfigC",
]

DROPS_MAX_SNAPLEN = 2048
DROPS_EXAMPLE_FRAMES = 12


class DropStat:
    """Indices of the per-CPU drop_stats array (enum drop_stat)."""

    SEEN = 0
    MATCHED = 1
    EMITTED = 2
    SAMPLED = 3
    LOST = 4
    UNGROUPED = 5
    COUNT = 6


class DropsConfigC(ctypes.Structure):
    c_name = "drops_config"
    _fields_ = (
        ("consumed_reason", ctypes.c_uint32),
        ("not_dropped_reason", ctypes.c_uint32),
        ("netfilter_reason", ctypes.c_uint32),
        ("netns", ctypes.c_uint32),
        ("sample_every", ctypes.c_uint32),
        ("snaplen", ctypes.c_uint16),
        ("port", ctypes.c_uint16),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("l4proto", ctypes.c_uint8),
        ("filter_l4proto", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("filter_reasons", ctypes.c_uint8),
        ("filter_host", ctypes.c_uint8),
        ("filter_src", ctypes.c_uint8),
        ("filter_dst", ctypes.c_uint8),
        ("filter_owner", ctypes.c_uint8),
        ("want_stack", ctypes.c_uint8),
        ("emit_events", ctypes.c_uint8),
        ("has_rx_sk", ctypes.c_uint8),
        ("filter_dev", ctypes.c_uint8),
        ("dev", ctypes.c_char * 16),
        ("pid", ctypes.c_uint32),
        ("comm", ctypes.c_char * 16),
        ("thread_size", ctypes.c_uint64),
    )


class DropEvent(ctypes.Structure):
    c_name = "drop_event"
    _fields_ = (
        ("time_ns", ctypes.c_uint64),
        ("location", ctypes.c_uint64),
        ("sock_ino", ctypes.c_uint64),
        ("reason", ctypes.c_uint32),
        ("netns", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("skb_len", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("caplen", ctypes.c_uint16),
        ("nr_frames", ctypes.c_uint16),
        ("tuple", PacketTupleC),
        ("in_task", ctypes.c_uint8),
        ("kthread", ctypes.c_uint8),
        ("sk_state", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 5),
        ("comm", ctypes.c_char * 16),
        ("ifname", ctypes.c_char * 16),
    )


class DropGroupKey(ctypes.Structure):
    c_name = "drop_group_key"
    _fields_ = (("location", ctypes.c_uint64), ("reason", ctypes.c_uint32), ("netns", ctypes.c_uint32))


class DropGroupValue(ctypes.Structure):
    c_name = "drop_group"
    _fields_ = (
        ("count", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("example", DropEvent),
        ("example_frames", ctypes.c_uint64 * DROPS_EXAMPLE_FRAMES),
    )
