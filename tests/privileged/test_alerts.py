"""From a Prometheus alert to a verdict with nobody awake, with the real programs: Debian's `prometheus`
scrapes real agents of a FleetLab and evaluates the shipped drop rule (a copy with a short `for:`), Debian's
`prometheus-alertmanager` routes its alerts to a real controller, which starts a bounded diagnosis on the
alerting host and namespace; the verdict reaches a small HTTP receiver (the outgoing webhook), the UI's
history and /metrics. Plus: a storm of 1,000 alerts posted by hand starts at most the configured number of
sessions, each audited; a resolved alert cancels its diagnosis; bad bodies and tokens are refused with one
sentence."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from playwright.sync_api import expect

from netsleuth.fleet.protocol import ALERTS_BUCKET
from tests.controller_lab import ControllerProcess
from tests.fleet_lab import REPO, FleetLab, free_port
from tests.netlab import wait_for
from tests.privileged.test_diagnose import UDP_SINK  # a 1 KiB receive buffer that never reads
from tests.privileged.test_fleet_controller import wait_hosts_running
from tests.prometheus_lab import Alertmanager, Prometheus
from tests.ui_browser import browser, open_page, sign_in

pytestmark = pytest.mark.privileged

RULES = REPO / "packaging" / "prometheus" / "netsleuth-alerts.yml"
FIREWALL_RULE = "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"  # the lab server's own firewall drop
ROLE = """
[roles.alerting]
diagnostics = ["diagnose", "drops"]
hosts = ["*"]
netns = ["*"]
max_concurrent = 5
max_duration = 30
max_hosts = 1
"""
# SYNs from the client to the server's dropped port, ~20 a second, until told to stop (or 240 s).
SYN_LOOP = """
import socket, sys, time
end = time.monotonic() + 240
while time.monotonic() < end:
    s = socket.socket(); s.settimeout(0.05)
    try: s.connect((sys.argv[1], 8080))
    except OSError: pass
    s.close()
"""
# Flooding the UDP_SINK from its own namespace, 200 datagrams a second: SOCKET_RCVBUFF.
UDP_LOOP = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end = time.monotonic() + 240
while time.monotonic() < end:
    s.sendto(b"x" * 200, (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.005)
"""


class Receiver:
    """The outgoing webhook's far end: every JSON body POSTed to it, in order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def alerts_config(receiver: Receiver, **limits: Any) -> str:
    settings = {
        "principal": '"alertmanager"',
        "duration": 6,
        "dedup_window": 600,
        "window": 600,
        "max_sessions": 3,
        "max_per_alert": 2,
        "max_per_host": 1,
        "notify_url": f'"{receiver.url}"',
        "public_url": '"http://netsleuth.test"',
        **limits,
    }
    return ROLE + "\n[alerts]\n" + "".join(f"{key} = {value}\n" for key, value in settings.items())


def api(controller: ControllerProcess, user: str) -> httpx.Client:
    return httpx.Client(
        base_url=controller.url, headers={"Authorization": f"Bearer {controller.tokens[user]}"}, timeout=60
    )


def rules_for_test(text: str, inodes: tuple[str, ...]) -> str:
    """The shipped drop rule with a fast `for:` and a short diagnosis, confined to this lab's namespaces:
    other tests on this machine drop packets too, and the agents see every namespace's drops. The other rules
    are left out: they watch counters of the machine's own namespace and CPUs, which those tests move too."""
    head, *rules = re.split(r"(?m)^(?=      - alert: )", text)
    (drops,) = [rule for rule in rules if rule.startswith("      - alert: NetsleuthPacketDrops\n")]
    drops = re.sub(r"\bfor: \d+m\b", "for: 1s", drops).replace('"duration": 30', '"duration": 6')
    assert drops.count('netsleuth_drops_total{reason=~"') == 2
    return head + drops.replace(
        'netsleuth_drops_total{reason=~"', f'netsleuth_drops_total{{netns=~"{"|".join(inodes)}",reason=~"'
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    try:
        yield server
    finally:
        server.close()


def inode_of(lab: FleetLab, host: str) -> str:
    return str(Path(f"/run/netns/{lab.hosts[host].netns}").stat().st_ino)


def test_a_firing_alert_is_diagnosed_on_its_host_and_namespace(receiver: Receiver) -> None:
    with (
        FleetLab(hosts=("client", "server"), drops_exporter=True) as lab,
        ControllerProcess(lab, alerts_config(receiver), {"alertmanager": ["alerting"]}) as controller,
    ):
        token = controller.tokens["alertmanager"]
        alertmanager_config = (
            "route:\n  receiver: netsleuth\n  group_by: ['...']\n"
            "  group_wait: 1s\n  group_interval: 2s\n  repeat_interval: 4s\n"
            "receivers:\n  - name: netsleuth\n    webhook_configs:\n"
            f"      - url: {controller.url}/api/v1/alerts\n        send_resolved: true\n"
            "        http_config:\n          authorization:\n            type: Bearer\n"
            "            credentials_file: {dir}/token\n"
        )
        targets = "".join(
            f"      - targets: ['{json.loads(lab.agent(host).ready_path.read_text())['listen']}']\n"
            f"        labels: {{host: {host}}}\n"
            for host in ("client", "server")
        )
        inodes = (inode_of(lab, "client"), inode_of(lab, "server"))
        with Alertmanager(alertmanager_config, files={"token": token}) as alertmanager:
            prometheus_config = (
                "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 1s\n"
                "rule_files: ['{dir}/rules.yml']\n"
                "alerting:\n  alertmanagers:\n    - static_configs:\n"
                f"        - targets: ['127.0.0.1:{alertmanager.port}']\n"
                f"scrape_configs:\n  - job_name: netsleuth\n    static_configs:\n{targets}"
            )
            rules = {"rules.yml": rules_for_test(RULES.read_text(), inodes)}
            flags = ["--rules.alert.resend-delay=1s"]
            with Prometheus(prometheus_config, files=rules, flags=flags) as prometheus:
                wait_for(lambda: prometheus.scalar("sum(up)") == 2, 60, "Prometheus to scrape both agents")
                run_faults_and_check(lab, controller, receiver, prometheus, alertmanager)


def run_faults_and_check(
    lab: FleetLab,
    controller: ControllerProcess,
    receiver: Receiver,
    prometheus: Prometheus,
    alertmanager: Alertmanager,
) -> None:
    client, server = lab.hosts["client"], lab.hosts["server"]
    sink = client.ns.popen([sys.executable, "-c", UDP_SINK, "5454"], stdin=-1, stdout=-1)
    faults = []
    try:
        assert sink.stdout is not None and sink.stdout.readline() == b"ready\n"
        faults.append(client.ns.popen([sys.executable, "-c", UDP_LOOP, client.address, "5454"]))
        faults.append(client.ns.popen([sys.executable, "-c", SYN_LOOP, server.address]))
        began = time.monotonic()

        def reports() -> dict[str, dict[str, Any]]:
            return {body["hosts"][0]: body for body in receiver.bodies}

        try:
            wait_for(
                lambda: {"client", "server"} <= set(reports()), 180, "both verdicts at the outgoing webhook"
            )
        except TimeoutError as error:
            raise AssertionError(explain(controller, receiver, prometheus, alertmanager)) from error
        print(f"faults to both verdicts at the outgoing webhook: {time.monotonic() - began:.1f} s")
        found = reports()
        # The firewall drop: diagnosed on the server, in its namespace, and the verdict names the rule.
        firewall = found["server"]
        assert firewall["alert"]["name"] == "NetsleuthPacketDrops"
        assert firewall["alert"]["labels"]["reason"] == "NETFILTER_DROP"
        assert firewall["scope"]["netns"] == [server.netns]
        assert FIREWALL_RULE in firewall["verdict"], firewall
        assert firewall["verdict"].startswith("server: ")
        assert firewall["url"] == f"http://netsleuth.test/#/session/{firewall['session']}"
        assert firewall["text"].startswith("NetsleuthPacketDrops on server: ")
        # The receive-buffer overflow: on the client, in its namespace, naming the receiving process.
        overflow = found["client"]
        assert overflow["alert"]["labels"]["reason"] == "SOCKET_RCVBUFF"
        assert overflow["scope"]["netns"] == [client.netns]
        assert f"[{sink.pid}] on udp port 5454" in overflow["verdict"], overflow["verdict"]

        with api(controller, "root") as admin:
            sessions = {s["id"]: s for s in admin.get("/api/v1/sessions").json()}
            started = admin.get("/api/v1/alerts").json()
            audit = admin.get("/api/v1/audit", params={"user": "alertmanager", "limit": 5000}).json()
        assert {firewall["session"], overflow["session"]} == set(sessions), "only the two alerts' sessions"
        assert sessions[firewall["session"]]["user"] == "alertmanager"
        assert sessions[firewall["session"]]["diagnostic"] == "diagnose"
        origins = {record["session"]: record for record in started}
        assert origins[firewall["session"]]["started_by"] == "alert NetsleuthPacketDrops"
        assert origins[firewall["session"]]["verdict"] == firewall["verdict"]
        allowed = [r for r in audit if r["action"] == "session.create" and r["decision"] == "allow"]
        assert sorted(r["session"] for r in allowed) == sorted(sessions)
        assert all(r["alert"]["name"] == "NetsleuthPacketDrops" for r in allowed)
        # Each agent exports every namespace's drops, so each alert also fired on the other host's target:
        # refused there (that namespace is not one its host reported), and audited.
        denied = [r for r in audit if r["action"] == "session.create" and r["decision"] == "deny"]
        assert any(
            f"netns '{server.netns}' is not a namespace host client reported" in r["reason"] for r in denied
        )

        # Alertmanager repeats the firing alerts every 4 s: duplicates inside the dedup window start nothing.
        wait_for(
            lambda: alerts_counted(controller, "duplicate") >= 2, 60, "Alertmanager to repeat the alerts"
        )
        # And the same alert posted by hand, as Alertmanager holds it.
        held = next(
            a
            for a in alertmanager.alerts()
            if a["labels"].get("host") == "server" and a["labels"].get("netns") == inode_of(lab, "server")
        )
        assert held["fingerprint"] == firewall["alert"]["fingerprint"]
        body = {
            "version": "4",
            "status": "firing",
            "receiver": "netsleuth",
            "groupKey": "{}:{}",
            "alerts": [
                {
                    "status": "firing",
                    "labels": held["labels"],
                    "annotations": held["annotations"],
                    "startsAt": held["startsAt"],
                    "fingerprint": held["fingerprint"],
                }
            ],
        }
        with api(controller, "alertmanager") as poster:
            answer = poster.post("/api/v1/alerts", json=body)
        assert answer.status_code == 200 and answer.json()["outcomes"] == {"duplicate": 1}, answer.text
        with api(controller, "root") as admin:
            assert len(admin.get("/api/v1/sessions").json()) == 2
        metrics = httpx.get(f"{controller.url}/metrics").text
        assert (
            'netsleuth_alert_diagnoses_total{alertname="NetsleuthPacketDrops",state="ended"} 2.0' in metrics
        )
        assert (
            f'session="{firewall["session"]}",state="ended"' in metrics
            or f'session="{overflow["session"]}"' in metrics
        )

        # The alerts refused on the other host's target: Alertmanager repeats them, the audit has each once.
        fingerprints = {r["alert"]["fingerprint"] for r in denied}
        wait_for(
            lambda: alerts_counted(controller, "refused") >= 3 * len(fingerprints),
            60,
            "Alertmanager to repeat the refused alerts",
        )
        with api(controller, "root") as admin:
            audit = admin.get("/api/v1/audit", params={"user": "alertmanager", "limit": 5000}).json()
        audited = [
            r["alert"]["fingerprint"]
            for r in audit
            if r["action"] == "session.create" and r["decision"] == "deny"
        ]
        notifications = alerts_counted(controller, "refused")
        print(f"refused alerts: {notifications:g} notifications, {len(audited)} audit record(s)")
        assert fingerprints <= set(audited) and len(audited) == len(set(audited)), audited
    finally:
        for process in faults:
            process.kill()
            process.wait()
        sink.kill()
        sink.wait()


def alerts_counted(controller: ControllerProcess, outcome: str) -> float:
    """netsleuth_alert_alerts_total of firing alerts with this outcome, from the controller's /metrics."""
    text = httpx.get(f"{controller.url}/metrics").text
    pattern = rf'netsleuth_alert_alerts_total\{{outcome="{outcome}",status="firing"\}} (\S+)'
    match = re.search(pattern, text)
    return float(match.group(1)) if match else 0.0


def explain(
    controller: ControllerProcess, receiver: Receiver, prometheus: Prometheus, alertmanager: Alertmanager
) -> str:
    """What each program saw, for a failure message."""
    drops = prometheus.query('netsleuth_drops_total{reason=~"NETFILTER_DROP|SOCKET_RCVBUFF"}')
    with api(controller, "root") as admin:
        audit = admin.get("/api/v1/audit", params={"limit": 50}).json()
    return "\n".join(
        [
            f"prometheus alerts: {[(a['labels'], a['state']) for a in prometheus.alerts()]}",
            f"drop series: {[(d['metric'], d['value']) for d in drops]}",
            f"alertmanager alerts: {[(a['labels'], a['fingerprint']) for a in alertmanager.alerts()]}",
            f"outgoing webhook: {receiver.bodies}",
            f"audit: {[(r.get('action'), r.get('reason'), r.get('outcome')) for r in audit]}",
            f"controller log: {controller.log_text()[-3000:]}",
            f"alertmanager log: {alertmanager.log_text()[-2000:]}",
        ]
    )


def storm_body(count: int, start: int, hosts: tuple[str, ...], status: str = "firing") -> dict[str, Any]:
    annotation = json.dumps({"diagnostic": "drops", "scope": "host", "duration": 30})
    alerts = [
        {
            "status": status,
            "labels": {"alertname": f"Storm{index % 7}", "host": hosts[index % len(hosts)], "n": str(index)},
            "annotations": {"netsleuth_diagnostic": annotation},
            "startsAt": "2026-11-26T00:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus.test/graph",
            "fingerprint": f"{index:016x}",
        }
        for index in range(start, start + count)
    ]
    return {
        "version": "4",
        "status": status,
        "receiver": "netsleuth",
        "groupKey": "{}:{}",
        "alerts": alerts,
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "",
        "truncatedAlerts": 0,
    }


def test_a_storm_of_alerts_starts_at_most_the_cap_each_audited(receiver: Receiver) -> None:
    limits = {"max_sessions": 3, "max_per_alert": 1000, "max_per_host": 2}
    with (
        FleetLab(hosts=("client", "server")) as lab,
        ControllerProcess(
            lab, alerts_config(receiver, **limits), {"alertmanager": ["alerting"]}
        ) as controller,
    ):
        hosts = ("client", "server")
        with api(controller, "alertmanager") as poster, ThreadPoolExecutor(4) as pool:
            posts = [
                pool.submit(poster.post, "/api/v1/alerts", json=storm_body(250, start, hosts))
                for start in range(0, 1000, 250)
            ]
            answers = [post.result() for post in posts]
        assert [answer.status_code for answer in answers] == [200] * 4, [a.text for a in answers]
        started = [session for answer in answers for session in answer.json()["started"]]
        outcomes: dict[str, int] = {}
        for answer in answers:
            for outcome, count in answer.json()["outcomes"].items():
                outcomes[outcome] = outcomes.get(outcome, 0) + count
        assert len(started) == 3, outcomes  # the global cap, though each host could take two
        assert outcomes["started"] == 3 and sum(outcomes.values()) == 1000
        with api(controller, "root") as admin:
            sessions = admin.get("/api/v1/sessions").json()
            audit = admin.get("/api/v1/audit", params={"user": "alertmanager", "limit": 5000}).json()
        assert sorted(s["id"] for s in sessions) == sorted(started)
        allowed = [r for r in audit if r["action"] == "session.create" and r["decision"] == "allow"]
        assert sorted(r["session"] for r in allowed) == sorted(started)
        assert all(r["alert"]["fingerprint"] and r["started_by"].startswith("alert Storm") for r in allowed)
        webhooks = [r for r in audit if r["action"] == "alert.webhook"]
        assert len(webhooks) == 4 and sum(r["alerts"] for r in webhooks) == 1000

        # The same storm again: every alert is a duplicate or over the cap; nothing more starts.
        with api(controller, "alertmanager") as poster:
            again = poster.post("/api/v1/alerts", json=storm_body(1000, 0, hosts)).json()
        assert again["started"] == [] and again["outcomes"]["duplicate"] == 3

        # A resolved alert cancels its diagnosis while it still runs (30 s sessions).
        first = next(a for answer in answers for a in answer.json()["alerts"] if a["outcome"] == "started")
        index = int(first["fingerprint"], 16)
        resolve_and_see_cancelled(controller, index, hosts, first["session"])
        with api(controller, "root") as admin:
            cancels = [
                r
                for r in admin.get("/api/v1/audit", params={"user": "alertmanager"}).json()
                if r["action"] == "session.cancel"
            ]
        assert [r["session"] for r in cancels] == [first["session"]]

        history_marks(controller, started)
        refusals(controller)


def resolve_and_see_cancelled(
    controller: ControllerProcess, index: int, hosts: tuple[str, ...], session: str
) -> None:
    """Storm alert `index` resolved, posted to `controller`: its running diagnosis `session` is cancelled."""
    with api(controller, "alertmanager") as poster:
        resolved = poster.post("/api/v1/alerts", json=storm_body(1, index, hosts, status="resolved")).json()
    assert resolved["outcomes"] == {"cancelled": 1}, resolved
    with api(controller, "root") as admin:
        wait_for(
            lambda: admin.get(f"/api/v1/sessions/{session}?timeline=false").json()["state"] == "cancelled",
            60,
            f"the resolved alert's session {session} to be cancelled",
        )


def ledger_replicas(lab: FleetLab) -> int:
    async def read() -> int:
        client = await nats.connect(lab.nats_urls, **lab.admin_credentials)
        try:
            info = await client.jetstream().stream_info(f"KV_{ALERTS_BUCKET}")
            return int(info.config.num_replicas or 1)
        finally:
            await client.close()

    return lab._run(read())


def test_any_controller_cancels_and_reports_an_alerts_diagnosis(receiver: Receiver) -> None:
    """Two controllers on a three-server cluster, sharing nothing but JetStream. Two alerts start their
    diagnoses through the first; the second controller gets one alert's resolution and cancels its diagnosis,
    which the first runs; the first is SIGKILLed while the other diagnosis runs: the second takes the session
    over when its lease runs out, ends it and sends its verdict. Each verdict reaches the outgoing webhook
    exactly once. (Before: the resolution was 'resolved' and cancelled nothing, and the verdict of the
    session whose controller died was never sent.)"""
    limits = {"max_sessions": 5, "max_per_alert": 5, "max_per_host": 5}
    hosts = ("client", "server")
    with (
        FleetLab(hosts=hosts, nats_servers=3) as lab,
        ControllerProcess(
            lab, alerts_config(receiver, **limits), {"alertmanager": ["alerting"]}, lease_seconds=4
        ) as first,
        first.twin("second") as second,
    ):
        assert ledger_replicas(lab) == 3  # the ledger survives a lost server like the sessions
        with api(first, "alertmanager") as poster:
            answer = poster.post("/api/v1/alerts", json=storm_body(2, 0, hosts)).json()  # 30 s each
        assert answer["outcomes"] == {"started": 2}, answer
        session = {a["host"]: a["session"] for a in answer["alerts"]}  # alert 0 on client, 1 on server

        resolve_and_see_cancelled(second, 1, hosts, session["server"])  # run by the first controller
        with api(second, "root") as admin:
            wait_hosts_running(admin, session["client"], ("client",))
        first.kill()
        killed = time.monotonic()

        def reported() -> set[str]:
            return {str(body["session"]) for body in receiver.bodies}

        wait_for(lambda: reported() == set(session.values()), 120, "both verdicts at the outgoing webhook")
        print(f"the dead controller's diagnosis reported {time.monotonic() - killed:.1f} s after the kill")
        time.sleep(10)  # three sweeps of the survivor: nothing is sent twice
        assert sorted(body["session"] for body in receiver.bodies) == sorted(session.values())
        reports = {body["session"]: body for body in receiver.bodies}
        assert reports[session["server"]]["state"] == "cancelled"
        survived = reports[session["client"]]
        assert survived["state"] == "ended" and survived["alert"]["name"] == "Storm0", survived
        assert survived["verdict"] and "\n" not in survived["verdict"], survived["verdict"]
        with api(second, "root") as admin:
            body = admin.get(f"/api/v1/sessions/{session['client']}?timeline=false").json()
            origins = {record["session"]: record for record in admin.get("/api/v1/alerts").json()}
            cancels = [
                r
                for r in admin.get("/api/v1/audit", params={"user": "alertmanager"}).json()
                if r["action"] == "session.cancel"
            ]
        assert body["state"] == "ended" and body["taken_over"], body
        assert origins[session["client"]]["verdict"] == survived["verdict"]
        assert origins[session["client"]]["state"] == "ended"
        assert [r["session"] for r in cancels] == [session["server"]]
        assert "taken over" in second.log_text()


def history_marks(controller: ControllerProcess, started: list[str]) -> None:
    """The UI's history, in headless Chromium as an admin: each alert's session says which alert started it.
    $NETSLEUTH_UI_SCREENSHOTS: a folder for a screenshot of the page (docs/img/alerts-history.png)."""
    with browser() as instance:
        opened = open_page(instance, controller.url, 1280, 700)
        try:
            sign_in(opened.page, controller.tokens["root"])
            opened.page.get_by_role("link", name="History").click()
            for session in started:
                row = opened.page.locator(f'tr[data-session="{session}"]')
                expect(row.get_by_text(re.compile(r"^started by alert Storm\d$"))).to_be_visible()
            target = os.environ.get("NETSLEUTH_UI_SCREENSHOTS")
            if target:
                opened.page.screenshot(path=str(Path(target) / "alerts-history.png"))
            opened.assert_no_errors()
        finally:
            opened.context.close()


def refusals(controller: ControllerProcess) -> None:
    """Bad bodies: a 4xx with one sentence; a wrong token: 401, audited; another user's: 403, audited."""
    cases: list[tuple[bytes, int, str]] = [
        (b"{not json", 400, "the notification is not valid JSON"),
        (b"[]", 400, "must be a JSON object"),
        (json.dumps({"version": "3", "alerts": []}).encode(), 400, 'webhook version "4"'),
        (json.dumps({"version": "4", "alerts": []}).encode(), 400, "alerts must be a non-empty list"),
        (
            json.dumps(
                {
                    "version": "4",
                    "alerts": [{"status": "firing", "labels": {"alertname": "X"}, "fingerprint": "../etc"}],
                }
            ).encode(),
            400,
            "fingerprint",
        ),
        (
            json.dumps({"version": "4", "alerts": [{"status": "odd", "labels": {}}]}).encode(),
            400,
            "status must be",
        ),
        (
            json.dumps(
                {"version": "4", "alerts": [{"status": "firing", "labels": {"alertname": 3}}]}
            ).encode(),
            400,
            "must be a string",
        ),
        (b'{"version": "4", "alerts": [' + b'{"x": "' + b"y" * (5 << 20) + b'"}]}', 413, "larger than 4 MiB"),
    ]
    with api(controller, "alertmanager") as poster:
        for body, status, words in cases:
            answer = poster.post("/api/v1/alerts", content=body)
            assert answer.status_code == status, (body[:80], answer.text)
            error = answer.json()["error"]
            assert words in error and error.endswith(".") and "\n" not in error, error
    with api(controller, "alice") as other:
        answer = other.post("/api/v1/alerts", json=storm_body(1, 5000, ("client",)))
    assert answer.status_code == 403 and "only the alert principal (alertmanager)" in answer.json()["error"]
    forged = httpx.post(
        f"{controller.url}/api/v1/alerts",
        json=storm_body(1, 5001, ("client",)),
        headers={"Authorization": "Bearer not-the-token"},
    )
    assert forged.status_code == 401 and forged.json()["error"] == "the token is not valid."
    with api(controller, "root") as admin:
        audit = admin.get("/api/v1/audit", params={"decision": "deny", "limit": 5000}).json()
    assert any(r["action"] == "auth" and r["path"] == "/api/v1/alerts" for r in audit)
    assert any(r["action"] == "alert.webhook" and r["user"] == "alice" and r["status"] == 403 for r in audit)
    assert sum(1 for r in audit if r["action"] == "alert.webhook" and r["user"] == "alertmanager") == len(
        cases
    )
