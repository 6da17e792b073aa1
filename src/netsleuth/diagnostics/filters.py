"""Filters shared by every packet diagnostic (drops, resets, tcp...): parsed and validated once, here.

Bad input is a UsageError with one sentence (exit 2). The parsed `PacketFilter` is what each program's
loader turns into its in-kernel configuration.
"""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field

from netsleuth.diagnostics.model import ConfigInput
from netsleuth.errors import UsageError
from netsleuth.packet import proto_number

__all__ = [
    "FILTER_KEYS",
    "IpNetwork",
    "PacketFilter",
    "TaskSelection",
    "add_filter_arguments",
    "packet_filter_from_args",
    "parse_network",
    "parse_port",
    "read_packet_filter",
    "read_task_selection",
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


# The JSON config keys of the filters (the CLI flags without dashes; `family` is 4 or 6 for -4/-6).
FILTER_KEYS = (
    "proto",
    "host",
    "src",
    "dst",
    "port",
    "sport",
    "dport",
    "pid",
    "comm",
    "netns",
    "dev",
    "family",
)


def packet_filter_from_args(args: argparse.Namespace) -> PacketFilter:
    return read_packet_filter(ConfigInput.from_args(args))


def _read_pid(values: ConfigInput) -> int | None:
    text = values.text("pid")
    if text is not None and (not text.isdigit() or int(text) <= 0):
        raise UsageError(f"--pid {text!r} is not a process id")
    return int(text) if text is not None else None


def _read_comm(values: ConfigInput) -> str | None:
    comm = values.text("comm")
    if comm is not None and not 0 < len(comm) <= 15:
        raise UsageError(f"--comm {comm!r} must be 1 to 15 characters, as the kernel keeps it")
    return comm


@dataclass(frozen=True)
class TaskSelection:
    """Which tasks a process-level diagnostic (profile, snoop) watches: --pid, --comm, --netns (inode),
    --cgroup (cgroup v2 id), read with the packet filters' checks and sentences."""

    pid: int | None = None
    comm: str | None = None
    netns: int | None = None
    cgroup_id: int | None = None


def read_task_selection(values: ConfigInput) -> TaskSelection:
    from netsleuth.kernel.cgroups import resolve_cgroup_arg
    from netsleuth.kernel.netns import resolve_netns_arg

    netns, cgroup = values.text("netns"), values.text("cgroup")
    return TaskSelection(
        pid=_read_pid(values),
        comm=_read_comm(values),
        netns=resolve_netns_arg(netns) if netns is not None else None,
        cgroup_id=resolve_cgroup_arg(cgroup) if cgroup is not None else None,
    )


def read_packet_filter(
    values: ConfigInput, resolve_netns: Callable[[str], int] | None = None
) -> PacketFilter:
    """The filters from CLI flags or a JSON config. `resolve_netns` turns --netns into an inode on this host
    (by default: `ip netns` names, inodes, /proc/PID/ns/net); a controller that only checks a config meant
    for another host passes its own."""
    proto = None
    proto_text = values.text("proto")
    if proto_text is not None:
        proto = proto_number(proto_text)
        if proto is None:
            raise UsageError(
                f"unknown protocol {proto_text!r}: use tcp, udp, icmp, icmpv6, sctp or a number 0-255"
            )
    pid, comm = _read_pid(values), _read_comm(values)
    dev = values.text("dev")
    if dev is not None and not 0 < len(dev) <= 15:
        raise UsageError(f"--dev {dev!r} is not an interface name (1 to 15 characters)")
    family = values.raw("family")
    if family not in (None, 4, 6):
        raise UsageError(f"family must be 4 or 6 (-4 or -6), not {family!r}")
    netns = values.text("netns")
    if resolve_netns is None:
        from netsleuth.kernel.netns import resolve_netns_arg

        resolve_netns = resolve_netns_arg

    def port(key: str) -> int | None:
        text = values.text(key)
        return parse_port(text, f"--{key}") if text is not None else None

    hosts = tuple(parse_network(text) for text in values.texts("host"))
    sources = tuple(parse_network(text) for text in values.texts("src"))
    destinations = tuple(parse_network(text) for text in values.texts("dst"))
    # -6 with an IPv4 address (or -4 with an IPv6 one) would match nothing, silently: say so instead.
    for network in (*hosts, *sources, *destinations):
        if family is not None and network.version != family:
            raise UsageError(
                f"-{family} contradicts the IPv{network.version} address {network}: drop one of them"
            )
    return PacketFilter(
        proto=proto,
        hosts=hosts,
        sources=sources,
        destinations=destinations,
        port=port("port"),
        sport=port("sport"),
        dport=port("dport"),
        pid=pid,
        comm=comm,
        netns=resolve_netns(netns) if netns is not None else None,
        dev=dev,
        family=family,
    )
