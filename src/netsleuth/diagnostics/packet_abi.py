"""ctypes mirror of bpf/packet.h, shared by every diagnostic that reports a packet."""

from __future__ import annotations

import ctypes

from netsleuth.packet import PacketTuple

__all__ = ["LpmAddrKey", "PacketTupleC", "decode_tuple"]


class PacketTupleC(ctypes.Structure):
    c_name = "packet_tuple"
    _fields_ = (
        ("saddr", ctypes.c_uint8 * 16),
        ("daddr", ctypes.c_uint8 * 16),
        ("l3_len", ctypes.c_uint32),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("ethertype", ctypes.c_uint16),
        ("family", ctypes.c_uint8),
        ("l4proto", ctypes.c_uint8),
        ("tcp_flags", ctypes.c_uint8),
        ("has_ports", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 2),
    )


class LpmAddrKey(ctypes.Structure):
    c_name = "lpm_addr_key"
    _fields_ = (("prefixlen", ctypes.c_uint32), ("family", ctypes.c_uint8), ("addr", ctypes.c_uint8 * 16))


_ICMP = (1, 58)
_TCP = 6


def decode_tuple(raw: PacketTupleC, length: int) -> PacketTuple:
    family = raw.family
    saddr = PacketTuple.address_text(family, bytes(raw.saddr))
    daddr = PacketTuple.address_text(family, bytes(raw.daddr))
    if raw.has_ports and raw.l4proto in _ICMP:
        return PacketTuple(
            family, raw.l4proto, saddr, daddr, icmp_type=raw.sport, icmp_code=raw.dport, length=length
        )
    if raw.has_ports:
        flags = raw.tcp_flags if raw.l4proto == _TCP else None
        return PacketTuple(family, raw.l4proto, saddr, daddr, raw.sport, raw.dport, flags, length=length)
    return PacketTuple(family, raw.l4proto, saddr, daddr, length=length)
