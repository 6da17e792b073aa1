"""A host's namespaces as fleet unit tests have them, without `ip netns` or a container runtime: what
admission resolves a scope against (netsleuth.fleet.host_namespaces.NamespaceLookup)."""

from __future__ import annotations

import os

from netsleuth.errors import UsageError
from netsleuth.spec.scope import Netns

__all__ = ["DB", "OWN", "OWN_NETNS", "WEB", "FakeNamespaces"]

OWN = os.stat("/proc/self/ns/net").st_ino  # the namespace the test runs in: "the host's own"
OWN_NETNS = Netns(OWN, None)
WEB = Netns(4026532101, "web")
DB = Netns(4026532102, "db")


class FakeNamespaces:
    """Namespaces by name and inode, pods by NAMESPACE/NAME, Kubernetes namespaces' pods; anything else is
    the UsageError a real host gives."""

    def __init__(
        self,
        known: tuple[Netns, ...] = (WEB, DB),
        pods: dict[str, Netns] | None = None,
        own: Netns = OWN_NETNS,
    ) -> None:
        self._own = own
        self._pods = pods or {}
        every = (*known, *self._pods.values())
        self._known = {netns.name: netns for netns in every if netns.name} | {
            str(netns.inode): netns for netns in (*every, own)
        }

    def own(self) -> Netns:
        return self._own

    def netns(self, text: str) -> Netns:
        found = self._known.get(text)
        if found is None:
            raise UsageError(f"--netns {text!r} is not a network namespace on this host")
        return found

    def pod(self, text: str) -> Netns:
        found = self._pods.get(text)
        if found is None:
            raise UsageError(f"no pod {text} runs on this host")
        return found

    def k8s_namespace(self, name: str) -> tuple[Netns, ...]:
        found = tuple(sorted({netns for pod, netns in self._pods.items() if pod.startswith(name + "/")}))
        if not found:
            raise UsageError(f"no pod of Kubernetes namespace {name} runs on this host")
        return found

    def file_of(self, netns: Netns) -> str:
        return "/proc/self/ns/net" if netns == self._own else (netns.name or str(netns.inode))
