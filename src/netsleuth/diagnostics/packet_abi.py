"""Decoding of the packet tuple every netsleuth object fills (its ctypes mirror is generated:
netsleuth._generated.shared_abi.PacketTupleC)."""

from __future__ import annotations

from netsleuth._generated.shared_abi import PacketTupleC
from netsleuth.packet import PacketTuple

__all__ = ["decode_tuple"]

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
