"""The packet filter every packet diagnostic's loader writes into its kernel config (`PacketFilter`, what a
typed config resolves to on this host: netsleuth.spec.common), and the checks of what this host has.

Naming something this host does not have is bad input: a `--pid` that is no process here (or is a thread,
while the kernel filters by process), a `--netns` inode nothing holds (kernel/netns.py). An interface is
different: one may appear during the run (a container's veth), so a `--dev` no namespace has now is
accepted with a note (`PacketFilter.notes`), printed when the run starts. These checks run wherever a config
is read on the host that traces it (the CLI, the agent); a controller checking a config meant for other
hosts reads it under `read_for_another_host()`, which checks formats only. `add_filter_arguments` and
`FILTER_KEYS` are the filters as `netsleuth fleet run` offers them for any diagnostic.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from netsleuth.errors import NetsleuthError, UsageError

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
    "read_for_another_host",
    "resolve_namespaces",
]

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class PacketFilter(msgspec.Struct, frozen=True):
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
    extra: dict[str, object] = msgspec.field(default_factory=dict)
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
_TGID = r"^Tgid:\s*(\d+)$"  # compiled by the first --pid check (re caches it), not on every start


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
    found = re.search(_TGID, status, re.MULTILINE)
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
    return msgspec.structs.replace(packet_filter, notes=(note,)) if note else packet_filter


def filter_notes(session: object) -> list[str]:
    """The notes of the packet filter a session runs with: what the CLI prints as it starts and an agent
    session reports, for any diagnostic. A session of a typed config (netsleuth.spec) holds the filter it
    resolved on this host as `packet_filter`; an older one holds it in `config.packet_filter`."""
    packet_filter = getattr(session, "packet_filter", None)
    if not isinstance(packet_filter, PacketFilter):
        packet_filter = getattr(getattr(session, "config", None), "packet_filter", None)
    return list(packet_filter.notes) if isinstance(packet_filter, PacketFilter) else []


class TaskSelection(msgspec.Struct, frozen=True):
    """Which tasks a process-level diagnostic (profile, snoop) watches: --pid, --comm, --netns (inode),
    --cgroup (cgroup v2 id), read with the packet filters' checks and sentences."""

    pid: int | None = None
    comm: str | None = None
    netns: int | None = None
    cgroup_id: int | None = None


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
