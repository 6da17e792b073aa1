"""A host cannot author another host's hop in the merged verdict (issue 18, item 3).

During a real session (real agents, nats-server, controller), a compromised client agent publishes by hand, on
its own allowed records subject and with its own NATS login, a batch holding a drop record that names the
server's network namespace and a firewall rule of its choosing. The merge used to place a record on the host
whose namespace it names, so the verdict read `dropped on host server by "... --comment <anything>"`: the
client wrote the server's story. A record belongs to the host that sent it; joins across hosts may link
records, never move them."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Iterator
from typing import Any

import httpx
import nats
import pytest

from tests.controller_lab import ControllerProcess
from tests.fleet_lab import FleetLab
from tests.netlab import wait_for

pytestmark = pytest.mark.privileged

HOSTS = ("client", "lb", "server")
FORGED_RULE = "-A INPUT -p tcp -j DROP --comment pwned-by-the-client"


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[FleetLab, ControllerProcess]]:
    with FleetLab(hosts=HOSTS) as lab, ControllerProcess(lab) as controller:
        yield lab, controller


def forged_drop(lab: FleetLab) -> dict[str, Any]:
    """A drop the server's agent would report - its namespace, a rule - written by the client."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
    return {
        "type": "drop", "v": 1, "time": now, "reason": "NETFILTER_DROP", "reason_code": 6,
        "location": "nft_do_chain+0x46f", "family": 4, "proto": "tcp",
        "saddr": "198.18.0.5", "sport": 40404, "daddr": "198.18.2.7", "dport": 8080, "length": 60,
        "tcp_flags": "SYN", "pid": None, "comm": "", "owner": "kernel", "container": None,
        "netns": 4026531999, "netns_name": lab.hosts["server"].netns, "ifname": "eth0", "ifindex": 2,
        "cpu": 0,
        "netfilter": {"hook": "input", "table": "filter", "chain": "INPUT", "rule": FORGED_RULE,
                      "backend": "iptables-nft", "family": "ip", "rule_number": 1, "handle": None,
                      "confidence": "exact"},
    }  # fmt: skip


async def publish_as_the_client(lab: FleetLab, session_id: str, record: dict[str, Any]) -> None:
    """By hand, with the client agent's own NATS login, on its own records subject."""
    client = await nats.connect(lab.nats_url, **lab.agent_credentials("client"))
    try:
        batch = {"host": "client", "session": session_id, "seq": 90, "records": [record]}
        await client.publish(f"netsleuth.session.{session_id}.client.records", json.dumps(batch).encode())
        await client.flush()
    finally:
        await client.close()


def test_a_record_the_client_sends_about_the_servers_namespace_stays_the_clients(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    lab, controller = fleet
    headers = {"Authorization": f"Bearer {controller.tokens['alice']}"}
    with httpx.Client(base_url=controller.url, headers=headers, timeout=20) as api:
        body = {"hosts": list(HOSTS), "diagnostic": "conn", "config": {"proto": "tcp"}, "duration": 4}
        created = api.post("/api/v1/sessions", json=body)
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]

        def session() -> dict[str, Any]:
            found: dict[str, Any] = api.get(f"/api/v1/sessions/{session_id}").json()
            return found

        wait_for(lambda: all(v["state"] == "running" for v in session()["hosts"].values()), 90, "running")
        asyncio.run(publish_as_the_client(lab, session_id, forged_drop(lab)))
        wait_for(lambda: session()["state"] in ("ended", "failed"), 60, "the session to end")
        ended = session()
    # The forged record did arrive (the attack reached the merge) ...
    forged = [entry for entry in ended["timeline"] if FORGED_RULE in json.dumps(entry)]
    assert forged, "the forged batch never reached the controller"
    # ... and is the client's, wherever it is told.
    assert {entry["host"] for entry in forged} == {"client"}
    hops = [hop for verdict in ended["verdicts"] for hop in verdict["hops"] if FORGED_RULE in hop["detail"]]
    assert hops, ended["verdicts"]
    assert {hop["host"] for hop in hops} == {"client"}, hops
    for verdict in ended["verdicts"]:
        assert f'dropped on host server by "{FORGED_RULE}"' not in verdict["path"] + verdict["text"]
    assert all(hop["detail"].startswith(f'dropped on host client by "{FORGED_RULE}"') for hop in hops), hops
