"""A diagnostic added from outside netsleuth with one registry line and no other edit (issue 21).

tests/plugin_signals is a small diagnostic in its own package: a typed config, typed records, its own BPF
program (signals.bpf.c: every kill(2) with the sender's network namespace, filtered in the kernel by it) and
a session. This test makes it a distribution the way pip would install one - the package with its object
compiled into it, and a dist-info whose entry_points.txt holds the one line that registers it,
`[netsleuth.diagnostics] signals = netsleuth_signals` - on the PYTHONPATH of every process it starts, and
finds it: in `netsleuth --help` and as a CLI run, as an agent session, as a fleet task through a real
controller with its scope enforced (a kill sent from inside the scope to a process outside it is withheld by
the last line, and counted), in the controller's /openapi.json and in the web form's schema
(GET /api/v1/diagnostics).

Its own BPF program rather than an existing object: a plug-in cannot ship its program inside netsleuth's
package, so the test proves the path a real one takes (its object beside its code, loaded by netsleuth's
BpfObject, CO-RE against this kernel's BTF with no vmlinux.h).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import jsonschema
import pytest

from netsleuth.spec.schemas import record_schema
from tests.controller_lab import ControllerProcess
from tests.fleet_lab import FleetLab
from tests.netlab import Host, wait_for
from tests.plugin_signals.records import SignalRecord, SignalsSummary
from tests.privileged.conftest import Pair
from tests.privileged.test_agent_harness import AgentProcess
from tests.tracerun import TraceRun

PLUGIN = Path(__file__).resolve().parents[1] / "plugin_signals"
KILL = "import os, sys\nfor pid in sys.argv[1:]:\n    os.kill(int(pid), 0)\n"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The plug-in installed as its own distribution in a directory on PYTHONPATH, for every process the
    tests here start (the CLI, agents, the controller)."""
    site = tmp_path_factory.mktemp("plugin-site")
    package = site / "netsleuth_signals"
    shutil.copytree(PLUGIN, package, ignore=shutil.ignore_patterns("__pycache__", "*.bpf.c"))
    multiarch = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True, check=True)
    subprocess.run(
        ["clang", "-target", "bpf", "-O2", "-g", f"-I/usr/include/{multiarch.stdout.strip()}",
         "-c", str(PLUGIN / "signals.bpf.c"), "-o", str(package / "signals.bpf.o")],
        check=True,
    )  # fmt: skip
    dist = site / "netsleuth_signals-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: netsleuth-signals\nVersion: 1.0\n")
    # The one line that registers it.
    (dist / "entry_points.txt").write_text("[netsleuth.diagnostics]\nsignals = netsleuth_signals\n")
    path = os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))
    with mock.patch.dict(os.environ, {"PYTHONPATH": path}):
        yield site


def _inode(host: Host) -> int:
    return os.stat(f"/run/netns/{host.name}").st_ino


def _sleeper(host: Host) -> subprocess.Popen[bytes]:
    """A process in `host`'s namespace to send signal 0 to (`ip netns exec` execs it: its pid is its own)."""
    return subprocess.Popen(host.argv("sleep", "120"))


def _kill(host: Host, *targets: subprocess.Popen[bytes]) -> int:
    """kill(pid, 0) of each target from a process in `host`'s namespace; returns the sender's pid."""
    sender = subprocess.Popen(host.argv(sys.executable, "-c", KILL, *(str(t.pid) for t in targets)))
    assert sender.wait(30) == 0
    return sender.pid


def _ours(records: list[dict[str, Any]], sender: int) -> list[dict[str, Any]]:
    return [r for r in records if r.get("type") == "signal" and r["pid"] == sender]


def _check(records: list[dict[str, Any]]) -> None:
    """Each record as its declared type's schema says (the plug-in's own records, derived from its types)."""
    for record in records:
        kind = SignalRecord if record["type"] == "signal" else SignalsSummary
        jsonschema.validate(record, record_schema(kind))


def test_the_cli_lists_it_and_runs_it_filtered_in_the_kernel(plugin: Path, pair: Pair) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "netsleuth", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "signals" in shown and "every kill(2) with the sender's" in shown, shown
    here, there = _sleeper(pair.a), _sleeper(pair.b)
    try:
        with TraceRun("signals", "--netns", pair.a.name) as run:
            run.wait_ready()
            sender = _kill(pair.a, here, there)
            elsewhere = _kill(pair.b, here)  # another namespace's sender: the kernel filters it out
            run.wait_records(lambda r: r.get("type") == "signal" and r["pid"] == sender, count=2)
            # Stopped by hand: TraceRun.stop checks records against netsleuth's own schemas, and these are
            # the plug-in's (checked against its types below).
            run.process.send_signal(signal.SIGINT)
            assert run.process.wait(30) == 0, run.stderr()
            records = run.records()
    finally:
        for process in (here, there):
            process.kill()
            process.wait()
    ours = _ours(records, sender)
    assert [(r["target_pid"], r["netns"], r["target_netns"]) for r in ours] == [
        (here.pid, _inode(pair.a), _inode(pair.a)),
        (there.pid, _inode(pair.a), _inode(pair.b)),
    ]
    assert not _ours(records, elsewhere)
    assert records[-1]["type"] == "summary" and records[-1]["netns_filter"] == _inode(pair.a)
    _check(records)


def test_an_agent_session_runs_it(plugin: Path, pair: Pair) -> None:
    here = _sleeper(pair.a)
    try:
        with AgentProcess({"sessions": {"max_duration": 60}}) as agent:
            agent.wait_ready()
            request = {"diagnostic": "signals", "config": {"netns": pair.a.name}, "duration": 3}
            with agent.client.session(request) as stream:
                lines = iter(stream)
                start = next(lines)
                assert start["type"] == "session_start" and start["diagnostic"] == "signals", start
                sender = _kill(pair.a, here)
                records = list(lines)
    finally:
        here.kill()
        here.wait()
    assert [r["target_pid"] for r in _ours(records, sender)] == [here.pid]
    assert records[-2]["type"] == "summary" and records[-2]["netns_filter"] == _inode(pair.a)
    assert records[-1]["type"] == "session_end" and records[-1]["reason"] == "duration"
    _check(records[1:-1])


@pytest.fixture(scope="module")
def fleet(plugin: Path) -> Iterator[tuple[FleetLab, ControllerProcess]]:
    with FleetLab(hosts=("client", "server"), agents=False) as lab:
        # The machine's agent, registered as host "client": both namespaces of the lab are on its host.
        lab.start_agent("client", scoped=False)
        role = (
            "[roles.signals-client]\n"
            'diagnostics = ["signals"]\n'
            'hosts = ["client"]\n'
            f'netns = ["{lab.hosts["client"].netns}"]\n'
            "max_duration = 30\n"
        )
        with ControllerProcess(lab, extra_config=role, extra_users={"sam": ["signals-client"]}) as controller:
            yield lab, controller


def _api(controller: ControllerProcess, user: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {controller.tokens[user]}"}
    return httpx.Client(base_url=controller.url, headers=headers, timeout=30)


def test_a_fleet_task_through_the_controller_is_held_to_its_scope(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    lab, controller = fleet
    client, server = lab.hosts["client"].ns, lab.hosts["server"].ns
    here, there = _sleeper(client), _sleeper(server)
    try:
        with _api(controller, "sam") as api:
            body = {"hosts": ["client"], "diagnostic": "signals", "config": {}, "duration": 4}
            # The role allows the client's namespace only: the server's is refused before anything is sent.
            other = api.post("/api/v1/sessions", json={**body, "config": {"netns": server.name}})
            assert other.status_code == 403 and "network namespace" in other.json()["error"], other.text
            created = api.post("/api/v1/sessions", json={**body, "config": {"netns": client.name}})
            assert created.status_code == 201, created.text
            session = created.json()["id"]
            assert created.json()["scope"]["netns"] == [client.name]

            def running() -> bool:
                host = api.get(f"/api/v1/sessions/{session}").json()["hosts"]["client"]
                assert host["state"] not in ("failed", "rejected"), host
                return bool(host["state"] == "running")

            wait_for(running, 90, "the client to run the session")
            sender = _kill(client, here, there)  # inside the scope, to one inside it and one outside
            elsewhere = _kill(server, here)  # outside the scope: never in the kernel's output
            ended: dict[str, Any] = {}

            def done() -> bool:
                ended.update(api.get(f"/api/v1/sessions/{session}").json())
                return ended.get("state") in ("ended", "failed", "cancelled")

            wait_for(done, 90, "the session to end")
    finally:
        for process in (here, there):
            process.kill()
            process.wait()
    host = ended["hosts"]["client"]
    assert ended["state"] == "ended" and host["state"] == "ended", ended
    timeline = ended["timeline"]
    # The kill to the process outside the scope was withheld by the last line and counted; the other came.
    assert [r["target_pid"] for r in _ours(timeline, sender)] == [here.pid], timeline
    assert not _ours(timeline, elsewhere) and not [r for r in timeline if r.get("target_pid") == there.pid]
    assert host["totals"]["withheld"] >= 1, host
    summary = next(r for r in timeline if r.get("type") == "summary")
    assert summary["netns_filter"] == _inode(client)  # the kernel filter was given the scope's namespace


def test_the_controller_publishes_its_config_schema_in_openapi_and_the_forms_catalogue(
    fleet: tuple[FleetLab, ControllerProcess],
) -> None:
    _lab, controller = fleet
    with _api(controller, "sam") as api:
        document = api.get("/openapi.json").json()
        catalogue = {entry["name"]: entry for entry in api.get("/api/v1/diagnostics").json()}
    schemas = document["components"]["schemas"]
    netns = schemas["config.signals"]["properties"]["netns"]
    assert netns["title"] == "network namespace" and netns["x-flag"] == "--netns", netns
    mapping = schemas["SessionRequest"]["discriminator"]["mapping"]
    assert mapping["signals"] == "#/components/schemas/SessionRequest.signals"
    request = document["paths"]["/api/v1/sessions"]["post"]["requestBody"]["content"]["application/json"]
    assert request["schema"] == {"$ref": "#/components/schemas/SessionRequest"}
    entry = catalogue["signals"]
    assert entry["help"] == "every kill(2) with the sender's and the target's network namespaces"
    form = entry["config"]["properties"]
    assert form["netns"]["x-scope"] == "network-namespace" and form["netns"]["x-group"]
    assert form["duration"]["x-form"] is False  # the session request's own duration
