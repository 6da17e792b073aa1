"""A read-only client of the container runtime's CRI API (runtime.v1 RuntimeService) on its unix socket.

netsleuth asks the runtime (containerd's CRI plugin, CRI-O) which pod sandboxes and containers run here:
ListPodSandbox gives each sandbox's Kubernetes namespace, pod name, UID and labels; PodSandboxStatus with
`verbose` gives the runtime's own view of the sandbox as JSON in `info["info"]`, whose OCI runtime spec names
the network namespace file (`linux.namespaces[type=network].path`, /var/run/netns/cni-... for containerd) and
whose `pid` is the sandbox's pause process; ListContainers gives the containers and their names. That is all
it reads: it never creates, stops or execs anything.

The messages are written out here by field number from the published definitions
(k8s.io/cri-api pkg/apis/runtime/v1/api.proto) and encoded by netsleuth.kernel.cri_wire; gRPC comes from
grpcio, imported only when a socket is really there, so hosts without a container runtime never load it.
The runtime's socket is found like crictl finds it: CONTAINER_RUNTIME_ENDPOINT, else the first of the usual
paths that exists.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.cri_wire import Fields, WireError, encode_message, encode_string, encode_varint_field

if TYPE_CHECKING:
    import grpc

__all__ = [
    "DEFAULT_ENDPOINTS",
    "ENDPOINT_VARIABLE",
    "CriClient",
    "CriContainer",
    "CriError",
    "CriSandbox",
    "RuntimeVersion",
    "SandboxDetail",
    "endpoint_socket",
    "find_endpoint",
]

# crictl's defaults (containerd, CRI-O, cri-dockerd), and k3s's containerd.
DEFAULT_ENDPOINTS = (
    "unix:///run/containerd/containerd.sock",
    "unix:///run/crio/crio.sock",
    "unix:///var/run/cri-dockerd.sock",
    "unix:///run/k3s/containerd/containerd.sock",
)
ENDPOINT_VARIABLE = "CONTAINER_RUNTIME_ENDPOINT"  # the variable crictl and the kubelet's docs use
_SERVICE = "/runtime.v1.RuntimeService/"
_CALL_TIMEOUT_S = 2.0

# Enum values of runtime.v1 (api.proto).
_SANDBOX_STATES = {0: "ready", 1: "notready"}
_CONTAINER_STATES = {0: "created", 1: "running", 2: "exited", 3: "unknown"}
_Decoded = TypeVar("_Decoded")
_NAMESPACE_MODE_NODE = 2  # NamespaceMode NODE: the pod shares the host's network namespace (hostNetwork)


class CriError(EnvironmentProblem):
    """The runtime could not be asked: no socket, no grpcio, or a call failed."""


def endpoint_socket(endpoint: str) -> str:
    """The socket path of an endpoint (`unix:///run/x.sock` or a bare path)."""
    return endpoint[len("unix://") :] if endpoint.startswith("unix://") else endpoint


def find_endpoint(
    environ: Mapping[str, str] = os.environ, candidates: Sequence[str] = DEFAULT_ENDPOINTS
) -> str | None:
    """The runtime's endpoint: CONTAINER_RUNTIME_ENDPOINT when set (even when nothing listens there, so a
    wrong setting is reported rather than passed over), else the first default whose socket exists."""
    configured = environ.get(ENDPOINT_VARIABLE, "").strip()
    if configured:
        return configured if "://" in configured else f"unix://{configured}"
    for candidate in candidates:
        if os.path.exists(endpoint_socket(candidate)):
            return candidate
    return None


@dataclass(frozen=True, slots=True)
class RuntimeVersion:
    runtime_name: str
    runtime_version: str
    runtime_api_version: str


@dataclass(frozen=True, slots=True)
class CriSandbox:
    """One pod sandbox as ListPodSandbox gives it (PodSandbox + PodSandboxMetadata)."""

    id: str
    namespace: str  # the Kubernetes namespace
    name: str  # the pod's name
    uid: str
    attempt: int
    state: str  # ready | notready
    created_at_ns: int
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SandboxDetail:
    """What PodSandboxStatus (verbose) adds: where the sandbox's network namespace is."""

    id: str
    ip: str  # "" before the network is set up, or on the host's network
    host_network: bool
    netns_path: str | None  # the namespace file (the OCI spec's network namespace path)
    pid: int | None  # the sandbox's own process (pause), whose /proc/PID/ns/net is the namespace too


@dataclass(frozen=True, slots=True)
class CriContainer:
    """One container as ListContainers gives it (Container + ContainerMetadata)."""

    id: str
    sandbox_id: str
    name: str
    attempt: int
    state: str  # created | running | exited | unknown
    image: str
    labels: Mapping[str, str] = field(default_factory=dict)


def _sandbox_metadata(message: Fields) -> tuple[str, str, str, int]:
    """PodSandboxMetadata: name = 1, uid = 2, namespace = 3, attempt = 4."""
    return message.string(3), message.string(1), message.string(2), message.integer(4)


def decode_sandboxes(body: bytes) -> list[CriSandbox]:
    """ListPodSandboxResponse: items = 1, each a PodSandbox (id = 1, metadata = 2, state = 3,
    created_at = 4, labels = 5)."""
    sandboxes = []
    for item in Fields(body).messages(1):
        namespace, name, uid, attempt = _sandbox_metadata(item.message(2))
        sandboxes.append(
            CriSandbox(
                id=item.string(1),
                namespace=namespace,
                name=name,
                uid=uid,
                attempt=attempt,
                state=_SANDBOX_STATES.get(item.integer(3), "unknown"),
                created_at_ns=item.integer(4),
                labels=item.string_map(5),
            )
        )
    return sandboxes


def _network_namespace(info: Mapping[str, Any]) -> str | None:
    """The network namespace file in the verbose info's OCI runtime spec (linux.namespaces)."""
    spec = info.get("runtimeSpec")
    linux = spec.get("linux") if isinstance(spec, dict) else None
    namespaces = linux.get("namespaces") if isinstance(linux, dict) else None
    for namespace in namespaces if isinstance(namespaces, list) else ():
        if isinstance(namespace, dict) and namespace.get("type") == "network":
            path = namespace.get("path")
            return path if isinstance(path, str) and path else None
    return None


def decode_sandbox_status(body: bytes) -> SandboxDetail:
    """PodSandboxStatusResponse: status = 1 (PodSandboxStatus: id = 1, network = 5 {ip = 1},
    linux = 6 {namespaces = 1 {options = 2 {network = 1}}}), info = 2 (a map; its "info" is the runtime's
    JSON)."""
    response = Fields(body)
    status = response.message(1)
    mode = status.message(6).message(1).message(2).integer(1)
    info_text = response.string_map(2).get("info", "")
    try:
        info = json.loads(info_text) if info_text else {}
    except ValueError:
        info = {}
    if not isinstance(info, dict):
        info = {}
    pid = info.get("pid")
    return SandboxDetail(
        id=status.string(1),
        ip=status.message(5).string(1),
        host_network=mode == _NAMESPACE_MODE_NODE,
        netns_path=None if mode == _NAMESPACE_MODE_NODE else _network_namespace(info),
        pid=pid if isinstance(pid, int) and pid > 0 else None,
    )


def decode_containers(body: bytes) -> list[CriContainer]:
    """ListContainersResponse: containers = 1, each a Container (id = 1, pod_sandbox_id = 2,
    metadata = 3 {name = 1, attempt = 2}, image = 4 {image = 1}, state = 6, labels = 8)."""
    containers = []
    for item in Fields(body).messages(1):
        metadata = item.message(3)
        containers.append(
            CriContainer(
                id=item.string(1),
                sandbox_id=item.string(2),
                name=metadata.string(1),
                attempt=metadata.integer(2),
                state=_CONTAINER_STATES.get(item.integer(6), "unknown"),
                image=item.message(4).string(1),
                labels=item.string_map(8),
            )
        )
    return containers


def _identity(body: bytes) -> bytes:
    return body


class CriClient:
    """Calls on one runtime endpoint. `close()` (or `with`) releases the channel."""

    def __init__(self, endpoint: str, timeout: float = _CALL_TIMEOUT_S) -> None:
        self.endpoint = endpoint if "://" in endpoint else f"unix://{endpoint}"
        self.timeout = timeout
        socket = endpoint_socket(self.endpoint)
        if not os.path.exists(socket):
            raise CriError(f"no container runtime socket at {socket}")
        try:
            import grpc
        except ImportError as error:
            raise CriError(
                "naming pods needs grpcio to talk to the container runtime: pip install 'netsleuth[cri]'"
            ) from error
        self._grpc = grpc
        self._channel: grpc.Channel = grpc.insecure_channel(self.endpoint)
        self._calls: dict[str, Callable[..., bytes]] = {}

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def call(self, method: str, request: bytes) -> bytes:
        """One unary call of runtime.v1.RuntimeService with an encoded request; the encoded reply."""
        stub = self._calls.get(method)
        if stub is None:
            stub = self._channel.unary_unary(
                _SERVICE + method, request_serializer=_identity, response_deserializer=_identity
            )
            self._calls[method] = stub
        try:
            return stub(request, timeout=self.timeout)
        except self._grpc.RpcError as error:
            raise CriError(_rpc_sentence(method, self.endpoint, error)) from None

    def version(self) -> RuntimeVersion:
        """Version (VersionRequest: version = 1; VersionResponse: runtime_name = 2, runtime_version = 3,
        runtime_api_version = 4)."""
        reply = Fields(self.call("Version", encode_string(1, "v1")))
        return RuntimeVersion(reply.string(2), reply.string(3), reply.string(4))

    def sandboxes(self) -> list[CriSandbox]:
        """Every pod sandbox, ready or not (ListPodSandboxRequest with no filter)."""
        return _decoded(decode_sandboxes, self.call("ListPodSandbox", b""))

    def sandbox_detail(self, sandbox_id: str) -> SandboxDetail:
        """PodSandboxStatusRequest: pod_sandbox_id = 1, verbose = 2."""
        request = encode_string(1, sandbox_id) + encode_varint_field(2, True)
        return _decoded(decode_sandbox_status, self.call("PodSandboxStatus", request))

    def containers(self, sandbox_id: str = "") -> list[CriContainer]:
        """Every container, or one sandbox's (ListContainersRequest: filter = 1 {pod_sandbox_id = 3})."""
        request = encode_message(1, encode_string(3, sandbox_id))
        return _decoded(decode_containers, self.call("ListContainers", request))


def _decoded(decode: Callable[[bytes], _Decoded], body: bytes) -> _Decoded:
    try:
        return decode(body)
    except WireError as error:
        raise CriError(f"the container runtime sent a reply netsleuth cannot read: {error}") from None


def _rpc_sentence(method: str, endpoint: str, error: grpc.RpcError) -> str:
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    name = code().name if callable(code) else "error"
    text = details() if callable(details) else str(error)
    return f"the container runtime at {endpoint} refused {method}: {name} ({text})"
