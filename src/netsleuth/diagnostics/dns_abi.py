"""ctypes mirrors of bpf/dns.h. Each is checked against the object's BTF size when the object is opened."""

from __future__ import annotations

import ctypes

from netsleuth._generated.shared_abi import PacketTupleC

__all__ = [
    "DNS_LATENCY_BUCKETS",
    "DNS_MAX_FRAMES",
    "DNS_QNAME_MAX",
    "DNS_RCODES",
    "DnsConfigC",
    "DnsEvent",
    "DnsEventKind",
    "DnsGroupKey",
    "DnsGroupValue",
    "DnsPendingKey",
    "DnsQueryC",
    "DnsStat",
]

DNS_QNAME_MAX = 96
DNS_MAX_FRAMES = 24
DNS_LATENCY_BUCKETS = 100
DNS_RCODES = 16


class DnsStat:
    """Indices of the per-CPU dns_stats array (enum dns_stat)."""

    SEEN = 0
    MATCHED = 1
    EMITTED = 2
    SAMPLED = 3
    LOST = 4
    UNGROUPED = 5
    QUERIES = 6
    ANSWERS = 7
    UNMATCHED = 8
    UNTRACKED = 9
    RETRANSMITS = 10
    DROPS = 11
    COUNT = 12


class DnsEventKind:
    ANSWER = 1
    UNMATCHED = 2
    DROP = 3


class DnsConfigC(ctypes.Structure):
    c_name = "dns_config"
    _fields_ = (
        ("netns", ctypes.c_uint32),
        ("sample_every", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("rcode_mask", ctypes.c_uint32),
        ("slow_ns", ctypes.c_uint64),
        ("thread_size", ctypes.c_uint64),
        ("consumed_reason", ctypes.c_uint32),
        ("not_dropped_reason", ctypes.c_uint32),
        ("dns_port", ctypes.c_uint16),
        ("port", ctypes.c_uint16),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("l4proto", ctypes.c_uint8),
        ("filter_l4proto", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("filter_host", ctypes.c_uint8),
        ("filter_src", ctypes.c_uint8),
        ("filter_dst", ctypes.c_uint8),
        ("filter_owner", ctypes.c_uint8),
        ("filter_dev", ctypes.c_uint8),
        ("emit_events", ctypes.c_uint8),
        ("has_rx_sk", ctypes.c_uint8),
        ("per_server", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 5),
        ("dev", ctypes.c_char * 16),
        ("comm", ctypes.c_char * 16),
    )


class DnsGroupKey(ctypes.Structure):
    c_name = "dns_group_key"
    _fields_ = (
        ("server", ctypes.c_uint8 * 16),
        ("tgid", ctypes.c_uint32),
        ("netns", ctypes.c_uint32),
        ("qtype", ctypes.c_uint16),
        ("server_port", ctypes.c_uint16),
        ("family", ctypes.c_uint8),
        ("l4proto", ctypes.c_uint8),
        ("qname_len", ctypes.c_uint8),
        ("qname_cut", ctypes.c_uint8),
        ("comm", ctypes.c_char * 16),
        ("qname", ctypes.c_uint8 * DNS_QNAME_MAX),
    )


class DnsPendingKey(ctypes.Structure):
    c_name = "dns_pending_key"
    _fields_ = (("cookie", ctypes.c_uint64), ("id", ctypes.c_uint16), ("pad", ctypes.c_uint16 * 3))


class DnsQueryC(ctypes.Structure):
    c_name = "dns_query"
    _fields_ = (
        ("group", DnsGroupKey),
        ("sent_ns", ctypes.c_uint64),
        ("sock_ino", ctypes.c_uint64),
        ("client", ctypes.c_uint8 * 16),
        ("tid", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("client_port", ctypes.c_uint16),
        ("query_len", ctypes.c_uint16),
        ("in_task", ctypes.c_uint8),
        ("kthread", ctypes.c_uint8),
        ("retransmits", ctypes.c_uint8),
        ("pad", ctypes.c_uint8),
    )


class DnsGroupValue(ctypes.Structure):
    c_name = "dns_group"
    _fields_ = (
        ("queries", ctypes.c_uint64),
        ("answers", ctypes.c_uint64),
        ("retransmits", ctypes.c_uint64),
        ("truncated", ctypes.c_uint64),
        ("answer_records", ctypes.c_uint64),
        ("latency_sum_ns", ctypes.c_uint64),
        ("rcodes", ctypes.c_uint64 * DNS_RCODES),
        ("latency", ctypes.c_uint64 * DNS_LATENCY_BUCKETS),
    )


class DnsEvent(ctypes.Structure):
    c_name = "dns_event"
    _fields_ = (
        ("time_ns", ctypes.c_uint64),
        ("cookie", ctypes.c_uint64),
        ("latency_ns", ctypes.c_uint64),
        ("location", ctypes.c_uint64),
        ("sock_ino", ctypes.c_uint64),
        ("query", DnsQueryC),
        ("tuple", PacketTupleC),
        ("reason", ctypes.c_uint32),
        ("netns", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("dns_len", ctypes.c_uint16),
        ("caplen", ctypes.c_uint16),
        ("nr_frames", ctypes.c_uint16),
        ("id", ctypes.c_uint16),
        ("kind", ctypes.c_uint8),
        ("rcode", ctypes.c_uint8),
        ("flags_hi", ctypes.c_uint8),
        ("in_task", ctypes.c_uint8),
        ("kthread", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 3),
        ("comm", ctypes.c_char * 16),
    )
