"""The seed-001 story across three hosts, end to end: real agents, a real nats-server, a real controller.

The client keeps a connection through the lb's DNAT (VIP:82 -> server:9000) to the server, whose REDIRECT
sends it to a sidecar on :15006 while the application still listens on :9000. One ACK of that connection,
sent 1 GiB ahead of its sequence, is out of any window: the server's conntrack marks it INVALID, so it is not
NATed, reaches the application's LISTEN socket, and the RST it draws travels back through the lb and kills the
client's connection (tests/fleet_lab.py serve_story, invalid_ack). `conn` runs on all three hosts; the
controller's merged verdict must tell that story: outcome reset, hops in causal order, the REDIRECT bypass
on the server with its evidence, NAT hops timed inside the session - and its fixes must work when pasted."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from netsleuth.fleet.merge import parse_time_ns
from tests.controller_lab import ControllerProcess
from tests.fleet_lab import APP_PORT, SIDECAR_PORT, STORY_VIP_PORT, VIP, FleetLab, invalid_ack, serve_story
from tests.netlab import wait_for

pytestmark = pytest.mark.privileged

HOSTS = ("client", "lb", "server")


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[FleetLab, ControllerProcess]]:
    with FleetLab(hosts=HOSTS) as lab, ControllerProcess(lab) as controller:
        serve_story(lab)
        yield lab, controller


def conn_session(
    lab: FleetLab, controller: ControllerProcess, traffic: Callable[[], None], duration: float = 5
) -> dict[str, Any]:
    """One `conn` session on the three hosts, `traffic` once all run; the ended session (API view)."""
    headers = {"Authorization": f"Bearer {controller.tokens['alice']}"}
    with httpx.Client(base_url=controller.url, headers=headers, timeout=20) as client:
        body = {"hosts": list(HOSTS), "diagnostic": "conn", "config": {"proto": "tcp"}, "duration": duration}
        created = client.post("/api/v1/sessions", json=body)
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]

        def state() -> dict[str, Any]:
            found: dict[str, Any] = client.get(f"/api/v1/sessions/{session_id}").json()
            failed = {
                h: v["reason"] for h, v in found["hosts"].items() if v["state"] in ("failed", "rejected")
            }
            assert not failed, failed
            return found

        wait_for(lambda: all(v["state"] == "running" for v in state()["hosts"].values()), 90, "hosts running")
        traffic()
        wait_for(lambda: state()["state"] in ("ended", "failed"), 60, "the session to end")
        session = state()
    assert session["state"] == "ended" and not session["partial"], session["hosts"]
    return session


def story_verdict(session: dict[str, Any], client: str) -> dict[str, Any]:
    flow = f"tcp {client} > {VIP}:{STORY_VIP_PORT}"
    found: list[dict[str, Any]] = [v for v in session["verdicts"] if v["flow"] == flow]
    assert len(found) == 1, session["verdicts"]
    return found[0]


def test_the_invalid_ack_story_is_one_causal_verdict(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    lab, controller = fleet
    seen: dict[str, Any] = {}
    session = conn_session(lab, controller, lambda: seen.update(invalid_ack(lab)))
    assert seen["seen"] == "ConnectionResetError", seen  # the application's connection died
    verdict = story_verdict(session, seen["client"])
    assert verdict["outcome"] == "reset"
    # Hops in causal order: the SYN through the DNAT and the REDIRECT, the handshake, the ACK that skipped
    # the REDIRECT and drew the RST, the RST reaching the client.
    events = [(hop["host"], hop["event"]) for hop in verdict["hops"]]
    assert events == [
        ("client", "sent"), ("lb", "nat"), ("server", "nat"), ("client", "established"),
        ("server", "accepted"), ("server", "bypass"), ("client", "reset"),
    ], verdict["path"]  # fmt: skip
    assert verdict["hops"][1]["detail"] == f"DNAT {VIP}:{STORY_VIP_PORT} -> 198.18.2.7:{APP_PORT} on host lb"
    assert verdict["hops"][2]["detail"] == f"REDIRECT 198.18.2.7:{APP_PORT} -> :{SIDECAR_PORT} on host server"
    # The bypass, named on the server with its evidence, is where it began; the first line says so.
    bypass = verdict["hops"][5]
    ack = f"ACK {seen['client']} > 198.18.2.7:{APP_PORT}"
    app = lab.hosts["server"].run("ss", "-Hltnp", f"sport = :{APP_PORT}").stdout
    pid = app.split("pid=")[1].split(",")[0]
    assert bypass["detail"] == (
        f"{ack} skipped REDIRECT → :{SIDECAR_PORT} on host server (conntrack INVALID: out of window) → "
        f"reached the LISTEN socket of python3[{pid}] on :{APP_PORT} → RST"
    )
    assert bypass["began"] is True and verdict["began"] == 5
    evidence = bypass["evidence"]
    assert evidence["segment"]["flags"] == "ACK" and evidence["segment"]["seq"] == seen["ack_seq"]
    assert evidence["conntrack_invalid"] >= 1 and evidence["nf_conntrack_tcp_be_liberal"] == 0
    assert evidence["nat"].startswith(f"REDIRECT 198.18.2.7:{APP_PORT} -> :{SIDECAR_PORT} (ESTABLISHED")
    assert verdict["text"].startswith(
        f"tcp {seen['client']} > {VIP}:{STORY_VIP_PORT}: the application on host client had its connection "
        f"reset (ECONNRESET); it began at hop 6 on host server: {ack} skipped REDIRECT → :{SIDECAR_PORT} "
        "(conntrack INVALID: out of window) → reached the LISTEN socket"
    )
    # Each NAT hop carries when it happened (conntrack's NEW event), inside the session's window - not the
    # time its table was read at the end.
    t0 = parse_time_ns(session["t0"])
    assert t0 is not None
    window_end = t0 + int(session["duration"] * 1e9)
    sent = parse_time_ns(verdict["hops"][0]["time"])
    for hop in verdict["hops"][1:3]:
        stamp = parse_time_ns(hop["time"])
        assert stamp is not None and t0 <= stamp <= window_end, (hop, session["t0"])
        assert stamp - sent < 100_000_000, hop  # type: ignore[operator]  # seconds late before


def test_each_fix_of_the_verdict_works_when_pasted(fleet: tuple[FleetLab, ControllerProcess]) -> None:
    """The verdict's fixes, run as printed (a shell, the comment included): the out-of-window ACK no longer
    resets the connection. Each is undone before the next."""
    lab, controller = fleet
    seen: dict[str, Any] = {}
    session = conn_session(lab, controller, lambda: seen.update(invalid_ack(lab)))
    fixes = story_verdict(session, seen["client"])["fix"]
    assert len(fixes) == 2 and "nf_conntrack_tcp_be_liberal=1" in fixes[0] and "INVALID -j DROP" in fixes[1]
    server = lab.hosts["server"]
    invalid_drop = ["-p", "tcp", "-d", "198.18.2.7", "--dport", str(APP_PORT)]
    invalid_drop += ["-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"]
    undo = (
        ("sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_be_liberal=0"),
        ("iptables", "-D", "INPUT", *invalid_drop),
    )
    for fix, revert in zip(fixes, undo, strict=True):
        subprocess.run(["sh", "-c", fix], check=True)
        try:
            after = invalid_ack(lab, wait=1.5)
        finally:
            server.run(*revert)
        assert after["seen"] == "TimeoutError", (fix, after)  # nothing came back: the connection lives
