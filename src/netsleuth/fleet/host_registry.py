"""The host registry: a JetStream KV bucket with one entry per host, kept fresh by its agent's heartbeat.

The entry says what the controller needs to choose hosts and to explain a refusal before sending anything:
kernel, probed BPF features, version, labels, the namespaces the agent covers (with their containers, and the
Kubernetes pods its container runtime runs there), when it was last heard from and its last error.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType

from netsleuth import __version__
from netsleuth.fleet.protocol import ENFORCED_SCOPES, HOSTS_BUCKET, HostEntry
from netsleuth.kernel.netns import NetnsNames
from netsleuth.kernel.pods import PodIndex
from netsleuth.kernel.process import container_of

__all__ = ["ensure_hosts_bucket", "host_entry", "probe_features"]

_MAX_CONTAINERS = 256
_MAX_PODS = 256


async def ensure_hosts_bucket(js: JetStreamContext, replicas: int = 1) -> None:
    """Create the bucket if missing (the controller and the lab do; agents are not allowed to).
    history=1: only the latest entry matters; direct gets on, for the agents' clock measurement (served by
    any replica of a replicated bucket)."""
    await js.create_key_value(
        KeyValueConfig(
            bucket=HOSTS_BUCKET, history=1, storage=StorageType.FILE, direct=True, replicas=replicas
        )
    )


def probe_features() -> dict[str, Any]:
    """Probed once per agent start: the probes load programs, which is not for every heartbeat."""
    try:
        from netsleuth.bpf.features import probe_all

        return dict(probe_all())
    except Exception as error:  # a host that cannot probe is still listed, saying why
        return {"error": str(error)}


def _namespaces(names: NetnsNames, scope_netns: str) -> list[dict[str, Any]]:
    known = names.names()
    if scope_netns:
        inode = known.get(scope_netns)
        return [{"name": scope_netns, "inode": inode}] if inode is not None else []
    return [{"name": name, "inode": inode} for name, inode in sorted(known.items())]


def _containers(names: NetnsNames, namespaces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for namespace in namespaces:
        inode = namespace.get("inode")
        if not isinstance(inode, int):
            continue
        for pid in names.pids_of(inode):
            container = container_of(pid)
            if container and container not in found:
                found[container] = {"id": container, "netns": namespace["name"]}
            if len(found) >= _MAX_CONTAINERS:
                return list(found.values())
    return list(found.values())


def _pods(index: PodIndex | None, namespaces: list[dict[str, Any]], scope_netns: str) -> list[dict[str, Any]]:
    """The pods this host holds (all of them; with a netns scope, those in the covered namespace)."""
    if index is None or not index.available:
        return []
    covered = {namespace.get("inode") for namespace in namespaces}
    found = [
        {**pod.to_json(), "netns": pod.netns, "labels": dict(pod.labels)}
        for pod in index.pods()
        if pod.netns is not None and (not scope_netns or pod.netns in covered)
    ]
    return found[:_MAX_PODS]


def host_entry(
    host_id: str,
    features: dict[str, Any],
    labels: dict[str, str],
    scope_netns: str,
    names: NetnsNames,
    last_error: str | None,
    diagnostics: tuple[str, ...],
    key_id: str,
    offset_ns: int,
    status: str = "up",
    run_id: str = "",
    pods: PodIndex | None = None,
) -> HostEntry:
    names.refresh()
    namespaces = _namespaces(names, scope_netns)
    now_ns = time.time_ns()
    return HostEntry(
        host=host_id,
        hostname=socket.gethostname(),
        kernel=os.uname().release,
        features=features,
        version=__version__,
        labels=labels,
        namespaces=namespaces,
        containers=_containers(names, namespaces),
        heartbeat=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now_ns / 1e9))
        + f".{now_ns // 1_000_000 % 1000:03d}Z",
        heartbeat_ns=now_ns,
        last_error=last_error,
        status="stopping" if status == "stopping" else "up",
        diagnostics=diagnostics,
        key_id=key_id,
        offset_ns=offset_ns,
        run_id=run_id,
        pods=_pods(pods, namespaces, scope_netns),
        scopes=ENFORCED_SCOPES,
    )
