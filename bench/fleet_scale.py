"""Fleet scale benchmark: 1,000 simulated agents (bench/fleet_sim.py: asyncio tasks in one process speaking
the real protocol) on a real nats-server, driven by the real controller (`netsleuth controller`, HTTP API).

1. Small sessions: `--repeat` sessions of `--small` hosts each (drops, 1 s): the time from the API call
   (POST /api/v1/sessions) to the moment the last of its hosts said "ready": p50 / p95 / max
   (goal: p95 < 1 s).
2. One session over every host (`--agents`): API call -> all ready -> all records in -> the controller's
   session ended (goal: < 5 s for a 1 s window), the records the controller merged, and the controller's
   CPU (% of one core) and RSS during it.
3. The real agent's added idle cost of the fleet link: two real `netsleuth agent` processes idle side by
   side for `--idle` s, one with a [fleet] section (heartbeat every 5 s, as shipped) and one without:
   the difference in CPU time, as % of one core (goal: < 0.2 %).

    sudo python bench/fleet_scale.py [--agents 1000] [--small 10] [--repeat 20] [--idle 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
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


class Sampler:
    """CPU and RSS of one process every 100 ms while a block runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.rss.append(rss_mib(self.pid)[0])

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
        # Without the timeline: the full body of a 1,000-host session is megabytes, too dear to poll.
        response = await client.get(f"/api/v1/sessions/{session_id}", params={"timeline": "false"})
        body: dict[str, Any] = response.json()
        if body.get("ended"):
            return body
        await asyncio.sleep(0.05)
    raise TimeoutError(f"session {session_id} did not end within {timeout:g} s")


async def _wait_all(marks: dict[str, float], hosts: list[str], timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while not all(host in marks for host in hosts):
        if time.monotonic() > deadline:
            missing = [host for host in hosts if host not in marks]
            raise TimeoutError(f"{len(missing)} hosts never reached {what} (e.g. {missing[:3]})")
        await asyncio.sleep(0.002)
    return max(marks[host] for host in hosts)


async def _fleet_run(
    args: argparse.Namespace, lab: FleetLab, controller: ControllerProcess
) -> dict[str, Any]:
    hosts = [f"sim-{index:04d}" for index in range(args.agents)]
    fleet = SimulatedFleet(
        lab.nats_url, lab.admin_credentials, hosts, public_key_from_text(lab.controller_public_key_text),
        agents_per_connection=args.per_connection, records=args.records,
    )  # fmt: skip
    started = time.monotonic()
    await fleet.start()
    results: dict[str, Any] = {"agents": args.agents, "registered_in_s": round(time.monotonic() - started, 2)}
    headers = {"Authorization": f"Bearer {controller.tokens['root']}"}
    async with httpx.AsyncClient(base_url=controller.url, headers=headers, timeout=30) as client:

        async def hosts_up() -> int:
            listed = (await client.get("/api/v1/hosts")).json()
            return sum(1 for host in listed if host.get("state") == "up" and host["host"].startswith("sim-"))

        deadline = time.monotonic() + 60
        while await hosts_up() < args.agents:
            if time.monotonic() > deadline:
                raise TimeoutError("the controller does not list every simulated host as up")
            await asyncio.sleep(0.2)

        # 1. small sessions, one after the other
        latencies = []
        for round_index in range(args.repeat):
            chosen = [hosts[(round_index * args.small + i) % len(hosts)] for i in range(args.small)]
            body = {"hosts": chosen, "diagnostic": "drops", "config": {"proto": "tcp"}, "duration": 1}
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
        }

        # 2. every host at once
        assert controller.process is not None
        assert lab.nats_pid is not None
        with (
            Sampler(controller.process.pid) as sampler,
            Sampler(os.getpid()) as simulator,
            Sampler(lab.nats_pid) as nats_server,
        ):
            body = {"hosts": hosts, "diagnostic": "drops", "config": {"proto": "tcp"}, "duration": 1}
            called, called_wall = time.monotonic(), time.time()
            response = await client.post("/api/v1/sessions", json=body)
            if response.status_code != 201:
                raise RuntimeError(f"POST /api/v1/sessions: {response.status_code} {response.text}")
            session_id = response.json()["id"]
            accepted = time.monotonic()
            all_ready = await _wait_all(fleet.ready_at[session_id], hosts, 60, "ready")
            all_ended = await _wait_all(fleet.ended_at[session_id], hosts, 60, "ended")
            final = await _wait_session_end(client, session_id, 60)
            controller_ended = time.monotonic()
        states = [view.get("state") for view in final.get("hosts", {}).values()]
        timeline = (await client.get(f"/api/v1/sessions/{session_id}/records")).text.splitlines()
        results["fleet_session"] = {
            "hosts": args.agents,
            "window_s": 1,
            "records_per_host": args.records,
            "api_call_ms": round((accepted - called) * 1000, 1),
            "api_to_first_task_s": round(min(fleet.task_at[session_id].values()) - called, 3),
            "api_to_last_task_s": round(max(fleet.task_at[session_id].values()) - called, 3),
            "api_to_all_ready_s": round(all_ready - called, 3),
            "api_to_last_start_s": round(max(fleet.start_at[session_id].values()) - called, 3),
            "api_to_t0_s": round(fleet.t0_ns[session_id] / 1e9 - called_wall, 3),
            "api_to_all_agents_ended_s": round(all_ended - called, 3),
            "api_to_controller_ended_s": round(controller_ended - called, 3),
            "hosts_ended": states.count("ended"),
            "hosts_not_ended": len(states) - states.count("ended"),
            "partial": final.get("partial"),
            "merged_timeline_lines": len(timeline),
            "controller": sampler.report(),
            "simulator_process": simulator.report(),
            "nats_server": nats_server.report(),
        }
        # The controller's own phase timings for that session (its log), next to what the agents saw.
        results["fleet_session"]["controller_log"] = [
            line.split("INFO ", 1)[-1] for line in controller.log_text().splitlines() if session_id in line
        ][-6:]
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--records", type=int, default=10, help="drop records per host in the big session")
    parser.add_argument("--per-connection", type=int, default=25, help="simulated agents per NATS connection")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measurement (0: skip)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (the lab's namespaces and the real agents' BPF)", file=sys.stderr)
        return 1
    results: dict[str, Any] = {}
    with FleetLab(hosts=(), agents=False) as lab, ControllerProcess(lab) as controller:
        results.update(asyncio.run(_fleet_run(args, lab, controller)))
    if args.idle > 0:
        results["agent_idle"] = agent_link_idle_cost(args.idle)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
