"""The namespaces of this host as a task's scope names them, resolved once to `Netns` (inode + name): an
`ip netns` name, an inode, a namespace file, a pod (`team-a/web-1`) or a Kubernetes namespace's pods, through
the same resolvers as the CLI's --netns, --pod and --k8s-namespace. A name this host does not have is a
UsageError with the CLI's sentence.

Admission resolves a task's scope here once; what the kernel filter is given and what the last line checks
are the inodes found then, so an `ip netns` name re-pointed after admission changes nothing.
"""

from __future__ import annotations

from typing import Protocol

from netsleuth.kernel.netns import NetnsNames, current_netns_inode, resolve_netns_arg
from netsleuth.kernel.pods import PodIndex, resolve_k8s_namespace_arg, resolve_pod_arg
from netsleuth.spec.scope import Netns

__all__ = ["HostNamespaces", "NamespaceLookup"]


class NamespaceLookup(Protocol):
    def own(self) -> Netns:
        """The agent's own network namespace (the host's, for a whole-host agent)."""
        ...

    def netns(self, text: str) -> Netns:
        """A namespace by `ip netns` name, inode or file; UsageError when this host has none such."""
        ...

    def pod(self, text: str) -> Netns:
        """The namespace of pod NAMESPACE/NAME running here; UsageError when none runs here."""
        ...

    def k8s_namespace(self, name: str) -> tuple[Netns, ...]:
        """The namespaces of a Kubernetes namespace's pods here (at least one); UsageError when none."""
        ...

    def file_of(self, netns: Netns) -> str:
        """A file that enters the namespace (an `ip netns` name where it has one)."""
        ...


class HostNamespaces:
    """This host's namespaces, by the agent's one NetnsNames and PodIndex."""

    def __init__(self, names: NetnsNames, pods: PodIndex | None = None) -> None:
        self._names = names
        self._pods = pods

    def _named(self, inode: int) -> Netns:
        return Netns(inode, self._names.name_of(inode))

    def own(self) -> Netns:
        return self._named(current_netns_inode())

    def netns(self, text: str) -> Netns:
        return self._named(resolve_netns_arg(text, self._names))

    def pod(self, text: str) -> Netns:
        found = resolve_pod_arg(text, self._pods)
        assert found.netns is not None  # resolve_pod_arg refuses a pod on the host's network
        return self._named(found.netns)

    def k8s_namespace(self, name: str) -> tuple[Netns, ...]:
        inodes = {pod.netns for pod in resolve_k8s_namespace_arg(name, self._pods) if pod.netns}
        return tuple(self._named(inode) for inode in sorted(inodes))

    def file_of(self, netns: Netns) -> str:
        if netns.inode == current_netns_inode():
            return "/proc/self/ns/net"
        return netns.name or self._names.path_of(netns.inode) or str(netns.inode)
