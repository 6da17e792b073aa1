"""The fleet on a three-server NATS cluster (routes on loopback, JetStream R3): real nats-server processes,
real agents in the namespace testbed, real controllers. Each failure of issue 23 is made for real - a
server killed under the controller or under some agents, a controller killed mid-session, two servers of
three lost - and the session must still end with every host's results and the audit intact, or fail in
one clear sentence and leave nothing attached."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import nats
import pytest

from netsleuth.fleet.protocol import (
    AGENT_AUDIT_STREAM,
    AUDIT_STREAM,
    HOSTS_BUCKET,
    SESSIONS_STREAM,
    STATUS_STREAM,
)
from tests.controller_lab import ControllerProcess
from tests.fleet_lab import FleetLab
from tests.netlab import wait_for
from tests.privileged.test_fleet_controller import api, create, wait_hosts_running, wait_state

pytestmark = pytest.mark.privileged

HOSTS = ("client", "lb", "server")


@pytest.fixture(scope="module")
def cluster() -> Iterator[FleetLab]:
    with FleetLab(hosts=HOSTS, nats_servers=3) as lab:
        yield lab


def stream_replicas(lab: FleetLab) -> dict[str, int]:
    async def read() -> dict[str, int]:
        client = await nats.connect(lab.nats_urls, **lab.admin_credentials)
        try:
            js = client.jetstream()
            names = (AUDIT_STREAM, AGENT_AUDIT_STREAM, SESSIONS_STREAM, STATUS_STREAM, f"KV_{HOSTS_BUCKET}")
            return {name: int((await js.stream_info(name)).config.num_replicas or 1) for name in names}
        finally:
            await client.close()

    return lab._run(read())


def test_the_cluster_keeps_every_stream_on_three_servers_and_a_session_runs(cluster: FleetLab) -> None:
    lab = cluster
    with ControllerProcess(lab) as controller, api(controller, "root") as client:
        assert set(stream_replicas(lab).values()) == {3}, stream_replicas(lab)
        created = create(client, hosts=list(HOSTS), diagnostic="drops", config={}, duration=1)
        session: dict[str, Any] = wait_state(client, created["id"], ("ended", "failed"), timeout=60)
    assert session["state"] == "ended" and not session["partial"], session["hosts"]
    routes = [len(lab.monitor_json(index, "/routez").get("routes") or []) for index in range(3)]
    assert routes == [2, 2, 2], routes


UDP_SINK_PORT = 9999  # nothing listens there on server: every datagram is a NO_SOCKET drop

_DATAGRAMS = (
    "import socket,sys,time\n"
    "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
    "n=int(sys.argv[3]);gap=float(sys.argv[4])\n"
    "for i in range(n):\n"
    "    s.sendto(b'x',(sys.argv[1],int(sys.argv[2])));time.sleep(gap)\n"
)


def send_datagrams(lab: FleetLab, count: int, gap_s: float) -> subprocess.Popen[bytes]:
    """From client to server's closed UDP port, paced: a drop on server every `gap_s` seconds."""
    server = lab.hosts["server"].address
    argv = ["python3", "-c", _DATAGRAMS, server, str(UDP_SINK_PORT), str(count), str(gap_s)]
    return lab.hosts["client"].ns.popen(argv)


def wait_cluster_whole(lab: FleetLab, timeout: float = 60) -> None:
    """Every server up, JetStream healthy on each, and every replicated stream current on all three."""
    for index in range(lab.nats_servers):
        lab.start_nats(index=index)

    def current() -> bool:
        for index in range(lab.nats_servers):
            health = lab._monitor(index, "/healthz")
            if health[0] != 200:
                return False
        return True

    wait_for(current, timeout, "every nats-server healthy with its streams current")


def session_audit(controller: ControllerProcess, session_id: str) -> list[dict[str, Any]]:
    with api(controller, "root") as admin:
        response = admin.get("/api/v1/audit", params={"limit": 5000})
    assert response.status_code == 200, response.text
    return [record for record in response.json() if record.get("session") == session_id]


@pytest.mark.parametrize("victim", ["netsleuth-controller", "netsleuth-agent-server"])
def test_a_server_killed_mid_session_loses_no_host_result_nor_audit(cluster: FleetLab, victim: str) -> None:
    """The nats-server the controller (or the server host's agent, and whoever shares it) is connected to is
    killed in the middle of the window, while server records a drop every 5 ms: the session still ends
    with every host ended, every batch each host sent merged (records = what it says it sent, no gap) and
    as many drop records as the kernel counted, and its create and end in the audit."""
    lab = cluster
    wait_cluster_whole(lab)
    config = {"proto": "udp", "dport": UDP_SINK_PORT}
    with ControllerProcess(lab) as controller, api(controller) as client:
        created = create(client, hosts=list(HOSTS), diagnostic="drops", config=config, duration=6)
        session_id = created["id"]
        wait_hosts_running(client, session_id, HOSTS)
        sender = send_datagrams(lab, count=800, gap_s=0.005)
        try:
            wait_for(lambda: client.get(f"/api/v1/sessions/{session_id}").json()["hosts"]["server"]["records"]
                     > 20, 20, "server's first drops to reach the controller")  # fmt: skip
            killed = lab.nats_server_of(victim)
            on_it = [name for name in ("netsleuth-controller", *(f"netsleuth-agent-{h}" for h in HOSTS))
                     if lab.nats_server_of(name) == killed]  # fmt: skip
            lab.stop_nats(index=killed, kill=True)
            sender.wait(30)
            session = wait_state(client, session_id, ("ended", "failed"), timeout=90)
        finally:
            sender.kill()
            wait_cluster_whole(lab)
        timeline = client.get(f"/api/v1/sessions/{session_id}/records").text.splitlines()
        logs = controller.log_text()[-3000:] + lab.agent("server").log_text()[-3000:]
        actions = [(r["action"], r.get("result")) for r in session_audit(controller, session_id)]
    assert victim in on_it, on_it
    assert session["state"] == "ended" and not session["partial"], session["hosts"]
    for host, view in session["hosts"].items():
        assert view["state"] == "ended" and view["batch_gaps"] == 0, (host, view, logs)
    drops = [entry for entry in map(json.loads, timeline) if entry.get("type") == "drop"]
    server = session["hosts"]["server"]
    # As many drop records as the kernel counted in the window, and as the host says it sent.
    assert len(drops) == server["totals"]["total"] >= 600, (len(drops), server)
    assert server.get("sent") == len(drops), server
    assert {d["host"] for d in drops} == {"server"}
    assert ("session.create", None) in actions and ("session.end", "ended") in actions, actions
