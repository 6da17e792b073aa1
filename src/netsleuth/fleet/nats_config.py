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
    AUDIT_STREAM,
    HOSTS_BUCKET,
    PREFIX,
    SESSIONS_STREAM,
    STATUS_STREAM,
    validate_host_id,
)

__all__ = [
    "NatsUser",
    "agent_permissions",
    "agent_user",
    "controller_permissions",
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


# The streams (and the registry bucket's) the controller creates at start; nothing else.
CONTROLLER_STREAMS = (AUDIT_STREAM, AGENT_AUDIT_STREAM, SESSIONS_STREAM, STATUS_STREAM, f"KV_{HOSTS_BUCKET}")


def controller_permissions() -> dict[str, Any]:
    return {
        "publish": {
            "allow": [
                f"{PREFIX}.host.>",  # tasks, control, pings
                f"{PREFIX}.audit.controller.>",
                f"{PREFIX}.history.>",
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


def render_server_config(
    users: Sequence[NatsUser],
    store_dir: Path,
    host: str = "127.0.0.1",
    port: int = 4222,
    monitor_port: int | None = None,
    max_file_store: str = "1G",
) -> str:
    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "max_payload": 1 << 20,  # record batches are cut to 256 KiB; a status is a few hundred bytes
        "jetstream": {
            "store_dir": str(store_dir),
            "max_memory_store": 64 << 20,
            "max_file_store": max_file_store,
        },
        "authorization": {"users": [user.to_config() for user in users]},
    }
    if monitor_port is not None:
        settings["http"] = f"{host}:{monitor_port}"
    lines = ["# netsleuth fleet: generated by netsleuth.fleet.nats_config"]
    lines += [f"{key}: {json.dumps(value, indent=2)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


_EXAMPLE_HEADER = """\
# Example nats-server configuration for a netsleuth fleet (nats-server 2.9+, Debian package nats-server).
# Generated by netsleuth.fleet.nats_config.example_server_config(); the NATS format is a superset of JSON.
#
# Users (one per agent host, plus the controller and an operator):
#   admin        no limits: the only user that may reconfigure, purge or delete a stream (the audit streams
#                deny purge and delete even to it). Used by no service; keep it for an operator.
#   controller   publishes as itself only (netsleuth.host.>, netsleuth.audit.controller.>, history); creates
#                its streams and the registry bucket at start (NETSLEUTH_AUDIT, NETSLEUTH_AUDIT_AGENTS,
#                NETSLEUTH_SESSIONS, NETSLEUTH_STATUS, KV_netsleuth_hosts: nothing to create by hand) and
#                reads them; may not create any other stream, nor update, purge or delete one.
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
