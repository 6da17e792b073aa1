"""The fleet controller end to end: a real nats-server, real agents in the namespace testbed (client -> lb
with nftables DNAT -> server with an INPUT drop rule), a real `netsleuth controller` process, driven over
HTTP and through `netsleuth fleet`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import nats
import pytest

from netsleuth.fleet.protocol import task_subject
from tests.controller_lab import ControllerProcess
from tests.fleet_lab import REPO, FleetLab, connect, serve
from tests.netlab import wait_for
from tests.privileged.test_agent_harness import bpf_object_ids, wait_released

pytestmark = pytest.mark.privileged

HOSTS = ("client", "lb", "server")
VIP = "198.18.1.10"
RULE = "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[FleetLab, ControllerProcess]]:
    with FleetLab(hosts=HOSTS) as lab, ControllerProcess(lab) as controller:
        yield lab, controller


def api(controller: ControllerProcess, user: str | None = "alice") -> httpx.Client:
    headers = {"Authorization": f"Bearer {controller.tokens[user]}"} if user else {}
    return httpx.Client(base_url=controller.url, headers=headers, timeout=20)


def syn_to_vip(lab: FleetLab, port: int = 80, timeout: float = 1.5) -> None:
    """One connect() from the client host to the load balancer's VIP; the server's firewall drops it."""
    code = (
        "import socket\n"
        f"s = socket.socket(); s.settimeout({timeout})\n"
        f"try:\n    s.connect(('{VIP}', {port}))\nexcept OSError as e:\n    print(e)\n"
    )
    lab.hosts["client"].run("python3", "-c", code, check=False)


def wait_state(
    client: httpx.Client, session_id: str, states: tuple[str, ...], timeout: float
) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def reached() -> bool:
        found.update(client.get(f"/api/v1/sessions/{session_id}").json())
        return found.get("state") in states

    wait_for(reached, timeout, f"session {session_id} to reach {states}")
    return found


def wait_hosts_running(
    client: httpx.Client, session_id: str, hosts: tuple[str, ...], timeout: float = 90
) -> None:
    def running() -> bool:
        body = client.get(f"/api/v1/sessions/{session_id}").json()
        states = {host: body["hosts"][host] for host in hosts}
        gone = {
            h: f"{v['state']}: {v['reason']}"
            for h, v in states.items()
            if v["state"] in ("failed", "rejected")
        }
        assert not gone, f"hosts did not start: {gone}"
        return all(view["state"] == "running" for view in states.values())

    wait_for(running, timeout, f"hosts {hosts} to run session {session_id}")


def create(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/api/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


class Listener:
    """Everything published on some subjects while the block runs (as the lab's unrestricted admin). On exit
    it publishes a marker and stops once the marker came back: whatever was published before it is in."""

    MARKER = "netsleuth.host.zz-test-marker.control"

    def __init__(self, lab: FleetLab, subject: str) -> None:
        self.lab, self.subject = lab, subject
        self.messages: list[str] = []
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._listen()), daemon=True)

    async def _listen(self) -> None:
        client = await nats.connect(self.lab.nats_url, **self.lab.admin_credentials)
        marked = asyncio.Event()

        async def received(message: Any) -> None:
            if message.subject == self.MARKER:
                marked.set()
            else:
                self.messages.append(message.subject)

        await client.subscribe(self.subject, cb=received)
        await client.flush()
        self._ready.set()
        while not self._stop.is_set():
            await asyncio.sleep(0.02)
        await client.publish(self.MARKER, b"{}")
        await asyncio.wait_for(marked.wait(), timeout=10)
        await client.close()

    def __enter__(self) -> Listener:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


# -- the synchronised session and its verdict ---------------------------------------------------------------
def test_three_host_session_traces_the_flow_through_the_dnat(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    lab, controller = fleet
    with api(controller) as client:
        created = create(client, hosts=list(HOSTS), diagnostic="conn", config={"proto": "tcp"}, duration=5)
        assert created["state"] == "preparing" and set(created["hosts"]) == set(HOSTS)
        wait_hosts_running(client, created["id"], HOSTS)
        syn_to_vip(lab)
        session = wait_state(client, created["id"], ("ended", "failed"), timeout=30)
    assert session["state"] == "ended", session["hosts"]
    assert not session["partial"]
    # All agents started within the same 100 ms window, each measured against its own clock offset.
    assert session["start_spread_ms"] is not None and session["start_spread_ms"] < 100
    for host in HOSTS:
        view = session["hosts"][host]
        assert view["state"] == "ended" and isinstance(view["offset_ns"], int), (host, view)
        assert abs(view["start_skew_ns"]) < 100_000_000, (host, view)
        assert view["lost"] == 0
    # The application gave up connecting: a timeout, which began where the server's firewall dropped the SYN.
    dropped = [v for v in session["verdicts"] if v["flow"].endswith(f"> {VIP}:80")]
    assert len(dropped) == 1 and dropped[0]["outcome"] == "timeout", session["verdicts"]
    path = dropped[0]["path"]
    assert path.startswith("SYN left host client -> DNAT 198.18.1.10:80 -> 198.18.2.7:8080 on host lb -> "), (
        path
    )
    assert f'dropped on host server by "{RULE}"' in path
    assert dropped[0]["text"].endswith(f'it began at hop 3 on host server: SYN dropped by "{RULE}"')
    assert [hop["host"] for hop in dropped[0]["hops"]][:3] == ["client", "lb", "server"]
    # The merged timeline names the flow as the client sees it on every host: the lb's conntrack entry and the
    # client's connection events are one flow, in corrected-time order.
    hosts_of_flow = {e["host"] for e in session["timeline"] if e.get("flow") == dropped[0]["flow"]}
    assert {"client", "lb"} <= hosts_of_flow
    times = [e["time"] for e in session["timeline"] if "time" in e]
    assert times == sorted(times)


def test_a_reply_that_bypasses_the_dnat_is_named(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    """VIP:81 is DNATed to server:8081 without SNAT: the server answers the client directly, the client has
    no socket for a SYN-ACK from the backend's address and resets. Only the joined hosts show why."""
    lab, controller = fleet
    listener = serve(lab, "server", 8081)
    try:
        with api(controller) as client:
            created = create(
                client, hosts=list(HOSTS), diagnostic="conn", config={"proto": "tcp"}, duration=5
            )
            wait_hosts_running(client, created["id"], HOSTS)
            assert connect(lab, "client", VIP, 81, timeout=1.5) == "TimeoutError"
            session = wait_state(client, created["id"], ("ended", "failed"), timeout=60)
    finally:
        listener.kill()
        listener.wait(10)
    bypass = [v for v in session["verdicts"] if v["flow"].endswith(f"> {VIP}:81")]
    assert len(bypass) == 1, session["verdicts"]
    verdict = bypass[0]
    assert verdict["outcome"] == "timeout"  # what the application saw: its connect() never completed
    events = [(hop["host"], hop["event"]) for hop in verdict["hops"]]
    # The stray SYN-ACK, the reset and the drop it drew on the client are one hop, where it began; the
    # server's drop of that reset follows it.
    assert events == [("client", "sent"), ("lb", "nat"), ("client", "bypass"), ("server", "drop")], events
    assert verdict["hops"][2].get("began") is True
    assert "the reply SYN|ACK 198.18.2.7:8081 > 198.18.0.5:" in verdict["text"]
    assert "came straight back to host client, bypassing the NAT on host lb" in verdict["path"]


def test_the_cli_streams_the_merged_timeline_and_the_verdict(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    lab, controller = fleet
    process = subprocess.Popen(
        [sys.executable, "-m", "netsleuth", "fleet", "run", "--hosts", "client,lb,server", "drops",
         "--proto", "tcp", "--duration", "4", "--json"],
        env=controller.env("alice"), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    with api(controller) as client:

        def started() -> bool:
            sessions = client.get("/api/v1/sessions").json()
            return (
                bool(sessions) and sessions[0]["state"] == "running" and sessions[0]["diagnostic"] == "drops"
            )

        wait_for(started, 30, "the CLI's session to run")
    syn_to_vip(lab)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    kinds = {line["type"] for line in lines}
    assert {"status", "drop", "verdict", "end"} <= kinds
    drops = [line for line in lines if line["type"] == "drop" and line.get("netfilter")]
    assert drops and all(line["host"] == "server" and line["netfilter"]["rule"] == RULE for line in drops)
    verdicts = [line for line in lines if line["type"] == "verdict" and line["outcome"] == "dropped"]
    assert any(f'dropped on host server by "{RULE}"' in v["path"] for v in verdicts)
    assert lines[0]["type"] == "session" and isinstance(lines[0]["id"], str)  # the session id comes first


# -- permissions and audit ---------------------------------------------------------------------------------
def test_a_role_without_the_diagnostic_or_namespace_gets_403_audited_and_nothing_is_sent(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    lab, controller = fleet
    refused = [
        (
            {"hosts": ["client"], "diagnostic": "resets", "config": {"netns": "web"}, "duration": 2},
            "diagnostic resets",
        ),
        ({"hosts": ["client"], "diagnostic": "drops", "config": {}, "duration": 2}, "network namespace host"),
        (
            {"hosts": ["client"], "diagnostic": "drops", "config": {"netns": "db"}, "duration": 2},
            "namespace db",
        ),
        (
            {"hosts": ["server"], "diagnostic": "drops", "config": {"netns": "web"}, "duration": 2},
            "host server",
        ),
    ]
    since = time.time()
    with Listener(lab, "netsleuth.host.>") as listener, api(controller, "bob") as client:
        for body, words in refused:
            response = client.post("/api/v1/sessions", json=body)
            assert response.status_code == 403, response.text
            message = response.json()["error"]
            assert words in message and message.endswith(".") and "\n" not in message
    assert listener.messages == []  # no task, ping or control reached any host
    with api(controller, "root") as admin:
        records = admin.get(
            "/api/v1/audit", params={"user": "bob", "decision": "deny", "since": str(since)}
        ).json()
    denied = [r for r in records if r["action"] == "session.create"]
    assert len(denied) == len(refused)
    assert all(r["status"] == 403 and r["outcome"] == "refused" for r in denied)
    assert {r["diagnostic"] for r in denied} == {"resets", "drops"}


def test_the_audit_stream_refuses_delete_and_purge(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    lab, _controller = fleet

    async def attempt() -> list[str]:
        client = await nats.connect(lab.nats_url, **lab.admin_credentials)  # even the unrestricted admin
        errors = []
        try:
            js = client.jetstream()
            info = await js.stream_info("NETSLEUTH_AUDIT")
            assert info.config.deny_delete and info.config.deny_purge
            first = info.state.first_seq
            for call in (js.purge_stream("NETSLEUTH_AUDIT"), js.delete_msg("NETSLEUTH_AUDIT", first)):
                try:
                    await call
                except Exception as error:
                    errors.append(str(error))
            after = await js.stream_info("NETSLEUTH_AUDIT")
            assert after.state.messages >= info.state.messages and after.state.first_seq == first
        finally:
            await client.close()
        return errors

    assert len(asyncio.run(attempt())) == 2


def test_every_session_is_audited_before_dispatch_with_its_outcome(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    _lab, controller = fleet
    with api(controller) as client:
        created = create(client, hosts=["lb"], diagnostic="drops", config={}, duration=1)
        wait_state(client, created["id"], ("ended", "failed"), timeout=30)
    with api(controller, "root") as admin:
        records = [
            r
            for r in admin.get("/api/v1/audit", params={"user": "alice"}).json()
            if r["session"] == created["id"]
        ]
    actions = [r["action"] for r in records]
    assert actions == ["session.create", "session.end"]
    assert (
        records[0]["decision"] == "allow"
        and records[0]["hosts"] == ["lb"]
        and records[0]["scope"]["netns"] == []
    )
    assert records[0]["seq"] < records[1]["seq"]
    assert "lb: ended" in records[1]["outcome"]
    with api(controller, "root") as admin:
        everything = admin.get("/api/v1/audit", params={"limit": 5000}).json()
        tail = admin.get("/api/v1/audit", params={"limit": 2}).json()  # read from the stream's tail only
    assert [r["seq"] for r in tail] == [r["seq"] for r in everything[-2:]]


def test_a_task_the_agent_refuses_is_rejected_and_audited(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    """The admin may use any namespace; the agent still refuses one outside its host (scope pushed down)."""
    _lab, controller = fleet
    with api(controller, "root") as root:
        created = create(
            root, hosts=["client"], diagnostic="drops", config={"netns": "elsewhere"}, duration=2
        )
        assert created["scope"]["netns"] == ["elsewhere"]
        session = wait_state(root, created["id"], ("ended", "failed"), timeout=60)
        assert session["state"] == "failed" and session["hosts"]["client"]["state"] == "rejected"
        reason = session["hosts"]["client"]["reason"]
        assert "elsewhere" in reason and "outside this host" in reason
        records = root.get("/api/v1/audit", params={"decision": "deny", "user": "root"}).json()
    rejected = [r for r in records if r["action"] == "task.rejected" and r["session"] == created["id"]]
    # Recorded twice, independently: by the controller (which got the refusal as the task's reply) and by the
    # agent itself (which records its refusals whoever sent the task).
    by_controller = [r for r in rejected if r.get("source") == "controller"]
    by_agent = [r for r in rejected if r.get("host") == "client" and r.get("source") != "controller"]
    assert (
        len(by_controller) == 1
        and by_controller[0]["reason"] == reason
        and by_controller[0]["hosts"] == ["client"]
    )
    assert len(by_agent) == 1


def test_a_forged_task_sent_straight_over_nats_shows_in_the_audit_api(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    """Bypassing the controller gets nothing run, and the agent's refusal is in the trail admins read."""
    lab, controller = fleet
    since = time.time()
    signed = lab.sign(lab.task("client", session="forged-1", diagnostic="drops", deadline_s=1)).to_json()
    signed["task"]["user"] = "mallory"  # changed after signing
    reply = json.loads(lab.nats_request(task_subject("client"), json.dumps(signed).encode(), admin=True))
    assert reply["accepted"] is False and "signature" in reply["reason"]
    with api(controller, "root") as root:

        def recorded() -> bool:
            found = root.get("/api/v1/audit", params={"decision": "deny", "since": str(since)}).json()
            return any(r.get("host") == "client" and r.get("session") == "forged-1" for r in found)

        wait_for(recorded, 10, "the agent's refusal in the audit trail")


def test_cancel_and_the_concurrency_limit(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    _lab, controller = fleet
    with api(controller) as alice:  # operators: at most 2 sessions at once
        first = create(alice, selector={"labels": {"role": "lb"}}, diagnostic="drops", config={}, duration=25)
        second = create(alice, hosts=["server"], diagnostic="drops", config={}, duration=25)
        assert list(first["hosts"]) == ["lb"]  # the label selector chose the host
        third = alice.post(
            "/api/v1/sessions", json={"hosts": ["client"], "diagnostic": "drops", "duration": 1}
        )
        assert third.status_code == 429 and "2 session(s)" in third.json()["error"]
        wait_hosts_running(alice, first["id"], ("lb",))
        for session_id in (first["id"], second["id"]):
            assert alice.post(f"/api/v1/sessions/{session_id}/cancel").status_code == 200
        cancelled = wait_state(alice, first["id"], ("cancelled",), timeout=20)
        assert cancelled["hosts"]["lb"]["state"] == "ended" and "cancel" in cancelled["hosts"]["lb"]["reason"]
        wait_state(alice, second["id"], ("cancelled",), timeout=20)
        assert alice.post("/api/v1/sessions", json={"hosts": ["client"], "diagnostic": "drops",
                                                     "duration": 1}).status_code == 201  # fmt: skip


def test_the_live_stream_over_sse(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    """What the web UI reads: `session` first, statuses, records, then `end`; the token may be a query
    parameter (EventSource cannot send headers)."""
    from netsleuth.commands.fleet import sse_events

    lab, controller = fleet
    with api(controller) as alice:
        created = create(alice, hosts=["server"], diagnostic="drops", config={"proto": "tcp"}, duration=3)
    events: list[tuple[str, dict[str, Any]]] = []
    with httpx.Client(base_url=controller.url, timeout=60) as anonymous:
        url = f"/api/v1/sessions/{created['id']}/events"
        with anonymous.stream("GET", url, params={"access_token": controller.tokens["alice"]}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            for name, data in sse_events(response.iter_lines()):
                events.append((name, data))
                if name == "status" and data["host"] == "server" and data["state"] == "running":
                    syn_to_vip(lab)
                if name == "end":
                    break
    names = [name for name, _ in events]
    assert names[0] == "session" and names[-1] == "end"
    assert {"status", "record", "verdict"} <= set(names)
    drops = [data for name, data in events if name == "record" and data.get("type") == "drop"]
    assert any((d.get("netfilter") or {}).get("rule") == RULE for d in drops)
    assert events[-1][1]["state"] == "ended"


# -- bad requests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (
            json.dumps(
                {"hosts": ["client"], "diagnostic": "drops", "duration": 1, "config": {"dport": 99999}}
            ).encode(),
            422,
            "--dport 99999 is not a port: give a number from 1 to 65535",
        ),
        (b"[1, 2]", 400, "JSON object"),
        (
            json.dumps({"hosts": ["client"], "diagnostic": "drops", "duration": 1, "extra": 1}).encode(),
            400,
            "extra",
        ),
        (
            json.dumps({"hosts": ["nosuchhost"], "diagnostic": "drops", "duration": 1}).encode(),
            404,
            "nosuchhost",
        ),
        (json.dumps({"hosts": ["Bad Host"], "diagnostic": "drops", "duration": 1}).encode(), 400, "host id"),
        (
            json.dumps({"hosts": ["client"], "diagnostic": "nope", "duration": 1}).encode(),
            422,
            "unknown diagnostic",
        ),
        (json.dumps({"hosts": ["client"], "diagnostic": "drops", "duration": -1}).encode(), 400, "duration"),
        (json.dumps({"hosts": ["client"], "diagnostic": "drops", "duration": 999}).encode(), 422, "maximum"),
        (
            json.dumps(
                {
                    "hosts": ["client"],
                    "diagnostic": "drops",
                    "duration": 1,
                    "config": {"host": ["198.18.0.1"] * 500},
                }
            ).encode(),
            413,
            "entries",
        ),
        (b"{" + b'"pad": "' + b"x" * 70_000 + b'"}', 413, "larger than"),
        (
            json.dumps(
                {"hosts": ["client"], "diagnostic": "drops", "duration": 1, "config": {"dport": {"a": 1}}}
            ).encode(),
            400,
            "config.dport",
        ),
    ],
)
def test_bad_requests_get_4xx_with_one_sentence(
    fleet: tuple[FleetLab, ControllerProcess], body: bytes, status: int, words: str
) -> None:
    _lab, controller = fleet
    with api(controller) as client:
        response = client.post("/api/v1/sessions", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert words in message and "\n" not in message and "Traceback" not in message


def test_authentication_and_other_refusals(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    _lab, controller = fleet
    with api(controller, None) as anonymous:
        assert anonymous.get("/api/v1/hosts").status_code == 401
        bad = anonymous.get("/api/v1/me", headers={"Authorization": "Bearer wrong-token-123"})
        assert bad.status_code == 401 and bad.json()["error"] == "the token is not valid."
        assert anonymous.get("/api/v1/auth").json()["token"] is True
    with api(controller, "bob") as bob:
        assert bob.get("/api/v1/audit").status_code == 403
        assert [h["host"] for h in bob.get("/api/v1/hosts").json()] == [
            "client"
        ]  # only what bob may diagnose
        assert bob.get("/api/v1/sessions/0123456789abcdef").status_code == 404
        assert bob.get("/api/v1/nope").status_code == 404
    with api(controller) as alice:
        me = alice.get("/api/v1/me").json()
        assert me["user"] == "alice" and not me["admin"] and "conn" in me["allowed"]["diagnostics"]
        created = create(alice, hosts=["client"], diagnostic="drops", config={}, duration=1)
        wait_state(alice, created["id"], ("ended", "failed"), timeout=30)
        assert alice.post(f"/api/v1/sessions/{created['id']}/cancel").status_code == 409
        records = alice.get(f"/api/v1/sessions/{created['id']}/records")
        assert records.headers["content-type"].startswith("application/x-ndjson")
    with api(controller, "bob") as bob:
        assert bob.get(f"/api/v1/sessions/{created['id']}").status_code == 403  # alice's session


def test_fleet_cli_errors_are_one_line_with_exit_code_2(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    _lab, controller = fleet
    result = subprocess.run(
        [sys.executable, "-m", "netsleuth", "fleet", "run", "--hosts", "nosuchhost", "drops",
         "--duration", "1"],
        env=controller.env("alice"), cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "unknown host nosuchhost" in result.stderr
    env = {k: v for k, v in controller.env("alice").items() if k != "NETSLEUTH_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "netsleuth", "fleet", "hosts"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "NETSLEUTH_TOKEN" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "netsleuth", "fleet", "audit"], env=controller.env("root"), cwd=REPO,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0 and "session.create" in result.stdout
    with api(controller) as alice:
        created = create(alice, hosts=["client"], diagnostic="drops", config={}, duration=1)
        wait_state(alice, created["id"], ("ended", "failed"), timeout=60)
    sessions = subprocess.run(
        [sys.executable, "-m", "netsleuth", "fleet", "sessions", "--json"], env=controller.env("alice"),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    listed = [json.loads(line) for line in sessions.stdout.splitlines()]
    assert sessions.returncode == 0 and listed[0]["id"] == created["id"]  # newest first
    assert all(entry["user"] == "alice" for entry in listed)
    shown = subprocess.run(
        [sys.executable, "-m", "netsleuth", "fleet", "show", created["id"]], env=controller.env("alice"),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0 and shown.stdout.startswith(f"session {created['id']} ended")
    with api(controller, "root") as root:
        bad = root.get("/api/v1/audit", params={"limit": "many"})
        assert bad.status_code == 400 and "limit" in bad.json()["error"]


# -- failures mid-session ----------------------------------------------------------------------------------
def test_an_agent_killed_mid_session_is_failed_and_the_others_finish(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    lab, controller = fleet
    try:
        with api(controller) as client:
            created = create(client, hosts=list(HOSTS), diagnostic="drops", config={}, duration=4)
            wait_hosts_running(client, created["id"], HOSTS)
            lab.kill_agent("server")
            session = wait_state(client, created["id"], ("ended", "failed"), timeout=30)
        assert session["hosts"]["server"]["state"] == "failed"
        assert "stopped answering" in session["hosts"]["server"]["reason"]
        assert session["hosts"]["client"]["state"] == "ended" and session["hosts"]["lb"]["state"] == "ended"
        assert session["state"] == "ended" and session["partial"] is True
    finally:
        lab.start_agent("server")


def test_nats_restart_then_the_next_session_works(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    lab, controller = fleet
    lab.restart_nats()
    lab.wait_registered(HOSTS, since_ns=time.time_ns(), timeout=30)
    with api(controller) as client:

        def dispatched() -> bool:
            response = client.post(
                "/api/v1/sessions", json={"hosts": list(HOSTS), "diagnostic": "drops", "duration": 1}
            )
            if response.status_code == 503:
                return False  # the controller is still reconnecting: it said so in one sentence
            assert response.status_code == 201, response.text
            session = wait_state(client, response.json()["id"], ("ended", "failed"), timeout=30)
            assert session["state"] == "ended" and not session["partial"], session["hosts"]
            return True

        wait_for(dispatched, 30, "a session after the NATS restart")


def test_controller_killed_mid_session_agents_stop_at_the_deadline(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    lab, controller = fleet
    with api(controller) as client:
        created = create(client, hosts=list(HOSTS), diagnostic="drops", config={}, duration=3)
        wait_hosts_running(client, created["id"], HOSTS)
    held = [bpf_object_ids(lab.agent(host).pid) for host in HOSTS]
    programs = set().union(*(ids[0] for ids in held))
    links = set().union(*(ids[1] for ids in held))
    assert all(ids[0] and ids[1] for ids in held), held  # every agent has its programs attached
    controller.kill()
    try:
        wait_for(
            lambda: all(f"session {created['id']} ended" in lab.agent(h).log_text() for h in HOSTS),
            30,
            "every agent to end the session at its own deadline",
        )
        # Nothing of the session is left in the kernel (bpftool's view of every program and link).
        wait_released(programs, links)
    finally:
        controller.start()
    with api(controller) as client:
        # The restarted controller takes the session over once its old lease has run out, and finishes it
        # from what the agents said while no controller listened (NETSLEUTH_STATUS, NETSLEUTH_RECORDS).
        session = wait_state(client, created["id"], ("ended", "failed"), timeout=60)
        listed = [s for s in client.get("/api/v1/sessions").json() if s["id"] == created["id"]]
    assert session["state"] == "ended" and session["partial"] is False and session["taken_over"] is True
    for host in HOSTS:
        view = session["hosts"][host]
        assert view["state"] == "ended" and view["reason"].startswith("duration"), (host, view)
        assert "seen" in view["totals"], view
    assert listed and {h: v["state"] for h, v in listed[0]["hosts"].items()} == dict.fromkeys(HOSTS, "ended")


def test_a_session_asked_for_by_selector_runs_on_the_hosts_it_selects(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    """Every host, hosts by label, hosts holding a namespace: the controller picks them from the registry;
    a pod no host holds is a 404 sentence; a host list too big for a request says to use a selector."""
    lab, controller = fleet
    server_netns = lab.hosts["server"].netns
    with api(controller) as client:
        for selector, expected in (
            ({"all": True}, set(HOSTS)),
            ({"labels": {"role": "lb"}}, {"lb"}),
            ({"netns": server_netns}, {"server"}),
        ):
            created = create(client, selector=selector, diagnostic="drops", config={}, duration=1)
            assert set(created["hosts"]) == expected, (selector, created["hosts"])
            session = wait_state(client, created["id"], ("ended", "failed"), timeout=60)
            assert session["state"] == "ended" and not session["partial"], (selector, session["hosts"])
            # Each chosen agent ran it (its own exact totals came back), and only those were sent a task.
            assert set(session["hosts"]) == expected, session["hosts"]
            for host, view in session["hosts"].items():
                assert view["state"] == "ended" and "seen" in view["totals"], (selector, host, view)
        by_pod = {"selector": {"pod": "team-b/db-0"}, "diagnostic": "drops", "duration": 1}
        nobody = client.post("/api/v1/sessions", json=by_pod)
        assert nobody.status_code == 404, nobody.text
        assert nobody.json()["error"] == "no registered host you may use matches the selector."
        many = [f"sim-{index:05d}" for index in range(10_000)]
        too_big = client.post("/api/v1/sessions", json={"hosts": many, "diagnostic": "drops", "duration": 1})
        assert too_big.status_code == 413, too_big.text
        assert (
            'a session on many hosts is asked for with a selector: {"selector": {"all": true}}'
            in (too_big.json()["error"])
        )
    with api(controller, "root") as admin:
        records = admin.get("/api/v1/audit", params={"limit": 50}).json()
    allowed = [r for r in records if r["action"] == "session.create" and r.get("selector")]
    assert {"netns": server_netns} in [r["selector"] for r in allowed], allowed[-4:]
