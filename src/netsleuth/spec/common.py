"""The config fields most diagnostics share, declared once: how a run goes (`RunConfig`), which processes a
process diagnostic watches (`TaskConfig`), which packets a packet diagnostic watches (`PacketConfig`).

A diagnostic's config subclasses one of them (msgspec Structs take one base with fields), so `--dport`,
`--netns` and `--sample` are the same field, with the same checks and sentences, everywhere. A socket
diagnostic (resets, tcp) takes `SocketConfig`: a packet's filters without the interface, which its events
do not have (`--dev` is then no flag of it).

A diagnostic that only counts in the kernel and reports at the end (softirq, profile) prints no events, so
neither `--summary` nor `--sample` means anything for it: its config subclasses `CountConfig` (or
`TaskCountConfig`, with the task filters), where both are fixed class attributes (the run loop reads them of
every config) and no options - an agent session giving them is told they are not options of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from netsleuth.spec.configs import Config, ConfigError
from netsleuth.spec.options import (
    FILTERS,
    Comm,
    Ifname,
    IpNetwork,
    K8sNamespace,
    NetnsRef,
    Opt,
    Pid,
    PodName,
    Port,
    Proto,
    Sample,
    Seconds,
)

if TYPE_CHECKING:
    from netsleuth.diagnostics.filters import PacketFilter, TaskSelection
    from netsleuth.kernel.netns import NetnsNames

__all__ = ["CountConfig", "PacketConfig", "RunConfig", "SocketConfig", "TaskConfig", "TaskCountConfig"]

_NETNS_HELP = "network namespace: inode, `ip netns` name, or /proc/PID/ns/net"

# Fields two config classes declare alike (a msgspec Struct takes its fields from one base only).
_Duration = Annotated[Seconds | None, Opt("stop after this long", metavar="SECONDS")]
_TaskPid = Annotated[Pid | None, Opt("process id", label="process id", group=FILTERS)]
_TaskComm = Annotated[
    Comm | None, Opt("process name (as in /proc/PID/comm)", label="process name", group=FILTERS)
]
_TaskNetns = Annotated[NetnsRef | None, Opt(_NETNS_HELP, label="network namespace", group=FILTERS)]
_TaskCgroup = Annotated[
    str | None, Opt("cgroup v2 path (e.g. /system.slice/nginx.service) or id", group=FILTERS)
]


class RunConfig(Config, frozen=True, kw_only=True):
    """How a run goes, whatever it traces."""

    summary: Annotated[bool, Opt("count in the kernel, report groups at the end, print no events")] = False
    sample: Annotated[Sample, Opt("print one event in N (totals stay exact)", metavar="N")] = 1
    duration: _Duration = None


class CountConfig(Config, frozen=True, kw_only=True):
    """How a run goes for a diagnostic that only counts and reports at the end: always a summary, nothing
    to sample (neither is an option)."""

    summary: ClassVar[bool] = True
    sample: ClassVar[int] = 1
    duration: _Duration = None


def _task_selection(
    pid: int | None, comm: str | None, netns: str | None, cgroup: str | None, names: NetnsNames | None
) -> TaskSelection:
    from netsleuth.diagnostics.filters import TaskSelection, check_process
    from netsleuth.kernel.cgroups import resolve_cgroup_arg
    from netsleuth.kernel.netns import resolve_netns_arg

    if pid is not None:
        check_process(pid)
    return TaskSelection(
        pid=pid,
        comm=comm,
        netns=resolve_netns_arg(netns, names) if netns is not None else None,
        cgroup_id=resolve_cgroup_arg(cgroup) if cgroup is not None else None,
    )


class TaskConfig(RunConfig, frozen=True, kw_only=True):
    """Which tasks a process diagnostic watches (snoop)."""

    pid: _TaskPid = None
    comm: _TaskComm = None
    netns: _TaskNetns = None
    cgroup: _TaskCgroup = None

    def task_selection(self, names: NetnsNames | None = None) -> TaskSelection:
        """The selection resolved on this host: the namespace and cgroup as the kernel knows them."""
        return _task_selection(self.pid, self.comm, self.netns, self.cgroup, names)


class TaskCountConfig(CountConfig, frozen=True, kw_only=True):
    """Which tasks a diagnostic that only counts watches (profile): TaskConfig's filters."""

    pid: _TaskPid = None
    comm: _TaskComm = None
    netns: _TaskNetns = None
    cgroup: _TaskCgroup = None

    def task_selection(self, names: NetnsNames | None = None) -> TaskSelection:
        """The selection resolved on this host: the namespace and cgroup as the kernel knows them."""
        return _task_selection(self.pid, self.comm, self.netns, self.cgroup, names)


class SocketConfig(RunConfig, frozen=True, kw_only=True):
    """Which packets a socket diagnostic watches (resets, tcp): every filter of a packet but the interface,
    which a socket's events do not have. Every filter is applied in the kernel."""

    proto: Annotated[
        Proto | None,
        Opt("L4 protocol: tcp, udp, icmp, icmpv6, sctp or a number", label="protocol", group=FILTERS),
    ] = None
    host: Annotated[
        tuple[IpNetwork, ...],
        Opt("either address (repeatable)", label="either address", metavar="ADDR[/LEN]", group=FILTERS),
    ] = ()
    src: Annotated[
        tuple[IpNetwork, ...],
        Opt("source address (repeatable)", label="source address", metavar="ADDR[/LEN]", group=FILTERS),
    ] = ()
    dst: Annotated[
        tuple[IpNetwork, ...],
        Opt(
            "destination address (repeatable)",
            label="destination address",
            metavar="ADDR[/LEN]",
            group=FILTERS,
        ),
    ] = ()
    port: Annotated[Port | None, Opt("either port", label="either port", group=FILTERS)] = None
    sport: Annotated[Port | None, Opt("source port", label="source port", group=FILTERS)] = None
    dport: Annotated[Port | None, Opt("destination port", label="destination port", group=FILTERS)] = None
    pid: Annotated[
        Pid | None,
        Opt(
            "process id: the sending task or the owner of the packet's socket",
            label="process id",
            group=FILTERS,
        ),
    ] = None
    comm: Annotated[
        Comm | None, Opt("process name (as in /proc/PID/comm)", label="process name", group=FILTERS)
    ] = None
    netns: Annotated[NetnsRef | None, Opt(_NETNS_HELP, label="network namespace", group=FILTERS)] = None
    pod: Annotated[
        PodName | None,
        Opt("a Kubernetes pod on this host (its network namespace)", metavar="NAMESPACE/NAME", group=FILTERS),
    ] = None
    k8s_namespace: Annotated[
        K8sNamespace | None,
        Opt(
            "the pods of a Kubernetes namespace on this host (their network namespaces)",
            label="Kubernetes namespace",
            metavar="NAMESPACE",
            group=FILTERS,
        ),
    ] = None
    family: Annotated[
        Literal[4, 6] | None,
        Opt("IP version only", label="IP version", consts={"-4": 4, "-6": 6}, group=FILTERS),
    ] = None

    def check(self) -> None:
        # -6 with an IPv4 address (or -4 with an IPv6 one) would match nothing, silently: say so instead.
        for networks in (self.host, self.src, self.destinations()):
            for network in networks:
                if self.family is not None and network.version != self.family:
                    raise ConfigError(
                        "family",
                        f"contradicts the IPv{network.version} address {network}: drop one of them",
                        flag=f"-{self.family}",
                    )
        # A pod and a Kubernetes namespace are network namespaces too: the kernel filters by one choice.
        chosen = [name for name in ("netns", "pod", "k8s_namespace") if getattr(self, name) is not None]
        if len(chosen) > 1:
            first, second = (_flag(name) for name in chosen[:2])
            raise ConfigError(
                chosen[1],
                f"and {first} each choose the network namespace: give one of them",
                flag=second,
            )

    def device(self) -> str | None:
        """The interface filter: none here (PacketConfig has one)."""
        return None

    def destinations(self) -> tuple[IpNetwork, ...]:
        """The destination address filter (conn's --dst names a server end that may carry its port)."""
        return self.dst

    def packet_filter(self, names: NetnsNames | None = None) -> PacketFilter:
        """The filter resolved on this host (the namespace - given as one, a pod or a Kubernetes namespace
        - as inodes, the protocol as a number): what each program's loader writes into its kernel config. A
        name this host does not have is a UsageError."""
        from netsleuth.diagnostics.filters import PacketFilter, on_this_host, resolve_namespaces
        from netsleuth.kernel.netns import resolve_netns_arg
        from netsleuth.packet import proto_number

        proto = self.proto if isinstance(self.proto, int) or self.proto is None else proto_number(self.proto)
        netns, netns_set = resolve_namespaces(
            self.netns, self.pod, self.k8s_namespace, lambda text: resolve_netns_arg(text, names)
        )
        return on_this_host(
            PacketFilter(
                proto=proto,
                hosts=self.host,
                sources=self.src,
                destinations=self.destinations(),
                port=self.port,
                sport=self.sport,
                dport=self.dport,
                pid=self.pid,
                comm=self.comm,
                netns=netns,
                dev=self.device(),
                family=self.family,
                netns_set=netns_set,
            ),
            names,
        )


class PacketConfig(SocketConfig, frozen=True, kw_only=True):
    """Which packets a packet diagnostic watches: a socket diagnostic's filters and the interface."""

    dev: Annotated[Ifname | None, Opt("interface name", label="interface", group=FILTERS)] = None

    def device(self) -> str | None:
        return self.dev


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
