"""Fleet scale benchmark: 10,000 simulated agents (bench/fleet_sim.py: asyncio tasks in one process speaking
the real protocol, statuses and batches acknowledged by JetStream as the real agent's) on a three-server
NATS cluster (JetStream R3: `--servers 1` for one server, R1), driven by the real controller (`netsleuth
controller`, HTTP API).

1. Small sessions: `--repeat` sessions of `--small` hosts each (drops, 1 s), named host by host: the time
   from the API call (POST /api/v1/sessions) to the moment the last of its hosts said "ready": p50 / p95 /
   max (goal: p95 < 1 s).
2. One session over every host (`--agents`), asked for by selector (`{"labels": {"sim": "yes"}}`: a list of
   10,000 host ids is over the request limit): API call -> all ready -> T0 -> every agent ended -> the
   controller's session ended with every record merged (goal: < 10 s for a 1 s window), and the CPU (% of
   one core) and RSS of the controller, each nats-server and the simulator during it.
3. The real agent's added idle cost of the fleet link: two real `netsleuth agent` processes idle side by
   side for `--idle` s, one with a [fleet] section (heartbeat every 5 s, as shipped) and one without:
   the difference in CPU time, as % of one core (goal: < 0.2 %).

The machine's load average is printed with the figures: on a shared machine they are what was left.

    sudo python bench/fleet_scale.py [--agents 10000] [--servers 3] [--small 10] [--repeat 20] [--idle 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
from tests.controller_lab import ControllerProcess  # noqa: E402
from tests.fleet_lab import PYTHON, FleetLab  # noqa: E402
from tests.netlab import wait_for  # noqa: E402

from bench.fleet_sim import SimulatedFleet  # noqa: E402
from netsleuth.fleet.protocol import public_key_from_text  # noqa: E402

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def sched_seconds(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of every thread of a process (schedstat):
    a process whose two add up to the wall time wanted a CPU all along - saturated, or starved by the
    machine's other work - and one far below it was waiting for someone else."""
    running = waiting = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError):
            fields = stat.read_text().split()
            running, waiting = running + int(fields[0]), waiting + int(fields[1])
    return running / 1e9, waiting / 1e9


class Sampler:
    """CPU and RSS of one process every 100 ms while a block runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss: list[float] = []
        self.cpu_at: list[tuple[float, float]] = []  # (monotonic, CPU seconds used so far)
        self.sched_at: list[tuple[float, float, float]] = []  # (monotonic, running s, waiting for a CPU s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.rss.append(rss_mib(self.pid)[0])
            self.cpu_at.append((time.monotonic(), cpu_seconds(self.pid)))
            self.sched_at.append((time.monotonic(), *sched_seconds(self.pid)))

    def cpu_between(self, since: float, until: float) -> float:
        """% of one core used between two monotonic times (to the nearest 100 ms sample): a phase's."""
        inside = [(at, cpu) for at, cpu in self.cpu_at if since <= at <= until]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return 0.0
        return round((inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) * 100, 1)

    def waiting_between(self, since: float, until: float) -> float:
        """% of the phase its threads spent runnable but waiting for a CPU (summed over threads)."""
        inside = [sample for sample in self.sched_at if since <= sample[0] <= until]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return 0.0
        return round((inside[-1][2] - inside[0][2]) / (inside[-1][0] - inside[0][0]) * 100, 1)

    def __enter__(self) -> Sampler:
        self.cpu0, self.t0 = cpu_seconds(self.pid), time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu = cpu_seconds(self.pid) - self.cpu0
        self.wall = time.monotonic() - self.t0

    def report(self) -> dict[str, float]:
        return {
            "cpu_percent_of_one_core": round(self.cpu / self.wall * 100, 1),
            "rss_mib_max": round(max(self.rss, default=rss_mib(self.pid)[0]), 1),
            "rss_mib_start": round(self.rss[0] if self.rss else 0.0, 1),
        }


async def _wait_session_end(client: httpx.AsyncClient, session_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Its summary (what a listing shows): the whole body of a 10,000-host session is megabytes of host
        # views, too dear to poll.
        response = await client.get(f"/api/v1/sessions/{session_id}", params={"summary": "true"})
        body: dict[str, Any] = response.json()
        if body.get("ended"):
            return body
        await asyncio.sleep(0.2)  # as a client would poll, not 20 times a second: the figure is +-0.2 s
    raise TimeoutError(f"session {session_id} did not end within {timeout:g} s")


@contextlib.contextmanager
def _profiled(py_spy: str, pid: int, out: str) -> Iterator[None]:
    """py-spy sampling the controller (`--py-spy`) while the block runs: its collapsed stacks in `out`
    (`--profile-out`), the first column of each line a stack, the last its samples."""
    command = [py_spy, "record", "-p", str(pid), "-o", out, "-f", "raw", "-r", "100", "--nonblocking"]
    recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)  # attached before the API call
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            recorder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            recorder.kill()
            recorder.wait()


async def _controller_gc(client: httpx.AsyncClient) -> dict[str, float]:
    """The controller's garbage-collection pauses so far (its /metrics): their total and the longest."""
    found = {"total": 0.0, "longest": 0.0}
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("netsleuth_controller_gc_pause_seconds_total{"):
            found["total"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("netsleuth_controller_gc_pause_longest_seconds{"):
            found["longest"] = max(found["longest"], float(line.rsplit(" ", 1)[1]))
    return found


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def _wait_all(marks: dict[str, float], hosts: list[str], timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    # The count first: this runs every 2 ms in the simulator's own event loop, and scanning 10,000 hosts
    # each time would load the simulator with the bench's waiting.
    while len(marks) < len(hosts) or not all(host in marks for host in hosts):
        if time.monotonic() > deadline:
            missing = [host for host in hosts if host not in marks]
            raise TimeoutError(f"{len(missing)} hosts never reached {what} (e.g. {missing[:3]})")
        await asyncio.sleep(0.002)
    return max(marks[host] for host in hosts)


async def _fleet_run(
    args: argparse.Namespace, lab: FleetLab, controller: ControllerProcess
) -> dict[str, Any]:
    hosts = [f"sim-{index:05d}" for index in range(args.agents)]
    fleet = SimulatedFleet(
        lab.nats_urls, lab.admin_credentials, hosts, public_key_from_text(lab.controller_public_key_text),
        agents_per_connection=args.per_connection, records=args.records, heartbeat_s=args.heartbeat,
        labels=lambda host: {"sim": "yes", "zone": f"zone-{int(host[4:]) % 10}"},
    )  # fmt: skip
    started = time.monotonic()
    await fleet.start()
    results: dict[str, Any] = {
        "agents": args.agents,
        "nats_servers": args.servers,
        "replicas": lab.replicas,
        "registered_in_s": round(time.monotonic() - started, 2),
        "heartbeat_s": args.heartbeat,
    }
    headers = {"Authorization": f"Bearer {controller.tokens['fleet']}"}
    async with httpx.AsyncClient(base_url=controller.url, headers=headers, timeout=60) as client:

        async def hosts_up() -> int:
            listed = (await client.get("/api/v1/hosts")).json()
            return sum(1 for host in listed if host.get("state") == "up" and host["host"].startswith("sim-"))

        deadline = time.monotonic() + 120
        while await hosts_up() < args.agents:
            if time.monotonic() > deadline:
                up = await hosts_up()
                raise TimeoutError(f"the controller lists {up} of {args.agents} simulated hosts as up")
            await asyncio.sleep(1)
        results["load_average_before"] = load_average()

        # 1. small sessions, one after the other
        latencies = []
        refused: list[str] = []  # 503s ("NATS did not answer; try again shortly"): retried, as a client would
        for round_index in range(args.repeat):
            chosen = [hosts[(round_index * args.small + i) % len(hosts)] for i in range(args.small)]
            body = {"hosts": chosen, "diagnostic": "drops", "config": {"proto": "tcp"}, "duration": 1}
            called = time.monotonic()
            response = await client.post("/api/v1/sessions", json=body)
            while response.status_code == 503 and len(refused) < 10:
                refused.append(response.json().get("error", ""))
                await asyncio.sleep(1)
                called = time.monotonic()
                response = await client.post("/api/v1/sessions", json=body)
            if response.status_code != 201:
                raise RuntimeError(f"POST /api/v1/sessions: {response.status_code} {response.text}")
            session_id = response.json()["id"]
            last_ready = await _wait_all(fleet.ready_at[session_id], chosen, 30, "ready")
            latencies.append(last_ready - called)
            await _wait_session_end(client, session_id, 30)
        latencies.sort()
        results["small_session"] = {
            "hosts": args.small,
            "sessions": args.repeat,
            "api_to_all_ready_ms_p50": round(statistics.median(latencies) * 1000, 1),
            "api_to_all_ready_ms_p95": round(latencies[max(0, int(len(latencies) * 0.95) - 1)] * 1000, 1),
            "api_to_all_ready_ms_max": round(latencies[-1] * 1000, 1),
            "answered_503_then_retried": len(refused),
            **({"first_503": refused[0]} if refused else {}),
        }

        # 2. every host at once, by selector
        gc_before = await _controller_gc(client)
        assert controller.process is not None
        servers = [pid for pid in lab.nats_pids if pid is not None]
        with contextlib.ExitStack() as samplers:
            sampler = samplers.enter_context(Sampler(controller.process.pid))
            simulator = samplers.enter_context(Sampler(os.getpid()))
            nats_servers = [samplers.enter_context(Sampler(pid)) for pid in servers]
            if args.py_spy:
                samplers.enter_context(_profiled(args.py_spy, controller.process.pid, args.profile_out))
                # ... and this process, the simulator: whether its own work is what the agents' times show
                samplers.enter_context(_profiled(args.py_spy, os.getpid(), args.profile_out + ".simulator"))
            selector = {"labels": {"sim": "yes"}}
            body = {"selector": selector, "diagnostic": "drops", "config": {"proto": "tcp"}, "duration": 1}
            called, called_wall = time.monotonic(), time.time()
            response = await client.post("/api/v1/sessions", json=body)
            if response.status_code != 201:
                raise RuntimeError(f"POST /api/v1/sessions: {response.status_code} {response.text}")
            session_id = response.json()["id"]
            accepted = time.monotonic()
            try:
                all_ready = await _wait_all(fleet.ready_at[session_id], hosts, args.wait, "ready")
                all_ended = await _wait_all(fleet.ended_at[session_id], hosts, args.wait, "ended")
                final = await _wait_session_end(client, session_id, args.wait)
            except TimeoutError:
                tasks, ready = len(fleet.task_at[session_id]), len(fleet.ready_at[session_id])
                ended = len(fleet.ended_at[session_id])
                stored = (
                    f"stored messages sent {fleet.sent}, acknowledged {fleet.acked}, {fleet.ack_errors[:3]}"
                )
                print(f"tasks {tasks}, ready {ready}, ended {ended}, refused {fleet.refused[:3]}; {stored}",
                      file=sys.stderr)  # fmt: skip
                print(controller.log_text()[-5000:], file=sys.stderr)
                raise
            controller_ended = time.monotonic()
        by_state = final.get("hosts_by_state") or {
            state: sum(1 for view in final.get("hosts", {}).values() if view.get("state") == state)
            for state in {view.get("state") for view in final.get("hosts", {}).values()}
        }
        timeline = (await client.get(f"/api/v1/sessions/{session_id}/records")).text.splitlines()
        gc_after = await _controller_gc(client)
        last_task = max(fleet.task_at[session_id].values())
        # Which process was busy when: % of one core in each phase (the whole session's is below). A
        # process near 100 % in a phase is what that phase waited for; on a shared machine, the load is
        # the rest of the answer.
        phases = {
            "call_to_last_task": (called, last_task),
            "last_task_to_all_ended": (last_task, all_ended),
            "all_ended_to_controller_ended": (all_ended, controller_ended),
        }
        by_phase = {
            name: {
                "controller": sampler.cpu_between(*span),
                "simulator": simulator.cpu_between(*span),
                "nats_servers": [server.cpu_between(*span) for server in nats_servers],
                "waiting_for_a_cpu": {
                    "controller": sampler.waiting_between(*span),
                    "simulator": simulator.waiting_between(*span),
                    "nats_servers": [server.waiting_between(*span) for server in nats_servers],
                },
                "simulator_loop_lag_ms_max": fleet.lag_between(*span).get("loop_lag_ms_max"),
                "seconds": round(span[1] - span[0], 3),
            }
            for name, span in phases.items()
        }
        slow_consumers = []
        for index in range(len(servers)):
            with contextlib.suppress(Exception):
                slow_consumers.append(lab.monitor_json(index, "/varz").get("slow_consumers"))
        results["fleet_session"] = {
            "asked_by": {"selector": selector},
            "hosts": args.agents,
            "window_s": 1,
            "records_per_host": args.records,
            "api_call_ms": round((accepted - called) * 1000, 1),
            "api_to_first_task_s": round(min(fleet.task_at[session_id].values()) - called, 3),
            "api_to_last_task_s": round(last_task - called, 3),
            "api_to_all_ready_s": round(all_ready - called, 3),
            "api_to_last_start_s": round(max(fleet.start_at[session_id].values()) - called, 3),
            "api_to_t0_s": round(fleet.t0_ns[session_id] / 1e9 - called_wall, 3),
            "api_to_all_agents_ended_s": round(all_ended - called, 3),
            "api_to_controller_ended_s": round(controller_ended - called, 3),
            "hosts_ended": by_state.get("ended", 0),
            "hosts_not_ended": sum(count for state, count in by_state.items() if state != "ended"),
            "partial": final.get("partial"),
            "merged_timeline_lines": len(timeline),
            "controller": sampler.report(),
            "simulator_process": {**simulator.report(), **fleet.lag_between(called, controller_ended)},
            "nats_servers": [server.report() for server in nats_servers],
            "cpu_percent_by_phase": by_phase,
            "controller_gc": {
                "pause_s_total": round(gc_after["total"] - gc_before["total"], 3),
                "pause_ms_longest_since_start": round(gc_after["longest"] * 1000, 1),
            },
            "nats_slow_consumers": slow_consumers,
            "simulator_stored_messages": {
                "sent": fleet.sent,
                "acknowledged": fleet.acked,
                "refused": fleet.ack_errors[:3],
            },
            "load_average_after": load_average(),
        }
        # The controller's own phase timings for that session (its log), next to what the agents saw.
        session_lines = [line for line in controller.log_text().splitlines() if session_id in line]
        results["fleet_session"]["controller_log"] = [line.split("INFO ", 1)[-1] for line in session_lines][
            -6:
        ]
        results["fleet_session"]["controller_warnings"] = sum("WARNING" in line for line in session_lines)
        results["simulated_tasks_refused"] = len(fleet.refused)
    await fleet.stop()
    return results


def agent_link_idle_cost(seconds: float) -> dict[str, float]:
    """Two real agents idle side by side, with and without [fleet]: the fleet link's CPU, % of one core."""
    with FleetLab(hosts=("idle",), heartbeat_seconds=5.0) as lab, tempfile.TemporaryDirectory() as work:
        plain_config = Path(work) / "plain.toml"
        plain_config.write_text(
            '[agent]\nlisten = "127.0.0.1:0"\nsocket = ""\n[exporter.drops]\nenabled = false\n'
        )
        ready = Path(work) / "plain.ready"
        log = (Path(work) / "plain.log").open("wb")
        plain = subprocess.Popen(
            [PYTHON, "-m", "netsleuth", "agent", "--config", str(plain_config), "--ready-file", str(ready)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
        try:
            wait_for(ready.exists, 60, "the plain agent to be ready")
            fleet_pid = lab.agent("idle").pid
            time.sleep(2)  # past start-up work (probes, first registration) in both
            before = {"fleet": cpu_seconds(fleet_pid), "plain": cpu_seconds(plain.pid)}
            started = time.monotonic()
            time.sleep(seconds)
            wall = time.monotonic() - started
            used = {
                "fleet": cpu_seconds(fleet_pid) - before["fleet"],
                "plain": cpu_seconds(plain.pid) - before["plain"],
            }
            entry = lab.registry()["idle"]
        finally:
            plain.terminate()
            plain.wait(20)
            log.close()
    return {
        "idle_seconds": round(wall, 1),
        "agent_with_fleet_cpu_percent": round(used["fleet"] / wall * 100, 3),
        "agent_without_fleet_cpu_percent": round(used["plain"] / wall * 100, 3),
        "fleet_link_added_cpu_percent": round((used["fleet"] - used["plain"]) / wall * 100, 3),
        "heartbeat_seconds": 5.0,
        "agent_clock_offset_us": round(entry.offset_ns / 1000, 1),
    }


BIG_ROLE = """
[roles.fleet-wide]
diagnostics = ["*"]
hosts = ["*"]
netns = ["*"]
max_concurrent = 4
max_duration = 300
max_hosts = 100000
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--servers", type=int, default=3, choices=(1, 3), help="nats-servers (3: R3)")
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--records", type=int, default=10, help="drop records per host in the big session")
    parser.add_argument(
        "--per-connection", type=int, default=100, help="simulated agents per NATS connection"
    )
    parser.add_argument("--heartbeat", type=float, default=15.0, help="simulated agents' heartbeat (s)")
    parser.add_argument("--idle", type=float, default=0.0, help="seconds of idle measurement (0: skip)")
    parser.add_argument(
        "--wait", type=float, default=300.0, metavar="S",
        help="seconds each phase of the big session may take (slower than the goal is still reported)",
    )  # fmt: skip
    parser.add_argument(
        "--py-spy", metavar="PATH",
        help="py-spy: sample the controller (and the simulator, FILE.simulator) in the big session",
    )  # fmt: skip
    parser.add_argument("--profile-out", default="/tmp/fleet_scale_controller.txt", metavar="FILE")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (the lab's namespaces and the real agents' BPF)", file=sys.stderr)
        return 1
    results: dict[str, Any] = {}
    with (
        FleetLab(hosts=(), agents=False, nats_servers=args.servers, max_file_store="2G") as lab,
        ControllerProcess(
            lab,
            extra_config=BIG_ROLE,
            extra_users={"fleet": ["fleet-wide"]},
            records_max_bytes=512 << 20,
            stale_after=3 * args.heartbeat,  # as shipped: stale after three missed heartbeats (5 s, 15 s)
        ) as controller,
    ):
        results.update(asyncio.run(_fleet_run(args, lab, controller)))
    if args.idle > 0:
        results["agent_idle"] = agent_link_idle_cost(args.idle)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
