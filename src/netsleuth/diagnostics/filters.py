"""Filters shared by every packet diagnostic (drops, resets, tcp...): parsed and validated once, here.

Bad input is a UsageError with one sentence (exit 2). The parsed `PacketFilter` is what each program's
loader turns into its in-kernel configuration.
"""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass, field

from netsleuth.errors import UsageError
from netsleuth.packet import proto_number

__all__ = [
    "IpNetwork",
    "PacketFilter",
    "add_filter_arguments",
    "packet_filter_from_args",
    "parse_network",
    "parse_port",
]

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_network(text: str) -> IpNetwork:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise UsageError(
            f"{text!r} is not an IP address or CIDR (e.g. 198.18.0.1, 198.18.0.0/15, 2001:db8::/32)"
        ) from None


def parse_port(text: str, option: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= 65535:
        raise UsageError(f"{option} {text!r} is not a port: give a number from 1 to 65535")
    return int(text)


@dataclass(frozen=True)
class PacketFilter:
    proto: int | None = None
    hosts: tuple[IpNetwork, ...] = ()
    sources: tuple[IpNetwork, ...] = ()
    destinations: tuple[IpNetwork, ...] = ()
    port: int | None = None
    sport: int | None = None
    dport: int | None = None
    pid: int | None = None
    comm: str | None = None
    netns: int | None = None
    dev: str | None = None
    family: int | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def filters_owner(self) -> bool:
        return self.pid is not None or self.comm is not None


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("filters (applied in the kernel)")
    group.add_argument("--proto", help="L4 protocol: tcp, udp, icmp, icmpv6, sctp or a number")
    group.add_argument(
        "--host", action="append", default=[], metavar="ADDR[/LEN]", help="either address (repeatable)"
    )
    group.add_argument(
        "--src", action="append", default=[], metavar="ADDR[/LEN]", help="source address (repeatable)"
    )
    group.add_argument(
        "--dst", action="append", default=[], metavar="ADDR[/LEN]", help="destination address (repeatable)"
    )
    group.add_argument("--port", help="either port")
    group.add_argument("--sport", help="source port")
    group.add_argument("--dport", help="destination port")
    group.add_argument("--pid", help="process id: the sending task or the owner of the packet's socket")
    group.add_argument("--comm", help="process name (as in /proc/PID/comm)")
    group.add_argument("--netns", help="network namespace: inode, `ip netns` name, or /proc/PID/ns/net")
    group.add_argument("--dev", help="interface name")
    group.add_argument("-4", dest="family", action="store_const", const=4, help="IPv4 only")
    group.add_argument("-6", dest="family", action="store_const", const=6, help="IPv6 only")


def packet_filter_from_args(args: argparse.Namespace) -> PacketFilter:
    from netsleuth.kernel.netns import resolve_netns_arg

    proto = None
    if args.proto is not None:
        proto = proto_number(args.proto)
        if proto is None:
            raise UsageError(
                f"unknown protocol {args.proto!r}: use tcp, udp, icmp, icmpv6, sctp or a number 0-255"
            )
    pid = None
    if args.pid is not None:
        if not args.pid.isdigit() or int(args.pid) <= 0:
            raise UsageError(f"--pid {args.pid!r} is not a process id")
        pid = int(args.pid)
    if args.comm is not None and not 0 < len(args.comm) <= 15:
        raise UsageError(f"--comm {args.comm!r} must be 1 to 15 characters, as the kernel keeps it")
    if args.dev is not None and not 0 < len(args.dev) <= 15:
        raise UsageError(f"--dev {args.dev!r} is not an interface name (1 to 15 characters)")
    return PacketFilter(
        proto=proto,
        hosts=tuple(parse_network(text) for text in args.host),
        sources=tuple(parse_network(text) for text in args.src),
        destinations=tuple(parse_network(text) for text in args.dst),
        port=parse_port(args.port, "--port") if args.port is not None else None,
        sport=parse_port(args.sport, "--sport") if args.sport is not None else None,
        dport=parse_port(args.dport, "--dport") if args.dport is not None else None,
        pid=pid,
        comm=args.comm,
        netns=resolve_netns_arg(args.netns) if args.netns is not None else None,
        dev=args.dev,
        family=args.family,
    )
