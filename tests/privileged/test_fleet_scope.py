"""A fleet task's scope holds on the agent (issue 9): nothing from outside it leaves the host.

One whole-host agent (no `fleet.netns`, as on a real machine) sees every namespace of the lab: `client`,
`lb` and `server`. Its tasks are scoped to `client`. Traffic, drops and NAT happen both inside the scope
and outside it, on the same flows:

    client: nftables DNAT 198.18.0.99:90 -> 198.18.1.10:80 (output), iptables OUTPUT --dport 7070 DROP
    lb:     DNAT 198.18.1.10:80 -> 198.18.2.7:8080            server: INPUT --dport 8080 DROP

So one connection from client to 198.18.0.99:90 is translated in client (in scope), again in lb and dropped
in server (both out of scope), and one to server:7070 is dropped in client (in scope). A `conn` report joins
every namespace's drops and conntrack by design (docs/conn.md): before the scope was enforced on the agent it
carried lb's DNAT and server's drop to whoever was allowed only client. Here the streamed records, the
conntrack entries and the merged timeline name client alone, each ended status reports how much the agent
withheld, and tasks that reach past the scope are refused with the reason audited.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from netsleuth.fleet.merge import MergedTimeline
from netsleuth.fleet.protocol import Scope
from tests.fleet_lab import DirectController, FleetLab, connect
from tests.netlab import run, wait_for
from tests.record_check import check_records

INNER_VIP = "198.18.0.99"  # translated inside client's namespace, to the lb's VIP
INNER_PORT = 90
CLIENT_DROPPED_PORT = 7070  # client's own firewall drops it on the way out
REFUSED_PORT = 7071  # nothing listens there on server: its stack answers the SYN with an RST


@pytest.fixture(scope="module")
def lab() -> Iterator[FleetLab]:
    with FleetLab(hosts=("client", "lb", "server"), agents=False) as the_lab:
        client = the_lab.hosts["client"].ns
        rules = (
            "table ip scope_nat {\n"
            " chain output {\n"
            "  type nat hook output priority -100; policy accept;\n"
            f"  ip daddr {INNER_VIP} tcp dport {INNER_PORT} dnat to 198.18.1.10:80\n"
            " }\n"
            "}\n"
        )
        run(*client.argv("nft", "-f", "-"), input_text=rules)
        client.run("iptables", "-A", "OUTPUT", "-p", "tcp", "--dport", str(CLIENT_DROPPED_PORT), "-j", "DROP")
        # The machine's agent, registered as host "client": every namespace of the lab is on its host.
        the_lab.start_agent("client", scoped=False)
        yield the_lab


@pytest.fixture
def direct(lab: FleetLab) -> Iterator[DirectController]:
    with DirectController(lab) as controller:
        controller.watch_audit()
        yield controller


def _traffic(lab: FleetLab) -> None:
    server = lab.hosts["server"].address
    # Both time out: SYNs dropped by server's firewall (after two DNATs) and by client's own.
    assert connect(lab, "client", INNER_VIP, INNER_PORT, timeout=1.5) == "TimeoutError"
    assert connect(lab, "client", server, CLIENT_DROPPED_PORT, timeout=1.5) == "TimeoutError"


def _run(
    lab: FleetLab, direct: DirectController, session: str, diagnostic: str, config: dict[str, Any]
) -> None:
    scope = Scope(netns=(lab.hosts["client"].netns,))
    direct.run_session(session, ("client",), diagnostic=diagnostic, config=config, deadline_s=6, scope=scope)
    direct.wait_states(session, {"client": ("running",)}, timeout=60)
    _traffic(lab)
    direct.wait_states(session, {"client": ("ended", "failed")}, timeout=60)


def _foreign(lab: FleetLab) -> tuple[str, ...]:
    """Every text that would name a namespace outside the scope: its name and its inode."""
    names = []
    for host in ("lb", "server"):
        netns = lab.hosts[host].netns
        inode = subprocess.run(
            ["stat", "-L", "-c", "%i", f"/run/netns/{netns}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        names += [netns, f'"netns": {inode}', f'"netns":"{inode}"', f'"netns": "{inode}"']
    return tuple(names)


def _assert_inside(lab: FleetLab, records: list[dict[str, Any]]) -> None:
    text = json.dumps(records)
    leaked = [name for name in _foreign(lab) if name in text]
    assert not leaked, (leaked, records)


def _ended_with_withheld_reported(direct: DirectController, session: str) -> int:
    status = direct.states(session)["client"]
    assert status.state == "ended", status
    assert status.totals["withheld"] == status.withheld >= 0, status
    if status.withheld:
        assert any(note.startswith(f"withheld {status.withheld} out-of-scope") for note in status.notes), (
            status
        )
    return status.withheld


def test_a_conn_report_names_only_the_scopes_namespace(lab: FleetLab, direct: DirectController) -> None:
    client_ns = lab.hosts["client"].netns
    _run(lab, direct, "scope-conn", "conn", {"proto": "tcp"})
    records = direct.records("scope-conn", "client")
    reports = [r for r in records if r["type"] == "conn"]
    assert reports, records
    _assert_inside(lab, records)
    # What is inside the scope is all there: the DNAT in client, and client's own drop with its rule.
    translated = [r for r in reports if r["daddr"] == INNER_VIP and r["dport"] == INNER_PORT]
    assert translated and all(r["client_netns"] == client_ns for r in translated), reports
    hops = [hop for r in translated for hop in r["nat"]]
    assert hops and all(hop["where"] == f"netns {client_ns}" for hop in hops), hops
    assert any(hop["after"]["dst"] == lab.hosts["lb"].address for hop in hops), hops
    dropped = [r for r in reports if r["dport"] == CLIENT_DROPPED_PORT]
    drops = [e for r in dropped for e in r["timeline"] if e["event"] == "drop"]
    assert drops and all(e["netns"] == client_ns for e in drops), dropped
    assert all(e["netns"] == client_ns for r in reports for e in r["timeline"]), reports
    # The NAT entries the controller joins flows with: read in client's table only.
    conntrack = [r for r in records if r["type"] == "conntrack"]
    assert conntrack and all(r["netns"] == client_ns for r in conntrack), conntrack
    assert any(r["orig"]["dst"] == INNER_VIP and r["orig"]["dport"] == INNER_PORT for r in conntrack), (
        conntrack
    )
    check_records(r for r in records if r["type"] != "conntrack")
    # Confined in the kernel and in the NAT join: nothing was left for the last line to hold back.
    assert _ended_with_withheld_reported(direct, "scope-conn") == 0
    assert "netsleuth_fleet_records_withheld_total 0.0" in lab.agent("client").metrics()

    # The merged timeline the controller builds from it, each namespace placed on the host that owns it.
    owners = {lab.hosts[h].netns: h for h in ("client", "lb", "server")}
    merged = MergedTimeline(netns_owner=owners)
    for record in records:
        merged.add("client", record)
    timeline = merged.timeline()
    assert timeline and {entry["host"] for entry in timeline} == {"client"}, timeline
    _assert_inside(lab, timeline)
    assert any(entry.get("event") == "nat" for entry in timeline), timeline


def test_drops_stream_only_the_scopes_drops(lab: FleetLab, direct: DirectController) -> None:
    client_ns = lab.hosts["client"].netns
    _run(lab, direct, "scope-drops", "drops", {"proto": "tcp"})
    records = direct.records("scope-drops", "client")
    drops = [r for r in records if r["type"] == "drop"]
    assert drops and all(r["netns_name"] == client_ns for r in drops), records
    assert any(r["dport"] == CLIENT_DROPPED_PORT for r in drops), drops
    _assert_inside(lab, records)
    summary = records[-1]
    assert summary["type"] == "summary" and all(g["netns_name"] == client_ns for g in summary["groups"])
    check_records(r for r in records if r["type"] != "conntrack")
    status = direct.states("scope-drops")["client"]
    # Server's drops of the same flow were never counted: the kernel filtered them, not the agent.
    assert status.totals["total"] == len(drops), (status, drops)
    assert _ended_with_withheld_reported(direct, "scope-drops") == 0


def test_resets_stream_only_the_scopes_resets(lab: FleetLab, direct: DirectController) -> None:
    """A typed diagnostic as a fleet task: the RST client received, never the one server's stack sent for
    it (the kernel's namespace filter, from the scope admission pushed into the config)."""
    client_ns = lab.hosts["client"].netns
    server = lab.hosts["server"].address
    scope = Scope(netns=(client_ns,))
    direct.run_session("scope-resets", ("client",), diagnostic="resets", config={}, deadline_s=6, scope=scope)
    direct.wait_states("scope-resets", {"client": ("running",)}, timeout=60)
    assert connect(lab, "client", server, REFUSED_PORT) == "ConnectionRefusedError"
    direct.wait_states("scope-resets", {"client": ("ended", "failed")}, timeout=60)
    records = direct.records("scope-resets", "client")
    resets = [r for r in records if r["type"] == "reset"]
    assert resets and all(r["netns_name"] == client_ns and r["direction"] == "received" for r in resets), (
        records
    )
    refused = [r for r in resets if (r["saddr"], r["sport"]) == (server, REFUSED_PORT)]
    assert refused and refused[0]["cause_code"] == "connection_refused", resets
    _assert_inside(lab, records)
    summary = records[-1]
    assert summary["type"] == "summary" and summary["diagnostic"] == "resets", summary
    assert summary["sent"]["total"] == 0 and summary["received"]["total"] == len(resets), summary
    check_records(r for r in records if r["type"] != "conntrack")
    assert _ended_with_withheld_reported(direct, "scope-resets") == 0


def _refused(lab: FleetLab, direct: DirectController, session: str, expect: str, **task: Any) -> None:
    signed = lab.sign(lab.task("client", session, **task))
    direct.watch(session)
    reply = direct.send("client", signed.encode())
    assert not reply.accepted and expect in reply.reason, reply
    direct.wait_states(session, {"client": ("rejected",)})
    assert direct.states(session)["client"].reason == reply.reason
    wait_for(
        lambda: any(e["task_id"] == signed.task.id for e in direct.audit), 10, "the agent's audit record"
    )
    (entry,) = [e for e in direct.audit if e["task_id"] == signed.task.id]
    assert entry["decision"] == "deny" and entry["reason"] == reply.reason


def test_tasks_reaching_past_the_scope_are_refused_with_the_reason_audited(
    lab: FleetLab, direct: DirectController
) -> None:
    scope = Scope(netns=(lab.hosts["client"].netns,))
    server_ns = lab.hosts["server"].netns
    _refused(lab, direct, "scope-other", "outside the task's scope", config={"netns": server_ns}, scope=scope)
    # Per-CPU histograms say nothing of their namespace: only a host-wide scope may have them.
    _refused(lab, direct, "scope-softirq", "needs a host-wide scope", diagnostic="softirq", scope=scope)
    _refused(lab, direct, "scope-profile", "needs a host-wide scope", diagnostic="profile", scope=scope)


def test_a_host_wide_scope_runs_what_a_namespace_scope_may_not(
    lab: FleetLab, direct: DirectController
) -> None:
    """netns '*' (a role granting every namespace): softirq's per-CPU histograms run, nothing is withheld."""
    wide = Scope(netns=("*",))
    direct.run_session(
        "scope-wide", ("client",), diagnostic="softirq", config={"netns": "*"}, deadline_s=1, scope=wide
    )
    direct.wait_states("scope-wide", {"client": ("ended", "failed")}, timeout=60)
    (summary,) = direct.records("scope-wide", "client")
    assert summary["type"] == "summary" and summary["diagnostic"] == "softirq", summary
    check_records([summary])
    assert _ended_with_withheld_reported(direct, "scope-wide") == 0
