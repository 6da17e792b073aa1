"""Fleet trust, attacked by hand: a host is who its NATS subject (and login) says, never what a message body
claims. A real nats-server, real agents in namespaces and a real controller process; every attack is a raw
nats-py publish or request with some identity's credentials - a captured task replayed after the agent
restarted, a status or record batch on one agent's own subject that names another host, an agent's audit
record claiming to be the controller's, the controller's NATS login speaking for an agent, a flood on one
agent's audit subject - never the product's own client code. The threat model these tests prove is
docs/fleet-security.md.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StreamInfo

from tests.controller_lab import ControllerProcess
from tests.fleet_lab import FleetLab
from tests.netlab import wait_for
from tests.privileged.test_agent_harness import bpf_object_ids, loaded_ids
from tests.privileged.test_fleet_controller import api, create, wait_hosts_running, wait_state

pytestmark = pytest.mark.privileged

HOSTS = ("client", "server")
# The flood test fills what it can of nats-server's store: small, so that a store without per-agent bounds
# fills in a few hundred MiB.
STORE = "512M"
MIB = 1 << 20


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[FleetLab, ControllerProcess]]:
    with FleetLab(hosts=HOSTS, max_file_store=STORE) as lab, ControllerProcess(lab) as controller:
        yield lab, controller


class Wire:
    """A raw NATS connection as one identity (its credentials), on the lab's I/O loop: what an attacker
    holding that login can do by hand. Permission violations the server reports are kept in `errors`."""

    def __init__(self, lab: FleetLab, credentials: dict[str, str], inbox_prefix: str = "_INBOX") -> None:
        self.lab = lab
        self.errors: list[str] = []

        async def on_error(error: Exception) -> None:
            self.errors.append(str(error))

        async def connect() -> Client:
            return await nats.connect(
                lab.nats_url,
                inbox_prefix=inbox_prefix,
                error_cb=on_error,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.2,
                **credentials,
            )

        self.client = lab._run(connect())

    def capture(self, subject: str) -> list[Msg]:
        """Every message on `subject` from now on, as it arrives."""
        seen: list[Msg] = []

        async def keep(msg: Msg) -> None:
            seen.append(msg)

        async def subscribe() -> None:
            await self.client.subscribe(subject, cb=keep)
            await self.client.flush()

        self.lab._run(subscribe())
        return seen

    def publish(self, subject: str, data: bytes) -> None:
        async def publish() -> None:
            await self.client.publish(subject, data)
            await self.client.flush()

        self.lab._run(publish())

    def publish_many(self, subject: str, data: bytes, count: int) -> Future[None]:
        """Publish `count` times, in the background: wait on the future it returns."""

        async def publish() -> None:
            for _ in range(count):
                await self.client.publish(subject, data)
            await self.client.flush(timeout=60)

        assert self.lab._io is not None
        return asyncio.run_coroutine_threadsafe(publish(), self.lab._io.loop)

    def request(self, subject: str, data: bytes, timeout: float = 5) -> bytes | None:
        """The reply, or None when none came (a permission violation answers nothing)."""

        async def request() -> bytes | None:
            try:
                return bytes((await self.client.request(subject, data, timeout=timeout)).data)
            except Exception:
                return None

        return self.lab._run(request(), timeout + 10)

    def violations(self) -> str:
        """The permission violations the server reported so far (waits for the server's -ERR to arrive)."""

        async def ping() -> None:
            await self.client.flush(timeout=5)

        self.lab._run(ping())
        return " ".join(error for error in self.errors if "permissions violation" in error.lower())

    def close(self) -> None:
        self.lab._run(self.client.close())


def as_agent(lab: FleetLab, host: str) -> Wire:
    """A compromised agent: its own login, its own reply inbox (all its permissions allow)."""
    return Wire(lab, lab.agent_credentials(host), inbox_prefix=f"_INBOX_{host}")


def audit(controller: ControllerProcess, **params: Any) -> list[dict[str, Any]]:
    with api(controller, "root") as root:
        response = root.get("/api/v1/audit", params={"limit": 5000, **params})
        assert response.status_code == 200, response.text
        records: list[dict[str, Any]] = response.json()
        return records


def stream_info(lab: FleetLab, stream: str) -> StreamInfo:
    """What nats-server holds in a stream (asked as the lab's admin), with its subjects' counts."""

    async def info() -> StreamInfo:
        client = await nats.connect(lab.nats_url, **lab.admin_credentials)
        try:
            return await client.jetstream().stream_info(stream, subjects_filter=">")
        finally:
            await client.close()

    return lab._run(info())


def agent_programs(lab: FleetLab, host: str) -> set[int]:
    return bpf_object_ids(lab.agent(host).pid)[0]


# -- 1. replay ---------------------------------------------------------------------------------------------
def test_a_task_replayed_after_the_agent_restarts_is_refused_and_nothing_attaches(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    """Someone with the controller's NATS login (not its signing key) captures a task off the wire, waits for
    the agent to restart (upgrade, crash, OOM), then sends it again and the unsigned `start`."""
    lab, controller = fleet
    attacker = Wire(lab, lab.controller_credentials)
    watcher: Wire | None = None
    try:
        captured = attacker.capture("netsleuth.host.server.task")
        with api(controller) as alice:
            created = create(alice, hosts=["server"], diagnostic="drops", config={}, duration=1)
            wait_state(alice, created["id"], ("ended", "failed"), timeout=60)
        session = created["id"]
        wait_for(lambda: len(captured) == 1, 10, "the captured task")
        task = json.loads(captured[0].data)["task"]
        assert task["session"] == session and time.time() < task["expires_at"]  # still valid

        lab.stop_agent("server")
        agent = lab.start_agent("server")
        held_before = agent_programs(lab, "server")
        watcher = Wire(lab, lab.admin_credentials)
        statuses = watcher.capture(f"netsleuth.session.{session}.server.status")

        reply = attacker.request("netsleuth.host.server.task", captured[0].data)
        assert reply is not None
        answer = json.loads(reply)
        t0 = time.time_ns() + 200_000_000
        attacker.publish("netsleuth.host.server.control", json.dumps(
            {"session": session, "action": "start", "t0_ns": t0}).encode())  # fmt: skip
        assert answer["accepted"] is False, answer
        assert "earlier run of this agent" in answer["reason"], answer["reason"]
        # The agent has read the start too (it says it runs no such session): nothing was, or is, attached.
        wait_for(
            lambda: f"start for session {session}, which does not run here" in agent.log_text(),
            10,
            "the agent to ignore the start",
        )
        assert agent_programs(lab, "server") == held_before
        loaded_programs, _links = loaded_ids()
        assert not (agent_programs(lab, "server") - held_before) & loaded_programs
        wait_for(lambda: bool(statuses), 10, "the rejected status")
        assert [json.loads(message.data)["state"] for message in statuses] == ["rejected"]
    finally:
        attacker.close()
        if watcher is not None:
            watcher.close()


# -- 2. statuses and records take their host from the subject ------------------------------------------------
def test_a_status_or_record_batch_naming_another_host_is_refused_counted_logged_and_audited(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    """A compromised client agent, on its own allowed subjects during a session that includes the server,
    claims to be the server: a `failed` status with a reason of its choosing and a record as the server."""
    lab, controller = fleet
    since = time.time()
    with api(controller) as alice:
        created = create(alice, hosts=list(HOSTS), diagnostic="drops", config={}, duration=4)
        session = created["id"]
        wait_hosts_running(alice, session, HOSTS)
        evil = as_agent(lab, "client")
        try:
            forged_status = {"host": "server", "session": session, "state": "failed",
                             "reason": "FORGED-BY-CLIENT: the server's disk is on fire"}  # fmt: skip
            now = datetime.datetime.now(datetime.UTC).isoformat()
            record = {
                "type": "drop",
                "time": now,
                "reason": "FORGED-BY-CLIENT",
                "netns": lab.hosts["server"].netns,
            }
            forged_batch = {"host": "server", "session": session, "seq": 0, "records": [record]}
            evil.publish(f"netsleuth.session.{session}.client.status", json.dumps(forged_status).encode())
            evil.publish(f"netsleuth.session.{session}.client.records", json.dumps(forged_batch).encode())
            # On the server's own subject the server refuses the publish outright (permissions).
            evil.publish(f"netsleuth.session.{session}.server.status", json.dumps(forged_status).encode())
            assert f"netsleuth.session.{session}.server.status" in evil.violations()
        finally:
            evil.close()
        ended = wait_state(alice, session, ("ended", "failed"), timeout=60)
    server = ended["hosts"]["server"]
    assert server["state"] == "ended" and "FORGED" not in server["reason"], server
    assert not [entry for entry in ended["timeline"] if "FORGED" in json.dumps(entry)]
    assert ended["hosts"]["client"]["state"] == "ended"
    assert ended["hosts"]["client"]["refused"] == 2, ended["hosts"]["client"]  # counted on the sender
    # Counted for the operator, ...
    metrics = httpx.get(f"{controller.url}/metrics", timeout=10).text
    for kind in ("status", "records"):
        line = f'netsleuth_controller_refused_messages_total{{kind="{kind}",reason="other_host"}}'
        assert any(text.startswith(line) and float(text.split()[-1]) >= 1 for text in metrics.splitlines()), (
            metrics
        )
    # ... logged, naming the subject's host and the claimed one, ...
    log = controller.log_text()
    assert f"session {session}: refused a status on host client's subject that names host 'server'" in log
    # ... and audited once per kind, by the controller.
    refusals = [
        r for r in audit(controller, decision="deny", since=str(since)) if r["action"] == "message.refused"
    ]
    mine = [r for r in refusals if r["session"] == session]
    assert sorted(r["kind"] for r in mine) == ["records", "status"], mine
    assert all(r["source"] == "controller" and r["hosts"] == ["client"] for r in mine)


def test_the_controllers_nats_login_cannot_speak_for_an_agent(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    """Whoever holds the controller's NATS login cannot publish a host's status, records, audit record or
    registry entry, nor make the server republish its own words there (a stream with RePublish)."""
    lab, _controller = fleet
    stolen = Wire(lab, lab.controller_credentials)
    try:
        status = json.dumps({"host": "server", "session": "s-forged", "state": "failed"}).encode()
        stolen.publish("netsleuth.session.s-forged.server.status", status)
        stolen.publish("netsleuth.audit.agent.server", json.dumps({"action": "task.rejected"}).encode())
        stolen.publish("$KV.netsleuth_hosts.server", json.dumps({"host": "server"}).encode())
        # The server republishes what such a stream stores as itself, past every user's permissions.
        evil_stream = {
            "name": "EVIL",
            "subjects": ["netsleuth.evil"],
            "republish": {
                "src": "netsleuth.evil",
                "dest": "netsleuth.session.s-forged.server.status",
            },
        }
        created = stolen.request("$JS.API.STREAM.CREATE.EVIL", json.dumps(evil_stream).encode(), timeout=2)
        # Nor loosen the audit (or any other) stream.
        loosened = {
            "name": "NETSLEUTH_AUDIT",
            "subjects": ["netsleuth.audit.controller.>"],
            "deny_purge": False,
        }
        updated = stolen.request(
            "$JS.API.STREAM.UPDATE.NETSLEUTH_AUDIT", json.dumps(loosened).encode(), timeout=2
        )
        violations = stolen.violations()
    finally:
        stolen.close()
    assert created is None and updated is None
    for subject in ("netsleuth.session.s-forged.server.status", "netsleuth.audit.agent.server",
                    "$KV.netsleuth_hosts.server", "$JS.API.STREAM.CREATE.EVIL",
                    "$JS.API.STREAM.UPDATE.NETSLEUTH_AUDIT"):  # fmt: skip
        assert subject.lower() in violations.lower(), (subject, violations)


def test_an_agents_login_reaches_only_its_own_host(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    """What a compromised agent's login cannot do: read another host's tasks or replies, or the controller's,
    write another host's registry entry or audit subject, or call the JetStream API."""
    lab, _controller = fleet
    evil = as_agent(lab, "client")
    try:
        for subject in ("netsleuth.host.server.>", "_INBOX_server.>", "_INBOX.>", "netsleuth.session.>"):
            evil.capture(subject)
        evil.publish("$KV.netsleuth_hosts.server", json.dumps({"host": "server"}).encode())
        evil.publish("netsleuth.audit.agent.server", json.dumps({"action": "task.rejected"}).encode())
        info = evil.request("$JS.API.STREAM.INFO.NETSLEUTH_AUDIT", b"", timeout=2)
        violations = evil.violations().lower()
    finally:
        evil.close()
    assert info is None
    for subject in ("subscription to \"netsleuth.host.server.>", "subscription to \"_inbox_server.>",
                    "subscription to \"_inbox.>", "subscription to \"netsleuth.session.>",
                    "publish to \"$kv.netsleuth_hosts.server", "publish to \"netsleuth.audit.agent.server",
                    "publish to \"$js.api.stream.info"):  # fmt: skip
        assert subject in violations, (subject, violations)


# -- 4. audit records read back as who wrote them ------------------------------------------------------------
def test_an_agents_audit_record_never_reads_back_as_the_controllers(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    lab, controller = fleet
    since = time.time()
    forged = {"source": "controller", "host": "server", "time": "2020-01-01T00:00:00+00:00",
              "user": "alice", "action": "session.create", "decision": "allow", "status": 201,
              "session": "f0rged0000000001", "diagnostic": "drops", "hosts": ["server"],
              "outcome": "dispatched", "reason": ""}  # fmt: skip
    evil = as_agent(lab, "client")
    try:
        evil.publish("netsleuth.audit.agent.client", json.dumps(forged).encode())
        assert not evil.violations()  # its own audit subject: allowed, and that is the point
    finally:
        evil.close()

    def found() -> list[dict[str, Any]]:
        return [r for r in audit(controller, since=str(since)) if r.get("session") == forged["session"]]

    wait_for(lambda: bool(found()), 10, "the forged record in the audit trail")
    (record,) = found()
    assert record["source"] == "agent" and record["host"] == "client", record
    assert record["hosts"] == ["client"], record
    assert record["claimed"] == {"source": "controller", "host": "server", "hosts": ["server"]}, record
    assert record["time"] >= datetime.datetime.fromtimestamp(since, datetime.UTC).isoformat()[:19]
    # Filtering by the claimed writer does not find it among the controller's decisions either.
    allowed = audit(controller, user="alice", decision="allow")
    assert not [r for r in allowed if r.get("session") == forged["session"] and r["source"] == "controller"]

    # The web UI says who really wrote it.
    from playwright.sync_api import expect

    from tests.ui_browser import browser, open_page, sign_in

    with browser() as instance:
        opened = open_page(instance, controller.url)
        page = opened.page
        sign_in(page, controller.tokens["root"])
        page.get_by_role("link", name="Audit").click()
        row = page.locator("tbody tr[data-seq]").filter(has_text=str(forged["session"]))
        expect(row).to_have_count(1)
        expect(row).to_have_attribute("data-source", "agent")
        expect(row).to_contain_text("agent client")
        opened.assert_no_errors()


# -- 5. every refusal on the agent is audited; one agent cannot flood the audit ------------------------------
def test_a_storm_of_bad_tasks_costs_the_audit_a_bounded_number_of_records(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    """Whoever holds the controller's login sends an agent 500 malformed tasks in a burst: each is refused
    and counted, the agent writes at most its burst plus its rate of records, and says how many it left
    out."""
    lab, controller = fleet
    since = time.time()
    sender = Wire(lab, lab.controller_credentials)
    try:
        for index in range(500):
            assert sender.request("netsleuth.host.server.task", b"{storm %d" % index) is not None
    finally:
        sender.close()
    stormed = time.time() - since

    def left_out() -> int:
        return sum(r.get("count", 0) + r.get("left_out_before", 0) for r in records())

    def records() -> list[dict[str, Any]]:
        return [
            r for r in audit(controller, since=str(since)) if r["source"] == "agent" and r["host"] == "server"
        ]

    wait_for(lambda: len(records()) + left_out() >= 500, 30, "every refusal written or counted")
    written = [r for r in records() if r["action"] == "task.rejected"]
    assert len(written) + left_out() == 500, (len(written), left_out())
    assert len(written) <= 50 + 10 * (stormed + 1), (len(written), stormed)  # burst + rate x time
    assert any(r["action"] == "refusals.left_out" for r in records())
    metrics = lab.agent("server").metrics()
    assert 'netsleuth_fleet_audit_records_total{outcome="left_out"}' in metrics


def test_every_refusal_on_the_agent_is_audited(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    lab, controller = fleet
    since = time.time()
    sender = Wire(lab, lab.controller_credentials)
    try:
        replies = [
            sender.request("netsleuth.host.server.task", b"{not json"),
            sender.request(
                "netsleuth.host.server.task", b'{"task": {"id": "x"}, "signature": "", "key_id": ""}'
            ),
            sender.request(
                "netsleuth.host.server.task", lab.sign(lab.task("client", "for-client-1")).encode()
            ),
        ]
    finally:
        sender.close()
    reasons = [json.loads(reply)["reason"] for reply in replies if reply is not None]
    assert len(reasons) == 3 and not any(json.loads(reply)["accepted"] for reply in replies if reply)

    def recorded() -> list[str]:
        records = audit(controller, decision="deny", since=str(since))
        return [r["reason"] for r in records if r["source"] == "agent" and r["host"] == "server"]

    wait_for(lambda: all(reason in recorded() for reason in reasons), 10, f"audit records of {reasons}")


# -- the controller's side of a restart ------------------------------------------------------------------
def test_the_controllers_host_list_follows_a_nats_restart_within_seconds(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    lab, controller = fleet
    restarted = time.time_ns()
    lab.restart_nats()
    lab.wait_registered(HOSTS, since_ns=restarted, timeout=30)
    in_registry = time.monotonic()
    with api(controller) as alice:

        def listed() -> bool:
            response = alice.get("/api/v1/hosts")
            if response.status_code != 200:
                return False
            fresh = {h["host"] for h in response.json() if (h.get("heartbeat_ns") or 0) > restarted}
            return fresh >= set(HOSTS)

        wait_for(listed, 30, "the controller to list the re-registered hosts")
    lag = time.monotonic() - in_registry
    assert lag < 3.0, f"the controller's host list lagged {lag:.1f} s behind the registry"


# -- last: it fills what it can of the store --------------------------------------------------------------
def test_a_flood_on_one_agents_audit_subject_leaves_the_controllers_audit_working(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    lab, controller = fleet
    since = time.time()
    evil = as_agent(lab, "client")
    try:
        # Messages as big as NATS allows (1 MiB), more than the whole store holds; then many of a size an
        # agent's record may have.
        flood = evil.publish_many(
            "netsleuth.audit.agent.client", b'{"pad": "' + b"x" * (MIB - 16) + b'"}', 600
        )
        # While it floods, the controller writes (a refused session is audited before the 4xx) and reads.
        with api(controller) as alice:
            during = alice.post(
                "/api/v1/sessions", json={"hosts": ["nosuchhost"], "diagnostic": "drops", "duration": 1}
            )
        assert during.status_code == 404, during.text
        assert any(r["reason"] == during.json()["error"] for r in audit(controller, since=str(since)))
        flood.result(300)
        evil.publish_many("netsleuth.audit.agent.client", b'{"pad": "' + b"y" * 15_000 + b'"}', 1500).result(
            300
        )
        # Statuses for sessions nobody runs (the server keeps each host's last status of each session).
        for index in range(1300):  # 78 MB: more than the stream's 64 MiB
            status = {
                "host": "client",
                "session": f"made-up-{index}",
                "state": "failed",
                "reason": "z" * 60_000,
            }
            evil.publish(f"netsleuth.session.made-up-{index}.client.status", json.dumps(status).encode())
    finally:
        evil.close()
    # The controller's audit writes still work: a session is allowed (its record is stored before dispatch),
    # and the record reads back with every other decision of the controller.
    with api(controller) as alice:
        response = alice.post(
            "/api/v1/sessions", json={"hosts": ["server"], "diagnostic": "drops", "duration": 1}
        )
        assert response.status_code == 201, response.text
        session = response.json()["id"]
        wait_state(alice, session, ("ended", "failed"), timeout=60)
    records = audit(controller, since=str(since))
    assert [r["action"] for r in records if r.get("session") == session] == ["session.create", "session.end"]
    # Other agents' refusals are still recorded.
    sender = Wire(lab, lab.controller_credentials)
    try:
        reply = sender.request("netsleuth.host.server.task", b"{not json, after the flood")
    finally:
        sender.close()
    assert reply is not None
    reason = json.loads(reply)["reason"]
    wait_for(
        lambda: any(r.get("reason") == reason for r in audit(controller, since=str(since))), 10, "the refusal"
    )

    # The flooding agent's subject holds its bounded window and nothing more; the statuses, their bytes.
    agents = stream_info(lab, "NETSLEUTH_AUDIT_AGENTS")
    count = (agents.state.subjects or {}).get("netsleuth.audit.agent.client", 0)
    assert 0 < count <= 1000 and 0 < (agents.config.max_msg_size or 0) <= 16 << 10, agents
    assert 0 < stream_info(lab, "NETSLEUTH_STATUS").state.bytes <= 64 * MIB
