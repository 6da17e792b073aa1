"""nats-server configuration for a netsleuth fleet: who may publish and subscribe to what.

An agent's NATS user reaches only its own host's subjects: it subscribes to `netsleuth.host.<host>.>` (its
tasks, control, pings) and its own reply inbox `_INBOX_<host>.>`; it publishes only its sessions' status and
records (`netsleuth.session.*.<host>.>`), its refusals to the audit (`netsleuth.audit.agent.<host>`), its own
registry key, and the one JetStream API call its clock measurement uses (a direct get of that key);
`allow_responses` lets it answer the requests it receives and nothing else. So a compromised agent cannot
impersonate another host, read another host's tasks, or talk to the controller's API subjects.

The controller has its own user, and it too may publish only as itself: tasks, control and pings to the
hosts, its own audit records and session history - never on an agent's status, records, audit or registry
subjects, so that a subject names its sender whoever holds the controller's login. Its JetStream API is
a list of the calls it makes: it creates its streams and bucket by name, reads them (stream info, message
gets, consumers), and may not create any other stream or update, purge or delete any (a stream of its
own with RePublish would have the server publish on any subject in its stead, past every permission).
Changing an existing stream is the admin's, which is what makes the audit append-only in practice.

The NATS configuration format is a superset of JSON, so values are written as JSON.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netsleuth.fleet.protocol import (
    AGENT_AUDIT_STREAM,
    ALERTS_BUCKET,
    AUDIT_STREAM,
    HOSTS_BUCKET,
    OWNERS_BUCKET,
    PREFIX,
    RECORDS_STREAM,
    SESSIONS_STREAM,
    STATUS_STREAM,
    validate_host_id,
)

__all__ = [
    "ClusterRoutes",
    "NatsUser",
    "agent_permissions",
    "agent_user",
    "authorization",
    "cluster_routes",
    "controller_permissions",
    "example_cluster_configs",
    "example_server_config",
    "new_password",
    "render_server_config",
]


def new_password() -> str:
    return secrets.token_urlsafe(24)


def agent_permissions(host: str) -> dict[str, Any]:
    host = validate_host_id(host)
    return {
        "publish": {
            "allow": [
                f"{PREFIX}.session.*.{host}.>",
                f"{PREFIX}.audit.agent.{host}",
                f"$KV.{HOSTS_BUCKET}.{host}",
                f"$JS.API.DIRECT.GET.KV_{HOSTS_BUCKET}.$KV.{HOSTS_BUCKET}.{host}",
            ]
        },
        "subscribe": {"allow": [f"{PREFIX}.host.{host}.>", f"_INBOX_{host}.>"]},
        "allow_responses": True,
    }


# The streams and buckets (a bucket is the stream KV_<name>) the controller creates at start; nothing else.
CONTROLLER_STREAMS = (
    AUDIT_STREAM,
    AGENT_AUDIT_STREAM,
    SESSIONS_STREAM,
    STATUS_STREAM,
    RECORDS_STREAM,
    f"KV_{HOSTS_BUCKET}",
    f"KV_{OWNERS_BUCKET}",
    f"KV_{ALERTS_BUCKET}",
)


def controller_permissions() -> dict[str, Any]:
    return {
        "publish": {
            "allow": [
                f"{PREFIX}.host.>",  # tasks, control, pings
                f"{PREFIX}.audit.controller.>",
                f"{PREFIX}.history.>",
                f"$KV.{OWNERS_BUCKET}.>",  # the leases of the sessions it runs (controller/leases.py)
                f"$KV.{ALERTS_BUCKET}.>",  # what alerts started (controller/alert_state.py)
                "_INBOX.>",
                "$JS.API.INFO",
                "$JS.API.STREAM.INFO.*",
                *(f"$JS.API.STREAM.CREATE.{name}" for name in CONTROLLER_STREAMS),
                "$JS.API.STREAM.MSG.GET.*",
                "$JS.API.DIRECT.GET.>",
                "$JS.API.CONSUMER.>",  # reading: a consumer cannot deliver where its creator may not publish
                "$JS.FC.>",  # flow-control replies of the registry watch (an ordered consumer)
            ],
        },
        "subscribe": {"allow": [f"{PREFIX}.>", "_INBOX.>", f"$KV.{HOSTS_BUCKET}.>"]},
        "allow_responses": True,
    }


@dataclass(frozen=True)
class NatsUser:
    user: str
    password: str
    permissions: dict[str, Any] | None  # None: everything (an operator's admin user)

    def to_config(self) -> dict[str, Any]:
        body: dict[str, Any] = {"user": self.user, "password": self.password}
        if self.permissions is not None:
            body["permissions"] = self.permissions
        return body


def agent_user(host: str, password: str | None = None) -> NatsUser:
    return NatsUser(f"agent-{validate_host_id(host)}", password or new_password(), agent_permissions(host))


@dataclass(frozen=True)
class ClusterRoutes:
    """The `cluster` block of one member of a NATS cluster: where it listens for the other servers' routes,
    the routes it dials (every member, itself included: nats-server drops the route to itself), and the
    login the members use between themselves (route connections are not clients: no user above applies)."""

    name: str
    host: str
    port: int
    routes: tuple[str, ...]  # nats-route://HOST:PORT of every member
    user: str = "route"
    password: str = ""

    def to_config(self) -> dict[str, Any]:
        login = f"{self.user}:{self.password}@" if self.password else ""
        body: dict[str, Any] = {"name": self.name, "host": self.host, "port": self.port}
        if self.password:
            body["authorization"] = {"user": self.user, "password": self.password}
        body["routes"] = [route.replace("nats-route://", f"nats-route://{login}", 1) for route in self.routes]
        return body


def cluster_routes(
    name: str, members: Sequence[tuple[str, int]], listen: tuple[str, int], password: str = ""
) -> ClusterRoutes:
    """One member's `cluster` block: `members` are every member's (host, cluster port) as the others reach
    it, `listen` this member's own."""
    routes = tuple(f"nats-route://{host}:{port}" for host, port in members)
    return ClusterRoutes(name, listen[0], listen[1], routes, password=password)


def _server_settings(
    store_dir: Path,
    host: str,
    port: int,
    monitor_port: int | None,
    max_file_store: str,
    server_name: str | None,
    cluster: ClusterRoutes | None,
) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if server_name is not None:
        # JetStream in a cluster needs a name per server: it is how the replicas of a stream are placed.
        settings["server_name"] = server_name
    settings.update(
        {
            "host": host,
            "port": port,
            "max_payload": 1 << 20,  # record batches are cut to 256 KiB; a status is a few hundred bytes
            "jetstream": {
                "store_dir": str(store_dir),
                "max_memory_store": 64 << 20,
                "max_file_store": max_file_store,
            },
        }
    )
    if cluster is not None:
        settings["cluster"] = cluster.to_config()
    if monitor_port is not None:
        settings["http"] = f"{host}:{monitor_port}"
    return settings


def _render(
    settings: dict[str, Any], header: str = "# netsleuth fleet: generated by netsleuth.fleet.nats_config"
) -> str:
    lines = [header] if header else []
    lines += [f"{key}: {json.dumps(value, indent=2)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def authorization(users: Sequence[NatsUser]) -> dict[str, Any]:
    return {"users": [user.to_config() for user in users]}


def render_server_config(
    users: Sequence[NatsUser],
    store_dir: Path,
    host: str = "127.0.0.1",
    port: int = 4222,
    monitor_port: int | None = None,
    max_file_store: str = "1G",
    server_name: str | None = None,
    cluster: ClusterRoutes | None = None,
) -> str:
    """One server's configuration; with `cluster` (and a `server_name`), one member of a cluster. Every
    member of a cluster has the same users: a client may connect to any of them."""
    if cluster is not None and server_name is None:
        raise ValueError("a cluster member needs a server_name")
    settings = _server_settings(store_dir, host, port, monitor_port, max_file_store, server_name, cluster)
    settings["authorization"] = authorization(users)
    return _render(settings)


_EXAMPLE_HEADER = """\
# Example nats-server configuration for a netsleuth fleet (nats-server 2.9+, Debian package nats-server).
# Generated by netsleuth.fleet.nats_config.example_server_config(); the NATS format is a superset of JSON.
#
# Users (one per agent host, plus the controller and an operator):
#   admin        no limits: the only user that may reconfigure, purge or delete a stream (the audit streams
#                deny purge and delete even to it). Used by no service; keep it for an operator.
#   controller   publishes as itself only (netsleuth.host.>, netsleuth.audit.controller.>, history); creates
#                its streams and the registry bucket at start (NETSLEUTH_AUDIT, NETSLEUTH_AUDIT_AGENTS,
#                NETSLEUTH_SESSIONS, NETSLEUTH_STATUS, NETSLEUTH_RECORDS, KV_netsleuth_hosts,
#                KV_netsleuth_session_owners, KV_netsleuth_alerts: nothing to create by hand) and reads them;
#                writes the leases of the sessions it runs and the alert ledger (docs/alerts.md); may not
#                create any other stream, nor update, purge or delete one.
#   agent-<host> only its own host: subscribe netsleuth.host.<host>.> and its reply inbox _INBOX_<host>.>;
#                publish its sessions' status/records (netsleuth.session.*.<host>.>), its refusals
#                (netsleuth.audit.agent.<host>), its registry key ($KV.netsleuth_hosts.<host>) and the
#                direct get of that key (clock measurement); allow_responses lets it answer the task/ping
#                requests it receives, nothing more.
# Add a host: `python -m netsleuth.fleet.credentials HOST --controller-key ... --url ...` prints its entry.
# Passwords here are placeholders: keep this file mode 0600, or use bcrypt hashes (`nats server passwd`).
# TLS: add a `tls { cert_file, key_file }` block and use tls:// URLs in the agents' [fleet] url.
"""


def example_server_config() -> str:
    """packaging/nats-server.conf (a unit test keeps the file equal to this)."""
    users = [
        NatsUser("admin", "CHANGE-ME-admin", None),
        NatsUser("controller", "CHANGE-ME-controller", controller_permissions()),
        agent_user("node-a", "CHANGE-ME-node-a"),
        agent_user("node-b", "CHANGE-ME-node-b"),
    ]
    body = render_server_config(
        users, Path("/var/lib/nats/jetstream"), host="0.0.0.0", port=4222, max_file_store="10G"
    )
    return _EXAMPLE_HEADER + body.split("\n", 1)[1]


_CLUSTER_HEADER = """\
# netsleuth fleet on a three-server NATS cluster: {name} of 3 (nats-server 2.9+, Debian package nats-server).
# Generated by netsleuth.fleet.nats_config.example_cluster_configs(); the NATS format is a superset of JSON.
# Run one server per machine (or zone), each with its own file (nats-1.conf, nats-2.conf, nats-3.conf) and
# the same authorization.conf beside it (the users: see packaging/nats-server.conf for who may do what).
# JetStream replicates each stream on three servers (the controller's [nats] replicas = 3): a server can be
# lost, a disk with it, and nothing the fleet keeps is lost; with two of three gone JetStream stops taking
# writes (no quorum) until one is back. Agents and controllers are given all three client URLs:
#   url = "nats://nats-1.example:4222,nats://nats-2.example:4222,nats://nats-3.example:4222"
# Routes log in with the cluster's own user (change its password in all three files); add a
# `tls {{ cert_file, key_file, ca_file }}` block to `cluster` for routes across untrusted networks.
"""
CLUSTER_EXAMPLE_HOSTS = ("nats-1.example", "nats-2.example", "nats-3.example")


def example_cluster_configs() -> dict[str, str]:
    """packaging/nats-cluster/: one file per server and the users they share (a unit test keeps the files
    equal to this and checks each with `nats-server -t`)."""
    users = [
        NatsUser("admin", "CHANGE-ME-admin", None),
        NatsUser("controller", "CHANGE-ME-controller", controller_permissions()),
        agent_user("node-a", "CHANGE-ME-node-a"),
        agent_user("node-b", "CHANGE-ME-node-b"),
    ]
    files = {
        "authorization.conf": "# The users of every server of the cluster (included by nats-N.conf).\n"
        + _render({"authorization": authorization(users)}, header="")
    }
    members = [(host, 6222) for host in CLUSTER_EXAMPLE_HOSTS]
    for index in range(1, len(CLUSTER_EXAMPLE_HOSTS) + 1):
        name = f"nats-{index}"
        settings = _server_settings(
            Path("/var/lib/nats/jetstream"),
            "0.0.0.0",
            4222,
            None,
            "10G",
            name,
            cluster_routes("netsleuth", members, ("0.0.0.0", 6222), password="CHANGE-ME-routes"),
        )
        body = _render(settings, header="")
        files[f"{name}.conf"] = _CLUSTER_HEADER.format(name=name) + body + 'include "authorization.conf"\n'
    return files
