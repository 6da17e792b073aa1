"""A role scoped by Kubernetes namespace (issue 24, item 2): `k8s_namespaces = ["team-a"]` lets its user see
the pods of team-a on each host and nothing of the other pods on the same host.

Real pod sandboxes made through CRI on a containerd of the test's own (tests/cri_lab.py): team-a/web-1 and
team-a/api-2, and team-b/db-0, all on one host whose agent serves the whole machine (registered as host
"node"), and a real controller. Each pod drops datagrams of its own (UDP to its own address, a port nothing
listens on: NO_SOCKET in its namespace). The agent resolves team-a to its two pods' network namespaces when
the task arrives and filters by that set in the kernel, and the last line checks every record's namespace
and pod: amy's session shows both team-a pods' drops and nothing of db-0's. Asking for team-b - by
Kubernetes namespace or by pod - is refused by the controller with 403 and an audit record, before any host
hears of it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.controller_lab import ControllerProcess
from tests.cri_lab import CriLab, LabPod
from tests.fleet_lab import FleetLab
from tests.netlab import wait_for

_CLOSED_PORT = 9
_ROLE = """
[roles.team-a]
diagnostics = ["drops"]
hosts = ["node"]
k8s_namespaces = ["team-a"]
max_duration = 30
"""


@dataclass
class Stack:
    lab: FleetLab
    controller: ControllerProcess
    web: LabPod
    api: LabPod
    db: LabPod

    def client(self, user: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.controller.tokens[user]}"}
        return httpx.Client(base_url=self.controller.url, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def stack(cri: CriLab) -> Iterator[Stack]:
    web, api = cri.run_pod("team-a", "web-1"), cri.run_pod("team-a", "api-2")
    db = cri.run_pod("team-b", "db-0")
    try:
        with FleetLab(hosts=("node",), agents=False) as lab:
            # The machine's agent: every pod of this host's runtime (CONTAINER_RUNTIME_ENDPOINT) is its.
            lab.start_agent("node", scoped=False)
            with ControllerProcess(lab, extra_config=_ROLE, extra_users={"amy": ["team-a"]}) as controller:
                yield Stack(lab, controller, web, api, db)
    finally:
        for pod in (web, api, db):
            cri.remove_pod(pod.sandbox_id)


def _drop_in(pod: LabPod, count: int = 3) -> None:
    """`count` datagrams to the pod's own address, on a port nothing listens on: dropped in its namespace."""
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"for _ in range({count}): s.sendto(b'x' * 16, ({pod.ip!r}, {_CLOSED_PORT}))\n"
    )
    pod.run(sys.executable, "-c", code)


def _run_session(stack: Stack, user: str, config: dict[str, Any]) -> dict[str, Any]:
    with stack.client(user) as api:
        body = {"hosts": ["node"], "diagnostic": "drops", "config": config, "duration": 4}
        created = api.post("/api/v1/sessions", json=body)
        assert created.status_code == 201, created.text
        session = created.json()["id"]

        def running() -> bool:
            host = api.get(f"/api/v1/sessions/{session}").json()["hosts"]["node"]
            assert host["state"] not in ("failed", "rejected"), host
            return bool(host["state"] == "running")

        wait_for(running, 90, "the node to run the session")
        for pod in (stack.web, stack.api, stack.db):
            _drop_in(pod)
        ended: dict[str, Any] = {}

        def done() -> bool:
            ended.update(api.get(f"/api/v1/sessions/{session}").json())
            return ended.get("state") in ("ended", "failed", "cancelled")

        wait_for(done, 90, "the session to end")
    return ended


def test_a_team_a_user_sees_both_team_a_pods_and_nothing_of_team_b_on_the_same_host(stack: Stack) -> None:
    ended = _run_session(stack, "amy", {"k8s_namespace": "team-a", "proto": "udp", "dport": _CLOSED_PORT})
    assert ended["state"] == "ended" and ended["scope"]["k8s_namespaces"] == ["team-a"], ended
    host = ended["hosts"]["node"]
    assert host["state"] == "ended", host
    drops = [r for r in ended["timeline"] if r.get("type") == "drop"]
    assert {drop["netns"] for drop in drops} == {stack.web.inode, stack.api.inode}, drops
    assert all(drop["pod"]["namespace"] == "team-a" for drop in drops), drops
    # Nothing of db-0's anywhere in what amy got: not its namespace, its pod or its address.
    text = json.dumps(ended)
    for trace in (str(stack.db.inode), "db-0", "team-b", stack.db.ip, stack.db.uid):
        assert trace not in text, trace
    # Held in the kernel (its filter is the set of team-a's pods' namespaces): db-0's drops were never even
    # counted, so the last line had nothing to withhold.
    assert host["totals"]["withheld"] == 0 and host["totals"]["total"] == len(drops), host


def test_asking_for_team_b_is_refused_with_403_and_an_audit_record(stack: Stack) -> None:
    asks: tuple[tuple[dict[str, str], str], ...] = (
        ({"k8s_namespace": "team-b"}, "your roles do not allow Kubernetes namespace team-b on host node."),
        ({"pod": "team-b/db-0"}, "your roles do not allow Kubernetes namespace team-b on host node."),
        ({}, "your roles do not allow network namespace host on host node"),
    )
    with stack.client("amy") as api:
        for config, sentence in asks:
            answer = api.post(
                "/api/v1/sessions",
                json={"hosts": ["node"], "diagnostic": "drops", "config": config, "duration": 3},
            )
            assert answer.status_code == 403 and answer.json()["error"].startswith(sentence), answer.text
    with stack.client("root") as admin:
        audit = admin.get("/api/v1/audit", params={"user": "amy", "decision": "deny"}).json()
    refused = [entry for entry in audit if entry["action"] == "session.create" and entry["status"] == 403]
    by_scope = {json.dumps(entry["scope"], sort_keys=True): entry for entry in refused}
    team_b = by_scope[json.dumps({"cgroups": [], "addresses": [], "k8s_namespaces": ["team-b"], "netns": []},
                                 sort_keys=True)]  # fmt: skip
    assert team_b["reason"] == asks[0][1] and team_b["diagnostic"] == "drops", team_b
    assert len([e for e in refused if e["scope"].get("k8s_namespaces") == ["team-b"]]) == 2, refused
    # Nothing was sent to the host: no session was made for any of them.
    with stack.client("amy") as api:
        made = api.get("/api/v1/sessions").json()
    assert all(s["scope"].get("k8s_namespaces") != ["team-b"] for s in made), made
