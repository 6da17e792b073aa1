"""The fleet's nkey login against a real nats-server: the server's authorization lists the controller and each
agent by the public key of an nkey (generated here, with the permissions the lab gives its password users),
each logs in by signing the server's nonce with the seed in its `nkey_seed_file`, and a real session runs
over those connections. An agent whose seed the server does not list is refused with one log line (and keeps
retrying); a controller whose seed it does not list ends its start-up with one sentence.

JWT/.creds logins (`creds_file`) need an operator and account set up with nsc and are not tested here.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.controller_lab import ControllerProcess
from tests.fleet_lab import DirectController, FleetLab, NkeyUser, connect, new_nkey_seed
from tests.netlab import wait_for

pytestmark = pytest.mark.privileged

REFUSAL = "refused the login of nkey"
REFUSAL_BOUND_S = 20.0  # agent start (imports, BTF) + first refusal; the refusal itself takes milliseconds


@pytest.fixture(scope="module")
def lab() -> Iterator[FleetLab]:
    # "stranger" is listed in the server's authorization, but its agent is started with another seed.
    with FleetLab(hosts=("client", "server", "stranger"), auth="nkey", agents=False) as the_lab:
        the_lab.start_agent("client")
        the_lab.start_agent("server")
        yield the_lab


def nkey_of(user: object) -> str:
    assert isinstance(user, NkeyUser), f"{user} is not an nkey user: FleetLab(auth='nkey') expected"
    return user.public_key


def connections(lab: FleetLab) -> list[dict[str, Any]]:
    """nats-server's monitoring view of its clients, with the user each one logged in as."""
    url = f"http://127.0.0.1:{lab.monitor_port}/connz?auth=true&limit=1024"
    with urllib.request.urlopen(url, timeout=5) as response:
        conns: list[dict[str, Any]] = json.loads(response.read())["connections"]
    return conns


def logged_in_as(lab: FleetLab, name: str) -> set[str]:
    return {c.get("authorized_user", "") for c in connections(lab) if c.get("name") == name}


def test_the_server_lists_nkeys_not_passwords(lab: FleetLab) -> None:
    config = lab.nats_config_path.read_text()
    for user in (lab.controller_user, *(host.user for host in lab.hosts.values())):
        assert f'"nkey": "{nkey_of(user)}"' in config
        assert f'"user": "{user.user}"' not in config  # no user name, no password: the key is the identity
    agent_config = lab.agent("client").config_path.read_text()
    assert "nkey_seed_file" in agent_config and "password" not in agent_config


def test_agents_log_in_with_their_nkeys_and_run_a_session(lab: FleetLab) -> None:
    """Registered (their KV writes pass their nkey users' permissions), connected as their own nkeys, and a
    drops session prepared, started and ended on both hosts with the server's firewall drop in its records."""
    for host in ("client", "server"):
        assert lab.registry()[host].status == "up"
        assert logged_in_as(lab, f"netsleuth-agent-{host}") == {nkey_of(lab.hosts[host].user)}
    server = lab.hosts["server"].address
    with DirectController(lab) as controller:  # itself logged in with the controller's nkey
        controller.run_session("nk1", ("client", "server"), config={"proto": "tcp"}, deadline_s=2)
        controller.wait_states("nk1", {"client": ("running",), "server": ("running",)})
        assert connect(lab, "client", server, 8080, timeout=0.5) == "TimeoutError"  # INPUT DROP on server
        controller.wait_states("nk1", {"client": ("ended",), "server": ("ended",)}, timeout=20)
        end = controller.states("nk1")["server"]
        drops = [r for r in controller.records("nk1", "server") if r["type"] == "drop"]
    assert end.reason.startswith("duration"), end
    assert drops and all(r["dport"] == 8080 for r in drops), drops
    assert end.totals["total"] == len(drops) + end.totals["sampled"] + end.totals["lost"]


def test_the_controller_logs_in_with_its_nkey_seed(lab: FleetLab) -> None:
    """The real controller process, configured with nats.nkey_seed_file only: it starts (its start-up
    connects), is connected as the controller's nkey, and a session made over its HTTP API runs and ends."""
    with ControllerProcess(lab) as controller:
        config = controller.config_path.read_text()
        assert "nkey_seed_file" in config and "password" not in config.split("[signing]")[0]
        assert logged_in_as(lab, "netsleuth-controller") == {nkey_of(lab.controller_user)}
        headers = {"Authorization": f"Bearer {controller.tokens['alice']}"}
        with httpx.Client(base_url=controller.url, headers=headers, timeout=20) as api:
            body = {"hosts": ["server"], "diagnostic": "drops", "config": {"proto": "tcp"}, "duration": 3}
            response = api.post("/api/v1/sessions", json=body)
            assert response.status_code == 201, response.text
            session_id = response.json()["id"]
            session: dict[str, Any] = {}

            def state(wanted: tuple[str, ...]) -> bool:
                session.update(api.get(f"/api/v1/sessions/{session_id}").json())
                return session["hosts"]["server"]["state"] in wanted or session["state"] == "failed"

            wait_for(lambda: state(("running",)), 60, "the server's agent to run the session")
            connect(lab, "client", lab.hosts["server"].address, 8080, timeout=0.5)
            wait_for(lambda: state(("ended",)) and session["state"] == "ended", 30, "the session to end")
    assert session["hosts"]["server"]["state"] == "ended", session
    assert session["hosts"]["server"]["totals"]["total"] >= 1, session["hosts"]["server"]


def test_an_agent_with_an_unknown_nkey_is_refused_with_one_sentence(lab: FleetLab) -> None:
    unknown_seed = new_nkey_seed()
    unknown_key = nkey_of(NkeyUser("x", "", None, unknown_seed))
    started = time.monotonic()
    agent = lab.start_agent("stranger", wait=False, nkey_seed=unknown_seed)
    try:
        wait_for(lambda: REFUSAL in agent.log_text(), REFUSAL_BOUND_S, "the agent to log the refusal")
        elapsed = time.monotonic() - started
        time.sleep(3)  # it keeps retrying every second: the log must not grow with each attempt
        log = agent.log_text()
        lines = [line for line in log.splitlines() if REFUSAL in line]
        assert len(lines) == 1, log
        assert f"{REFUSAL} {unknown_key} (fleet.nkey_seed_file " in lines[0], lines[0]
        assert "is it listed in the server's authorization?" in lines[0]
        assert "Traceback" not in log and "Connection reset" not in log, log
        assert agent.running()  # the server's authorization may be fixed without restarting the agent
        assert "netsleuth_fleet_connected 0.0" in agent.metrics()
        assert "stranger" not in lab.registry()
        assert f'Nkey "{unknown_key}"' in (lab.workdir / "nats.log").read_text()  # the server's side
    finally:
        lab.stop_agent("stranger")
    print(f"refused and said so {elapsed:.1f} s after the agent was started: {lines[0]}")


def test_a_controller_with_an_unknown_nkey_stops_at_start_up_with_one_sentence(lab: FleetLab) -> None:
    """nats-py retries a refused first login for ever (the controller reconnects without limit): start-up
    must end instead, saying which key was refused, rather than hang before it listens."""
    unknown_seed = new_nkey_seed()
    unknown_key = nkey_of(NkeyUser("x", "", None, unknown_seed))
    assert isinstance(lab.controller_user, NkeyUser)
    other_file = lab.seed_file(lab.controller_user, unknown_seed)

    class StrangerController(ControllerProcess):
        def _config(self) -> str:
            own = lab.controller_credentials["nkeys_seed"]
            return super()._config().replace(f'"{own}"', f'"{other_file}"')

    controller = StrangerController(lab)
    controller.log_path = controller.workdir / "stranger-controller.log"  # not the first controller's log
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="the controller exited"):
            controller.start(timeout=REFUSAL_BOUND_S)
        elapsed = time.monotonic() - started
        assert controller.process is not None and controller.process.wait(5) == 1
    finally:
        controller.stop()  # (a no-op once it has exited by itself)
    log = controller.log_text()
    assert f"refused the login of nkey {unknown_key} (nats.nkey_seed_file {other_file})" in log, log
    assert "Traceback" not in log and len(log.strip().splitlines()) == 1, log
    print(f"the controller exited {elapsed:.1f} s after its start: {log.strip()}")
