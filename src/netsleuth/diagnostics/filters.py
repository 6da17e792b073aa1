"""Filters shared by every packet diagnostic (drops, resets, tcp...): parsed and validated once, here.

Bad input is a ConfigError (a UsageError: one sentence, exit 2) that also names the field, so the web form
marks it and words it with its own label while the CLI names the flag. The parsed `PacketFilter` is what each
program's loader turns into its in-kernel configuration.

Naming something this host does not have is bad input too: a `--pid` that is no process here (or is a
thread, while the kernel filters by process), a `--netns` inode nothing holds (kernel/netns.py). An
interface is different: one may appear during the run (a container's veth), so a `--dev` no namespace has
now is accepted with a note (`PacketFilter.notes`), printed when the run starts. These checks run wherever a
config is read on the host that traces it (the CLI, the agent); a controller checking a config meant for
other hosts reads it under `read_for_another_host()`, which checks formats only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import ipaddress
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from netsleuth.diagnostics.model import ConfigInput
from netsleuth.errors import NetsleuthError, UsageError
from netsleuth.packet import proto_number
from netsleuth.spec.configs import ConfigError

if TYPE_CHECKING:
    from netsleuth.kernel.netns import NetnsNames

__all__ = [
    "FILTER_KEYS",
    "IpNetwork",
    "PacketFilter",
    "TaskSelection",
    "add_filter_arguments",
    "check_process",
    "filter_notes",
    "on_this_host",
    "packet_filter_from_args",
    "parse_network",
    "parse_port",
    "read_for_another_host",
    "read_packet_filter",
    "read_task_selection",
    "read_tcp_filter",
    "resolve_namespaces",
]

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_network(text: str, key: str | None = None) -> IpNetwork:
    """An address or CIDR; `key` names the config field it was given for (`dst`), if any."""
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ConfigError(
            key,
            f"{text!r} is not an IP address or CIDR (e.g. 198.18.0.1, 198.18.0.0/15, 2001:db8::/32)",
            flag=f"--{key}" if key else "",
        ) from None


def parse_port(text: str, option: str, key: str | None = None) -> int:
    """A port given with the CLI's `option` (`--dport`) for the config field `key` (default: the option's)."""
    if not text.isdigit() or not 0 < int(text) <= 65535:
        raise ConfigError(
            key or option.lstrip("-"), f"{text!r} is not a port: give a number from 1 to 65535", flag=option
        )
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
    notes: tuple[str, ...] = ()  # what the run should know from the start (an interface that does not exist)
    # Several namespaces (--k8s-namespace: its pods'), kept in the kernel's netns_filter set, not in `netns`.
    netns_set: frozenset[int] = frozenset()

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
    group.add_argument(
        "--pod", metavar="NAMESPACE/NAME", help="a Kubernetes pod on this host (its network namespace)"
    )
    group.add_argument(
        "--k8s-namespace",
        metavar="NAMESPACE",
        help="the pods of a Kubernetes namespace on this host (their network namespaces)",
    )
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
    "pod",
    "k8s_namespace",
    "dev",
    "family",
)


# -- what this host has ------------------------------------------------------------------------------------

_ELSEWHERE: ContextVar[bool] = ContextVar("netsleuth_config_for_another_host", default=False)
_TGID = re.compile(r"^Tgid:\s*(\d+)$", re.MULTILINE)


@contextlib.contextmanager
def read_for_another_host() -> Iterator[None]:
    """Configs read inside are meant for other hosts (the controller checking a fleet request): their
    formats are checked, not whether the process, namespace or interface they name exists here."""
    token = _ELSEWHERE.set(True)
    try:
        yield
    finally:
        _ELSEWHERE.reset(token)


def check_process(pid: int, proc_root: str = "/proc") -> None:
    """`--pid` must name a process of this host, by its process id: the kernel filters on the thread group
    id, so a thread's id would match nothing, silently."""
    if _ELSEWHERE.get():
        return
    try:
        status = Path(proc_root, str(pid), "status").read_text()
    except OSError:
        raise UsageError(f"--pid {pid}: no process has this id on this host") from None
    found = _TGID.search(status)
    if found is not None and int(found.group(1)) != pid:
        process = int(found.group(1))
        raise UsageError(f"--pid {pid} is a thread of process {process}: give the process id, {process}")


def _device_names(netns: int, names: NetnsNames, proc_root: str) -> set[str] | None:
    """The interfaces of a namespace now: /proc/PID/net/dev of a process inside (no need to enter it), or
    read from inside when only an `ip netns` name holds it; None when neither can be read."""
    from netsleuth.kernel.netns_exec import read_file_in_netns

    text: str | None = None
    for pid in names.pids_of(netns)[:1]:
        with contextlib.suppress(OSError):
            text = Path(proc_root, str(pid), "net", "dev").read_text()
    if text is None:
        path = names.path_of(netns)
        if path is None:
            return None
        try:
            text = read_file_in_netns("/proc/self/net/dev", path)
        except NetsleuthError:
            return None
    # /proc/net/dev: two header lines, then "  NAME: counters..." per interface.
    return {line.split(":", 1)[0].strip() for line in (text or "").splitlines()[2:] if ":" in line}


def missing_device_note(dev: str, netns: int | None, names: NetnsNames | None = None) -> str | None:
    """A note when no interface is named `dev` in `netns` (every namespace of the host when None) now."""
    from netsleuth.kernel.netns import NetnsNames

    names = names or NetnsNames()
    proc_root = names.proc_root
    inodes = [netns] if netns is not None else names.inodes()
    if not inodes:
        return None  # no namespace to look into: nothing to say
    for inode in inodes:
        devices = _device_names(inode, names, proc_root)
        if devices is None or dev in devices:
            return None  # there, or a namespace we cannot look into: nothing to say
    where = (
        f"in network namespace {names.name_of(netns) or netns}"
        if netns is not None
        else "in any network namespace of this host"
    )
    return f"no interface is named {dev!r} {where} now: its events will show if one appears"


def on_this_host(packet_filter: PacketFilter, names: NetnsNames | None = None) -> PacketFilter:
    """`packet_filter` checked against this host: its --pid must be a process here, and a --dev no namespace
    has now becomes a note. Unchanged under `read_for_another_host()`."""
    if _ELSEWHERE.get():
        return packet_filter
    if packet_filter.pid is not None:
        check_process(packet_filter.pid)
    if packet_filter.dev is None:
        return packet_filter
    note = missing_device_note(packet_filter.dev, packet_filter.netns, names)
    return dataclasses.replace(packet_filter, notes=(note,)) if note else packet_filter


def filter_notes(session: object) -> list[str]:
    """The notes of the packet filter a session runs with: what the CLI prints as it starts and an agent
    session reports, for any diagnostic. A session of a typed config (netsleuth.spec) holds the filter it
    resolved on this host as `packet_filter`; an older one holds it in `config.packet_filter`."""
    packet_filter = getattr(session, "packet_filter", None)
    if not isinstance(packet_filter, PacketFilter):
        packet_filter = getattr(getattr(session, "config", None), "packet_filter", None)
    return list(packet_filter.notes) if isinstance(packet_filter, PacketFilter) else []


def packet_filter_from_args(args: argparse.Namespace) -> PacketFilter:
    return read_packet_filter(ConfigInput.from_args(args))


def _read_pid(values: ConfigInput) -> int | None:
    text = values.text("pid")
    if text is not None and (not text.isdigit() or int(text) <= 0):
        raise ConfigError("pid", f"{text!r} is not a process id", flag="--pid")
    return int(text) if text is not None else None


def _read_comm(values: ConfigInput) -> str | None:
    comm = values.text("comm")
    if comm is not None and not 0 < len(comm) <= 15:
        problem = f"{comm!r} must be 1 to 15 characters, as the kernel keeps it"
        raise ConfigError("comm", problem, flag="--comm")
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
    pid = _read_pid(values)
    if pid is not None:
        check_process(pid)
    return TaskSelection(
        pid=pid,
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
            raise ConfigError(
                "proto",
                f"{proto_text!r} is an unknown protocol: use tcp, udp, icmp, icmpv6, sctp or a number 0-255",
                flag="--proto",
            )
    pid, comm = _read_pid(values), _read_comm(values)
    dev = values.text("dev")
    if dev is not None and not 0 < len(dev) <= 15:
        raise ConfigError("dev", f"{dev!r} is not an interface name (1 to 15 characters)", flag="--dev")
    family = values.raw("family")
    if family not in (None, 4, 6):
        raise ConfigError("family", f"must be 4 or 6 (-4 or -6), not {family!r}")
    netns = values.text("netns")
    if resolve_netns is None:
        from netsleuth.kernel.netns import resolve_netns_arg

        resolve_netns = resolve_netns_arg

    def port(key: str) -> int | None:
        text = values.text(key)
        return parse_port(text, f"--{key}") if text is not None else None

    hosts = tuple(parse_network(text, "host") for text in values.texts("host"))
    sources = tuple(parse_network(text, "src") for text in values.texts("src"))
    destinations = tuple(parse_network(text, "dst") for text in values.texts("dst"))
    # -6 with an IPv4 address (or -4 with an IPv6 one) would match nothing, silently: say so instead.
    for network in (*hosts, *sources, *destinations):
        if family is not None and network.version != family:
            raise ConfigError(
                "family",
                f"contradicts the IPv{network.version} address {network}: drop one of them",
                flag=f"-{family}",
            )
    netns_inode, netns_set = _read_namespaces(values, netns, resolve_netns)
    packet_filter = PacketFilter(
        proto=proto,
        hosts=hosts,
        sources=sources,
        destinations=destinations,
        port=port("port"),
        sport=port("sport"),
        dport=port("dport"),
        pid=pid,
        comm=comm,
        netns=netns_inode,
        dev=dev,
        family=family,
        netns_set=netns_set,
    )
    return on_this_host(packet_filter)


def read_tcp_filter(values: ConfigInput) -> PacketFilter:
    """The filters of a diagnostic that traces TCP sockets (conn), minus the ones that cannot apply to them
    (the typed configs' rule: netsleuth.diagnostics.tcp.records.TcpConfig)."""
    packet_filter = read_packet_filter(values)
    if packet_filter.proto not in (None, 6):
        raise UsageError("this command traces TCP: --proto can only be tcp")
    if packet_filter.dev is not None:
        raise UsageError("--dev does not apply here: TCP events belong to sockets, not interfaces")
    return packet_filter


def _read_namespaces(
    values: ConfigInput, netns: str | None, resolve_netns: Callable[[str], int]
) -> tuple[int | None, frozenset[int]]:
    pod, k8s_namespace = values.text("pod"), values.text("k8s_namespace")
    choices = (("--netns", netns), ("--pod", pod), ("--k8s-namespace", k8s_namespace))
    given = [option for option, value in choices if value is not None]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} each choose the network namespace: give one of them")
    return resolve_namespaces(netns, pod, k8s_namespace, resolve_netns)


def resolve_namespaces(
    netns: str | None, pod: str | None, k8s_namespace: str | None, resolve_netns: Callable[[str], int]
) -> tuple[int | None, frozenset[int]]:
    """--netns, --pod or --k8s-namespace (at most one of them is given) as the kernel filters them: one
    namespace inode, or the set of a Kubernetes namespace's pods' namespaces (one inode when it has one pod
    here)."""
    if netns is not None:
        return resolve_netns(netns), frozenset()
    if _ELSEWHERE.get():  # pods are the agent's to resolve, when the task reaches it
        from netsleuth.kernel.pods import parse_k8s_namespace_arg, parse_pod_arg

        if pod is not None:
            parse_pod_arg(pod)
        if k8s_namespace is not None:
            parse_k8s_namespace_arg(k8s_namespace)
        return None, frozenset()
    if pod is not None:
        from netsleuth.kernel.pods import resolve_pod_arg

        return resolve_pod_arg(pod).netns, frozenset()
    if k8s_namespace is not None:
        from netsleuth.kernel.pods import resolve_k8s_namespace_arg

        inodes = frozenset(found.netns for found in resolve_k8s_namespace_arg(k8s_namespace) if found.netns)
        return (next(iter(inodes)), frozenset()) if len(inodes) == 1 else (None, inodes)
    return None, frozenset()
