"""The decoded summary of one packet, shared by every diagnostic, the firewall matcher and the renderers."""

from __future__ import annotations

import ipaddress

import msgspec

__all__ = ["TCP_FLAG_NAMES", "PacketTuple", "endpoint_text", "proto_name", "proto_number", "tcp_flags_text"]

# IANA protocol numbers (the same on every system; importing socket for them cost every trace's start 3 ms).
_PROTO_NAMES = {
    1: "icmp",
    6: "tcp",
    17: "udp",
    58: "icmpv6",
    132: "sctp",
    136: "udplite",
    47: "gre",
    50: "esp",
    51: "ah",
    2: "igmp",
    4: "ipip",
    41: "ipv6",
}
_PROTO_NUMBERS = {name: number for number, name in _PROTO_NAMES.items()} | {"icmp6": 58}

# Bit order of the TCP header's flags byte (RFC 9293), lowest bit first.
TCP_FLAG_NAMES = ("FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR")


def endpoint_text(address: str | None, port: int | None) -> str:
    """`198.18.0.1:80`, `[2001:db8::1]:80` (brackets keep an IPv6 address apart from its port), `?:80` when
    the address is unknown, the bare address when there is no port (ICMP)."""
    if address is None:
        return "?" if port is None else f"?:{port}"
    if port is None:
        return address
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def proto_name(number: int) -> str:
    """`tcp`, `udp`, `icmp`...; protocols without a name print as their number."""
    return _PROTO_NAMES.get(number, str(number))


def proto_number(name: str) -> int | None:
    """The IPPROTO number for a name or a decimal number; None when unknown."""
    if name.isdigit():
        number = int(name)
        return number if 0 <= number <= 255 else None
    return _PROTO_NUMBERS.get(name.lower())


def tcp_flags_text(flags: int) -> str:
    """`SYN|ACK` style, in header order."""
    return "|".join(name for bit, name in enumerate(TCP_FLAG_NAMES) if flags & (1 << bit)) or "none"


class PacketTuple(msgspec.Struct, frozen=True):
    """What a packet's headers say. Ports are None for protocols without them; for ICMP, `icmp_type` and
    `icmp_code` are set instead."""

    family: int  # 4, 6, or 0 when the packet is not IP
    proto: int  # IPPROTO number
    saddr: str | None
    daddr: str | None
    sport: int | None = None
    dport: int | None = None
    tcp_flags: int | None = None
    icmp_type: int | None = None
    icmp_code: int | None = None
    length: int = 0

    @property
    def proto_name(self) -> str:
        return proto_name(self.proto)

    @staticmethod
    def address_text(family: int, raw: bytes) -> str | None:
        if family == 4:
            return str(ipaddress.IPv4Address(raw[:4]))
        if family == 6:
            return str(ipaddress.IPv6Address(raw[:16]))
        return None
