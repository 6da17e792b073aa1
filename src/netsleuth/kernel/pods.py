"""Pods by network namespace and by container: what the container runtime (CRI) says runs on this host.

A drop, reset or DNS answer names a network namespace inode and, when a process owns it, a container id (from
the process's cgroup path, netsleuth.kernel.process). On a Kubernetes node the operator knows neither: they
know the pod. `PodIndex` asks the runtime (netsleuth.kernel.cri) for every pod sandbox, the file of its
network namespace (whose inode is the number BPF programs see) and its containers, and answers:

- `pod_of_netns(inode)`: the pod whose sandbox holds that namespace (a pod's containers all share it);
- `container(id)`: a container's name and pod, by the full or the 12-character id records carry;
- `pods()`, `find(namespace, name)`, `in_namespace(namespace)`: for filters and scopes by pod.

Freshness. containerd 1.6's CRI has no event stream (GetContainerEvents answers UNIMPLEMENTED; it came with
1.7), so the index is refreshed on a miss: a namespace or container it does not know makes it ask the runtime
again, at most once per `min_refresh_s`, and anything it knows is asked again once older than `max_age_s` (a
pod deleted and its namespace inode reused). A refresh is two calls (ListPodSandbox, ListContainers) plus one
PodSandboxStatus per sandbox not seen before; sandboxes' namespaces never change, so they are asked once.

Cost on a host without a runtime: none. No socket found (CONTAINER_RUNTIME_ENDPOINT, or crictl's default
paths) means no grpc import and every lookup answers None at once; the paths are looked at again at most
every `max_age_s`, for a runtime started after netsleuth.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.kernel.cri import (
    DEFAULT_ENDPOINTS,
    ENDPOINT_VARIABLE,
    CriClient,
    CriError,
    CriSandbox,
    SandboxDetail,
    find_endpoint,
)

__all__ = [
    "Pod",
    "PodContainer",
    "PodIndex",
    "parse_k8s_namespace_arg",
    "parse_pod_arg",
    "resolve_k8s_namespace_arg",
    "resolve_pod_arg",
]

_LOG = logging.getLogger("netsleuth.pods")
_FAILURE_BACKOFF_S = 10.0  # a runtime that failed is not asked again sooner (a lookup must never stall)


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod sandbox: its Kubernetes identity, where its network is, what runs in it."""

    namespace: str
    name: str
    uid: str
    sandbox_id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    netns: int | None = None  # the network namespace inode; None on the host's network or once stopped
    ip: str = ""
    containers: tuple[str, ...] = ()  # container names, sorted

    @property
    def ref(self) -> str:
        """`namespace/name`, as kubectl spells a pod across namespaces."""
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> dict[str, str]:
        """What a record carries of its pod (netsleuth.spec.parts.PodRef)."""
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


@dataclass(frozen=True, slots=True)
class PodContainer:
    id: str
    name: str
    pod: Pod


ClientFactory = Callable[[str], CriClient]


class PodIndex:
    """netns inode → pod and container id → container, from the runtime at `endpoint` (found like crictl
    finds it when None). Thread-safe: the agent's collectors and sessions share one."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        proc_root: str = "/proc",
        min_refresh_s: float = 1.0,
        max_age_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        client_factory: ClientFactory = CriClient,
        environ: Mapping[str, str] = os.environ,
        candidates: Sequence[str] = DEFAULT_ENDPOINTS,
    ) -> None:
        self._configured = endpoint
        self._environ = environ
        self._candidates = tuple(candidates)
        self.proc_root = proc_root
        self.min_refresh_s = min_refresh_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._client_factory = client_factory
        self._lock = threading.Lock()
        self._client: CriClient | None = None
        self._endpoint: str | None = None
        self._looked_for_endpoint: float | None = None
        self._refreshed_at: float | None = None
        self._failed_at: float | None = None
        self._details: dict[str, SandboxDetail] = {}  # sandbox id → its status (asked once)
        self._by_netns: dict[int, Pod] = {}
        self._by_container: dict[str, PodContainer] = {}  # full id → container
        self._pods: list[Pod] = []
        self.refreshes = 0  # how many times the runtime was asked (tests, self-reported cost)
        self.problem: str | None = None  # why the last refresh failed, None when it worked

    # -- the runtime ---------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str | None:
        """The runtime endpoint in use, None when this host has none (looked for at most every max_age_s)."""
        now = self._clock()
        if self._endpoint is None and (
            self._looked_for_endpoint is None or now - self._looked_for_endpoint >= self.max_age_s
        ):
            self._looked_for_endpoint = now
            self._endpoint = self._configured or find_endpoint(self._environ, self._candidates)
        return self._endpoint

    @property
    def available(self) -> bool:
        """A runtime socket is configured or found (whether it answers is `problem`)."""
        return self.endpoint is not None

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def refresh(self) -> None:
        """Ask the runtime now. A failure keeps what was known and is kept in `problem` (and logged once)."""
        endpoint = self.endpoint
        if endpoint is None:
            return
        with self._lock:
            self._refresh_locked(endpoint)

    def _refresh_locked(self, endpoint: str) -> None:
        now = self._clock()
        self.refreshes += 1
        try:
            if self._client is None:
                self._client = self._client_factory(endpoint)
            sandboxes = self._client.sandboxes()
            containers = self._client.containers()
            details = {}
            for sandbox in sandboxes:
                if sandbox.state != "ready":
                    continue  # a stopped sandbox's namespace is gone; its containers are still named below
                known = self._details.get(sandbox.id)
                details[sandbox.id] = known if known is not None else self._client.sandbox_detail(sandbox.id)
        except CriError as error:
            if self.problem != str(error):
                _LOG.warning("pods cannot be named: %s", error)
            self.problem = str(error)
            self._failed_at = now
            self._refreshed_at = now
            return
        names: dict[str, list[str]] = {}
        for container in containers:
            names.setdefault(container.sandbox_id, []).append(container.name)
        pods: dict[str, Pod] = {}
        by_netns: dict[int, Pod] = {}
        # Oldest first, so when two sandboxes of one pod are ready (a restart under way) the newest wins.
        for sandbox in sorted(sandboxes, key=lambda item: item.created_at_ns):
            detail = details.get(sandbox.id)
            netns = self._netns_inode(detail) if detail is not None else None
            pod = _pod(sandbox, detail, netns, tuple(sorted(set(names.get(sandbox.id, ())))))
            pods[sandbox.id] = pod
            if netns is not None:
                by_netns[netns] = pod
        by_container = {
            container.id: PodContainer(container.id, container.name, pods[container.sandbox_id])
            for container in containers
            if container.sandbox_id in pods
        }
        self._details = details
        self._pods = sorted(pods.values(), key=lambda pod: (pod.namespace, pod.name, pod.sandbox_id))
        self._by_netns, self._by_container = by_netns, by_container
        if self.problem is not None:
            _LOG.info("pods are named again: the container runtime at %s answers", endpoint)
        self.problem = None
        self._failed_at = None
        self._refreshed_at = now

    def _netns_inode(self, detail: SandboxDetail) -> int | None:
        """The inode of the sandbox's namespace file; through its pause process when the file is not visible
        here (an agent in a container with the host's pids but not the host's /var/run/netns)."""
        if detail.host_network:
            return None
        candidates = []
        if detail.netns_path:
            candidates.append(detail.netns_path)
        if detail.pid:
            candidates.append(os.path.join(self.proc_root, str(detail.pid), "ns", "net"))
        for path in candidates:
            try:
                return os.stat(path).st_ino
            except OSError:
                continue
        return None

    def _refresh_if(self, missing: bool) -> None:
        """Refresh when something asked for is unknown (at most every min_refresh_s) or when what is known
        is older than max_age_s; never sooner than the back-off after a failure."""
        endpoint = self.endpoint
        if endpoint is None:
            return
        with self._lock:
            now = self._clock()
            if self._failed_at is not None and now - self._failed_at < _FAILURE_BACKOFF_S:
                return
            age = None if self._refreshed_at is None else now - self._refreshed_at
            if age is None or age >= self.max_age_s or (missing and age >= self.min_refresh_s):
                self._refresh_locked(endpoint)

    # -- lookups -------------------------------------------------------------------------------------------
    def pod_of_netns(self, inode: int) -> Pod | None:
        """The pod whose network namespace this is; None for the host's and any other namespace."""
        if not inode:
            return None
        self._refresh_if(inode not in self._by_netns)
        return self._by_netns.get(inode)

    def container(self, container_id: str) -> PodContainer | None:
        """A container by its full id or a prefix of it (the 12 characters records carry)."""
        if not container_id:
            return None
        found = self._container(container_id)
        if found is None:
            self._refresh_if(True)
            found = self._container(container_id)
        else:
            self._refresh_if(False)
        return found

    def _container(self, container_id: str) -> PodContainer | None:
        exact = self._by_container.get(container_id)
        if exact is not None or len(container_id) >= 64:
            return exact
        return next(
            (found for full, found in self._by_container.items() if full.startswith(container_id)), None
        )

    def pods(self) -> list[Pod]:
        """Every pod sandbox the runtime knows, by namespace and name (asked again when due)."""
        self._refresh_if(False)
        return list(self._pods)

    def find(self, namespace: str, name: str) -> Pod | None:
        """The ready sandbox of pod `namespace/name` (asks the runtime again when not known yet)."""
        found = self._find(namespace, name)
        if found is None:
            self._refresh_if(True)
            found = self._find(namespace, name)
        return found

    def _find(self, namespace: str, name: str) -> Pod | None:
        matches = [pod for pod in self._pods if pod.namespace == namespace and pod.name == name]
        ready = [pod for pod in matches if pod.netns is not None]
        chosen = ready or matches
        return chosen[-1] if chosen else None

    def in_namespace(self, namespace: str) -> list[Pod]:
        """The pods of one Kubernetes namespace (asks again when none is known yet)."""
        found = [pod for pod in self._pods if pod.namespace == namespace]
        if not found:
            self._refresh_if(True)
            found = [pod for pod in self._pods if pod.namespace == namespace]
        return found


def _pod(
    sandbox: CriSandbox, detail: SandboxDetail | None, netns: int | None, containers: tuple[str, ...]
) -> Pod:
    return Pod(
        namespace=sandbox.namespace,
        name=sandbox.name,
        uid=sandbox.uid,
        sandbox_id=sandbox.id,
        labels=dict(sandbox.labels),
        netns=netns,
        ip=detail.ip if detail is not None else "",
        containers=containers,
    )


def _index_for(option: str, index: PodIndex | None) -> PodIndex:
    index = index if index is not None else PodIndex()
    if not index.available:
        raise UsageError(
            f"{option} names a Kubernetes pod, and this host has no container runtime socket to ask "
            f"(set {ENDPOINT_VARIABLE}, e.g. unix:///run/containerd/containerd.sock)"
        )
    index.refresh()
    if index.problem is not None:
        raise EnvironmentProblem(f"{option} cannot be resolved: {index.problem}")
    return index


def parse_pod_arg(text: str) -> tuple[str, str]:
    """`--pod NAMESPACE/NAME` as (namespace, name), its form only checked."""
    namespace, _, name = text.strip().partition("/")
    if not namespace or not name or "/" in name:
        raise UsageError(f"--pod {text!r} is not NAMESPACE/NAME (e.g. team-a/web-1)")
    return namespace, name


def parse_k8s_namespace_arg(text: str) -> str:
    namespace = text.strip()
    if not namespace or "/" in namespace:
        raise UsageError(f"--k8s-namespace {text!r} is not a Kubernetes namespace name (e.g. team-a)")
    return namespace


def resolve_pod_arg(text: str, index: PodIndex | None = None) -> Pod:
    """`--pod NAMESPACE/NAME` → the pod running here, with a network namespace of its own."""
    namespace, name = parse_pod_arg(text)
    found = _index_for("--pod", index).find(namespace, name)
    if found is None:
        raise UsageError(f"no pod {namespace}/{name} runs on this host")
    if found.netns is None:
        raise UsageError(
            f"pod {found.ref} shares the host's network namespace (hostNetwork): its packets cannot be "
            "told apart from the host's"
        )
    return found


def resolve_k8s_namespace_arg(text: str, index: PodIndex | None = None) -> list[Pod]:
    """`--k8s-namespace NAMESPACE` → its pods running here with network namespaces of their own."""
    namespace = parse_k8s_namespace_arg(text)
    pods = [pod for pod in _index_for("--k8s-namespace", index).in_namespace(namespace) if pod.netns]
    if not pods:
        raise UsageError(f"no pod of Kubernetes namespace {namespace} runs on this host")
    return pods
