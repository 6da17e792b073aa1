"""The fleet agent against a real nats-server, real agents and real namespaces (tests/fleet_lab.py).

Tasks are sent straight to NATS as the controller's NATS user - bypassing any controller - so every refusal
here is the agent's own: the signature, not the transport, is what an agent trusts. Sessions are checked
end to end: prepared on several hosts, started at one T0, a real flow dropped by a real firewall rule on
the far host, exact totals, and nothing left attached (bpftool), also when NATS dies mid-session.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from netsleuth.fleet.protocol import Budgets, Control, HostStatus, Scope, SignedTask, generate_private_key
from tests.fleet_lab import VIP, DirectController, FleetLab, connect
from tests.netlab import wait_for
from tests.privileged.test_agent_harness import bpf_object_ids, loaded_ids
from tests.record_check import check_records

_CONNECT = (
    "import socket,sys\n"
    "s=socket.socket();s.settimeout(float(sys.argv[3]))\n"
    "try: s.connect((sys.argv[1],int(sys.argv[2])))\n"
    "except OSError as e: print(type(e).__name__)\n"
)


@pytest.fixture(scope="module")
def lab() -> Iterator[FleetLab]:
    with FleetLab(hosts=("client", "lb", "server")) as the_lab:
        yield the_lab


@pytest.fixture
def controller(lab: FleetLab) -> Iterator[DirectController]:
    for name in lab.hosts:  # a previous test may have killed one
        lab.start_agent(name)
    with DirectController(lab) as direct:
        direct.watch_audit()
        yield direct


def programs_of(pid: int) -> set[int]:
    """Ids of the BPF programs process `pid` holds (its fds' fdinfo)."""
    return bpf_object_ids(pid)[0]


def detached(pid: int) -> Callable[[], bool]:
    return lambda: not programs_of(pid)


def gone_from_kernel(pid: int) -> Callable[[], bool]:
    """Everything `pid` holds now is checked, later, against bpftool's list of every loaded program/link."""
    programs, links = bpf_object_ids(pid)

    def released() -> bool:
        try:
            loaded_programs, loaded_links = loaded_ids()
        except subprocess.CalledProcessError:
            return False  # bpftool can fail while the kernel is tearing a link down: ask again
        return not programs & loaded_programs and not links & loaded_links

    return released


def connect_through_vip(lab: FleetLab, port: int = 80, timeout: float = 1.0) -> str:
    return lab.hosts["client"].run("python3", "-c", _CONNECT, VIP, str(port), str(timeout)).stdout.strip()


def refused(controller: DirectController, host: str, signed: SignedTask, expect: str) -> HostStatus:
    session = signed.task.session
    controller.watch(session)
    reply = controller.send(host, signed.encode())
    assert not reply.accepted
    assert expect in reply.reason, reply.reason
    controller.wait_states(session, {host: ("rejected",)})
    status = controller.states(session)[host]
    assert status.reason == reply.reason  # the controller audits the same sentence it was told
    # The agent's own audit record, whoever delivered the task.
    wait_for(
        lambda: any(entry.get("task_id") == signed.task.id for entry in controller.audit),
        5,
        "the audit record",
    )
    (entry,) = [entry for entry in controller.audit if entry.get("task_id") == signed.task.id]
    assert entry["action"] == "task.rejected" and entry["decision"] == "deny" and entry["host"] == host
    assert entry["reason"] == reply.reason and entry["user"] == signed.task.user
    return status


# -- refusals, each by the agent -----------------------------------------------------------------------
def test_agent_refuses_what_the_controller_key_did_not_sign(
    lab: FleetLab, controller: DirectController
) -> None:
    before = programs_of(lab.agent("server").pid)
    forged = SignedTask.sign(lab.task("server", "forged1"), generate_private_key(), lab.key_id)
    refused(controller, "server", forged, "does not verify")
    # A valid signature over another task, with this task's body: tampering is caught too.
    genuine = lab.sign(lab.task("server", "tamper1"))
    body = genuine.to_json()
    body["task"]["scope"] = {"netns": [lab.hosts["lb"].netns], "cgroups": [], "addresses": []}
    reply = controller.send("server", json.dumps(body).encode())
    assert not reply.accepted and "does not verify" in reply.reason
    assert programs_of(lab.agent("server").pid) == before  # nothing was loaded for them


def test_agent_refuses_expired_and_replayed_tasks(lab: FleetLab, controller: DirectController) -> None:
    now = time.time()
    expired = lab.task("server", "expired1")
    expired = type(expired)(**{**expired.__dict__, "issued_at": now - 60, "expires_at": now - 30})
    refused(controller, "server", lab.sign(expired), "expired")
    once = lab.sign(lab.task("server", "replay1", config={"proto": "udp"}))
    controller.watch("replay1")
    assert controller.send("server", once.encode()).accepted
    again = controller.send("server", once.encode())
    assert not again.accepted and "replay" in again.reason
    controller.control("server", Control("replay1", "cancel"))
    controller.wait_states("replay1", {"server": ("ended",)}, timeout=30)
    # Still refused after the first run ended: the id is remembered until the task expires.
    assert not controller.send("server", once.encode()).accepted
    assert "rejected" in controller.history("replay1", "server")


def test_agent_refuses_unknown_diagnostics_and_foreign_scopes(
    lab: FleetLab, controller: DirectController
) -> None:
    refused(
        controller,
        "server",
        lab.sign(lab.task("server", "unknown1", diagnostic="rm-rf")),
        "unknown diagnostic",
    )
    other_netns = Scope(netns=(lab.hosts["lb"].netns,))
    refused(
        controller, "server", lab.sign(lab.task("server", "scope1", scope=other_netns)), "outside this host"
    )
    via_config = lab.task("server", "scope2", config={"netns": lab.hosts["client"].netns})
    refused(controller, "server", lab.sign(via_config), "outside this host")
    bad_filter = lab.task("server", "filter1", config={"proto": "tcp", "dport": "http"})
    refused(controller, "server", lab.sign(bad_filter), "invalid config for drops")
    cgroup = Scope(netns=(lab.hosts["server"].netns,), cgroups=("/sys/fs/cgroup/x",))
    refused(controller, "server", lab.sign(lab.task("server", "cgroup1", scope=cgroup)), "cgroup")
    wrong_host = lab.task("lb", "host1")  # signed for lb, delivered to server
    reply = controller.send("server", lab.sign(wrong_host).encode())
    assert not reply.accepted and "is for host 'lb'" in reply.reason
    reply = controller.send("server", b"{not json")
    assert not reply.accepted and "not valid JSON" in reply.reason
    # The agent's own metrics count them.
    metrics = lab.agent("server").metrics()
    assert "netsleuth_fleet_connected 1.0" in metrics
    refused_name = 'netsleuth_fleet_tasks_total{decision="refused"}'
    refused_line = next(line for line in metrics.splitlines() if line.startswith(refused_name))
    assert float(refused_line.split()[-1]) >= 7


def test_agent_nats_user_reaches_only_its_own_subjects(lab: FleetLab) -> None:
    """An agent's credentials cannot deliver a task to another host (permissions in nats_config)."""
    import asyncio

    import nats
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    signed = lab.sign(lab.task("server", "lateral1"))

    async def as_client_agent() -> str:
        errors: list[str] = []

        async def on_error(error: Exception) -> None:
            errors.append(str(error))

        client = await nats.connect(
            lab.nats_url, inbox_prefix="_INBOX_client", error_cb=on_error, **lab.agent_credentials("client")
        )
        try:
            try:
                await client.request("netsleuth.host.server.task", signed.encode(), timeout=1)
                return "delivered"
            except (TimeoutError, NatsTimeout, NoRespondersError):
                await asyncio.sleep(0.2)
                return " ".join(errors) or "timeout"
        finally:
            await client.close()

    outcome = lab._run(as_client_agent())
    assert "permissions violation" in outcome.lower(), outcome


# -- sessions --------------------------------------------------------------------------------------------
def test_three_hosts_start_together_and_see_the_far_drop(lab: FleetLab, controller: DirectController) -> None:
    hosts = ("client", "lb", "server")
    pids = {host: lab.agent(host).pid for host in hosts}
    t0_ns = controller.run_session("sync1", hosts, config={"proto": "tcp"}, deadline_s=2.5)
    states = controller.states("sync1")
    for host in hosts:
        assert states[host].state in ("ready", "running")
        assert abs(states[host].offset_ns) < 50_000_000  # one machine: the offsets are tiny but measured
        assert programs_of(pids[host]), f"{host} has nothing attached in prepare"
    released = {host: gone_from_kernel(pids[host]) for host in hosts}
    controller.wait_states("sync1", {host: ("running", "ended") for host in hosts})
    wait_for(lambda: time.time_ns() > t0_ns, 5, "T0")
    assert connect_through_vip(lab) == "TimeoutError"  # SYN -> DNAT on lb -> dropped on server
    controller.wait_states("sync1", {host: ("ended",) for host in hosts}, timeout=15)
    skews = [s.start_skew_ns for s in controller.statuses["sync1"] if s.state == "running"]
    assert len(skews) == 3 and all(skew is not None and 0 <= skew < 100_000_000 for skew in skews), skews
    server = controller.states("sync1")["server"]
    assert server.reason.startswith("duration")
    drops = [r for r in controller.records("sync1", "server") if r["type"] == "drop"]
    assert drops, controller.records("sync1", "server")
    assert all(r["dport"] == 8080 for r in drops)
    assert server.totals["total"] == len(drops) + server.totals["sampled"] + server.totals["lost"]
    assert server.events == len(drops)
    # The client's SYNs left normally: nothing dropped in its namespace.
    assert controller.states("sync1")["client"].totals["total"] == 0
    # The lb's conntrack entry of the flow came at the end: what lets the controller join it across the DNAT.
    nat = [
        r for r in controller.records("sync1", "lb") if r["type"] == "conntrack" and "DST_NAT" in r["status"]
    ]
    assert any(
        r["orig"]["dst"] == VIP and r["orig"]["dport"] == 80 and r["reply"]["sport"] == 8080 for r in nat
    ), nat
    for host in hosts:  # what agents stream is what the diagnostics declare (record_schemas)
        check_records(r for r in controller.records("sync1", host) if r["type"] != "conntrack")
    summary = controller.records("sync1", "server")[-1]
    assert summary["type"] == "summary" and summary["total"] == server.totals["total"]
    for host in hosts:
        wait_for(detached(pids[host]), 5, f"{host}'s programs to be detached")
        wait_for(released[host], 10, f"bpftool to no longer list {host}'s session programs")


def test_summary_groups_and_total_count_the_same_window(lab: FleetLab, controller: DirectController) -> None:
    """SYNs dropped on the server after its programs attached but before T0 are in neither the summary's
    total nor its groups; those after T0 are in both: one count, the window's."""
    controller.watch("window1")
    task = lab.task("server", "window1", config={"proto": "tcp", "dport": 8080}, deadline_s=2.0)
    assert controller.send("server", lab.sign(task).encode()).accepted
    controller.wait_states("window1", {"server": ("ready",)})
    before_t0 = 3
    for _ in range(before_t0):  # attached, not started: dropped and counted, before the window
        assert connect_through_vip(lab, timeout=0.3) == "TimeoutError"
    t0_ns = time.time_ns() + 300_000_000
    controller.control("server", Control("window1", "start", t0_ns))
    controller.wait_states("window1", {"server": ("running",)})
    wait_for(lambda: time.time_ns() > t0_ns, 5, "T0")
    assert connect_through_vip(lab, timeout=0.3) == "TimeoutError"
    controller.wait_states("window1", {"server": ("ended",)}, timeout=15)
    server = controller.states("window1")["server"]
    drops = [r for r in controller.records("window1", "server") if r["type"] == "drop"]
    summary = controller.records("window1", "server")[-1]
    assert summary["type"] == "summary"
    # One SYN in the window (a 0.3 s connect sends no retransmission), none from before it.
    assert len(drops) == 1 and summary["total"] == server.totals["total"] == 1, (drops, summary)
    assert sum(group["count"] for group in summary["groups"]) == summary["total"], summary["groups"]


def test_event_budget_ends_the_session(lab: FleetLab, controller: DirectController) -> None:
    one_event = Budgets(max_events=1, max_bytes=1 << 20, cpu_percent=5)
    config = {"proto": "tcp", "dport": 8080}
    controller.run_session("budget1", ("server",), config=config, deadline_s=20, budgets=one_event)
    controller.wait_states("budget1", {"server": ("running",)})

    def send_and_check() -> bool:
        connect_through_vip(lab, timeout=0.3)
        return _ended(controller, "budget1")

    wait_for(send_and_check, 10, "the event cap to end the session")
    status = controller.states("budget1")["server"]
    assert status.reason.startswith("max_events") and status.events == 1


def _ended(controller: DirectController, session: str) -> bool:
    status = controller.states(session).get("server")
    return status is not None and status.state == "ended"


def test_killed_agent_leaves_nothing_and_the_other_host_finishes(
    lab: FleetLab, controller: DirectController
) -> None:
    controller.run_session("kill1", ("client", "server"), config={"proto": "tcp"}, deadline_s=2)
    controller.wait_states("kill1", {"client": ("running",), "server": ("running",)})
    assert programs_of(lab.agent("server").pid)
    released = gone_from_kernel(lab.agent("server").pid)
    lab.kill_agent("server")
    wait_for(released, 10, "the kernel to free the killed agent's programs and links (bpftool)")
    controller.wait_states("kill1", {"client": ("ended",)}, timeout=10)
    assert controller.states("kill1")["client"].reason.startswith("duration")
    assert (
        controller.states("kill1")["server"].state == "running"
    )  # its last word; the controller times it out


def test_nats_dies_mid_session_agents_stop_at_deadline_then_reregister(
    lab: FleetLab, controller: DirectController
) -> None:
    hosts = ("client", "server")
    pids = {host: lab.agent(host).pid for host in hosts}
    controller.run_session("nats1", hosts, config={"proto": "tcp"}, deadline_s=2)
    controller.wait_states("nats1", {host: ("running",) for host in hosts})
    assert all(programs_of(pids[host]) for host in hosts)
    released = {host: gone_from_kernel(pids[host]) for host in hosts}
    lab.stop_nats(kill=True)
    started = time.monotonic()
    try:
        # No controller, no NATS: each agent ends by its own deadline and detaches.
        for host in hosts:
            wait_for(released[host], 10, f"{host}'s programs to leave the kernel without NATS (bpftool)")
        assert time.monotonic() - started < 4
        assert all(lab.agent(host).running() for host in hosts)
    finally:
        restarted = time.time_ns()
        lab.start_nats()
    lab.wait_registered(lab.hosts, since_ns=restarted, timeout=20)
    # The next session works over the restarted server.
    controller.run_session("nats2", hosts, config={"proto": "tcp"}, deadline_s=0.5)
    controller.wait_states("nats2", {host: ("ended",) for host in hosts}, timeout=15)


def test_cancel_and_start_timeout(lab: FleetLab, controller: DirectController) -> None:
    controller.watch("cancel1")
    assert controller.send("lb", lab.sign(lab.task("lb", "cancel1", deadline_s=30)).encode()).accepted
    controller.wait_states("cancel1", {"lb": ("ready",)})
    released = gone_from_kernel(lab.agent("lb").pid)
    controller.control("lb", Control("cancel1", "cancel"))
    controller.wait_states("cancel1", {"lb": ("ended",)})
    assert controller.states("cancel1")["lb"].reason.startswith("cancelled")
    wait_for(released, 10, "the cancelled session's programs to leave the kernel")
    controller.watch("timeout1")
    never_started = lab.task("lb", "timeout1", lifetime_s=1.5)
    assert controller.send("lb", lab.sign(never_started).encode()).accepted
    controller.wait_states("timeout1", {"lb": ("ended",)}, timeout=10)
    assert controller.states("timeout1")["lb"].reason.startswith("start_timeout")
    wait_for(lambda: not programs_of(lab.agent("lb").pid), 5, "lb to detach")


def test_a_stopped_agent_ends_its_sessions_and_says_so_in_the_registry(
    lab: FleetLab, controller: DirectController
) -> None:
    """SIGTERM mid-session: the session ends "agent_stopping" with its totals, everything is detached, the
    entry turns "stopping" (the controller stops offering the host); a restarted agent is "up" again."""
    controller.run_session("term1", ("lb",), config={"proto": "tcp"}, deadline_s=30)
    controller.wait_states("term1", {"lb": ("running",)})
    released = gone_from_kernel(lab.agent("lb").pid)
    assert lab.stop_agent("lb") == 0
    controller.wait_states("term1", {"lb": ("ended",)}, timeout=10)
    end = controller.states("term1")["lb"]
    assert end.state == "ended" and end.reason.startswith("agent_stopping"), end
    assert "total" in end.totals
    wait_for(released, 10, "the stopped agent's programs to leave the kernel")
    wait_for(lambda: lab.registry()["lb"].status == "stopping", 10, "lb's entry to say stopping")
    restarted = time.time_ns()
    lab.start_agent("lb")
    assert lab.wait_registered(["lb"], since_ns=restarted)["lb"].status == "up"


def test_a_whole_host_agent_confines_each_task_to_its_scope_in_the_kernel() -> None:
    """An agent without fleet.netns (a real host's agent): a task whose scope names no namespace watches
    only the agent's own (root) namespace - the server namespace's firewall drop is not seen - and the same
    agent, given the server's namespace in the scope, sees it. A namespace that is not there is refused."""
    with FleetLab(hosts=("client", "server"), agents=False) as lab2, DirectController(lab2) as direct:
        lab2.start_agent("client")
        lab2.start_agent("server", scoped=False)
        server_netns = lab2.hosts["server"].netns
        server = lab2.hosts["server"].address
        for session, scope in (("own1", Scope()), ("named1", Scope(netns=(server_netns,)))):
            # Only this flow's address: the root namespace of a shared machine has drops of its own.
            config = {"proto": "tcp", "host": [server]}
            direct.run_session(session, ("server",), config=config, deadline_s=1.5, scope=scope)
            direct.wait_states(session, {"server": ("running",)})
            assert connect(lab2, "client", server, 8080, timeout=0.5) == "TimeoutError"
            direct.wait_states(session, {"server": ("ended",)})
        own = direct.states("own1")["server"]
        named = direct.states("named1")["server"]
        # The drop happened in another namespace: filtered out in the kernel, not even counted.
        assert own.totals["total"] == 0, (own, direct.records("own1", "server"))
        assert named.totals["total"] >= 1, named
        drops = [r for r in direct.records("named1", "server") if r["type"] == "drop"]
        assert drops and all(r["netns_name"] == server_netns for r in drops), drops
        assert direct.records("own1", "server")[-1]["type"] == "summary"
        missing = lab2.task("server", "missing1", scope=Scope(netns=("no-such-netns",)))
        reply = direct.send("server", lab2.sign(missing).encode())
        assert not reply.accepted and "does not exist on this host" in reply.reason
