"""Agent benchmark: what `netsleuth agent` costs idle, during a drop storm, and while streaming a session.

1. Storm: a C sender (bench/udpflood.c) drops `--count` datagrams into an iptables OUTPUT DROP in a private
   namespace, round-robin: no agent, the agent with `bpf_stats = false`, the agent as shipped (bpf_stats
   on, for run-time metrics and session budgets). Drop rate against the untraced one, the agent's CPU
   with a scrape every second, and the exporter program's kernel cost per run (its own bpf_stats metric).
2. Idle: the shipped agent scraped every `--scrape-interval` s (as Prometheus would) for `--idle` s, after
   a first scrape (which names the drop locations already counted): CPU % of one core from
   /proc/PID/stat, RSS and its peak (VmRSS, VmHWM).
3. Sessions streaming a storm (capped at `--events`): NETFILTER_DROP records (with the firewall rule
   named) and NO_SOCKET records (a closed port in the other namespace): events/s and the agent's CPU.

    python bench/agent_idle.py [--idle 30] [--count 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.netlab import Host, Lab, wait_for  # noqa: E402

from netsleuth.agent.client import AgentClient  # noqa: E402

# The storm's sender (and so the traced kernel path) on one CPU, the agent on the other.
SENDER_CPU, AGENT_CPU = "1", "0"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (proc(5) fields 14, 15)


def memory_mib(pid: int) -> dict[str, float]:
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values


class Agent:
    def __init__(self, work: Path, bpf_stats: bool) -> None:
        self.socket = work / "agent.sock"
        config = work / "agent.toml"
        # Sessions here measure streaming throughput, not the budget: allow them a whole CPU.
        config.write_text(
            f'[agent]\nlisten = "127.0.0.1:0"\nsocket = "{self.socket}"\n'
            f"bpf_stats = {'true' if bpf_stats else 'false'}\n[sessions]\ncpu_budget_percent = 100\n"
        )
        ready = work / "ready.json"
        ready.unlink(missing_ok=True)
        self._stderr = (work / "agent.stderr").open("w")
        argv = ["taskset", "-c", AGENT_CPU, sys.executable, "-m", "netsleuth", "agent"]
        argv += ["--config", str(config), "--ready-file", str(ready)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self._stderr)
        wait_for(lambda: ready.exists() or self.process.poll() is not None, 60, "the agent")
        if self.process.poll() is not None:
            raise RuntimeError(f"the agent exited: {(work / 'agent.stderr').read_text()}")
        self.pid = self.process.pid
        port = int(json.loads(ready.read_text())["listen"].rsplit(":", 1)[1])
        self.http = AgentClient.tcp("127.0.0.1", port, timeout=60)
        self.client = AgentClient.unix(str(self.socket), timeout=120)

    def scrape(self) -> tuple[float, dict[str, float]]:
        """(seconds the scrape took, the exporter program's bpf_stats counters)."""
        started = time.monotonic()
        status, body = self.http.get("/metrics")
        elapsed = time.monotonic() - started
        assert status == 200
        values: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line.startswith("netsleuth_bpf_program_run") and 'owner="exporter"' in line:
                name, _, value = line.rpartition(" ")
                values[name.split("{")[0]] = float(value)
        return elapsed, values

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)
        self._stderr.close()


@contextmanager
def running_agent(work: Path, bpf_stats: bool = True) -> Iterator[Agent]:
    agent = Agent(work, bpf_stats)
    try:
        yield agent
    finally:
        agent.stop()


def storm(sender: Host, udpflood: str, count: int, port: int = 9) -> float:
    output = sender.run("taskset", "-c", SENDER_CPU, udpflood, "198.18.0.2", str(port), str(count)).stdout
    result = json.loads(output)
    assert result["refused"] == count, result
    return float(result["refused"] / result["seconds"])


@contextmanager
def scraping(agent: Agent, interval: float) -> Iterator[list[float]]:
    """Scrape every `interval` s in the background; yields the list of scrape durations."""
    durations: list[float] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            durations.append(agent.scrape()[0])

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield durations
    finally:
        stop.set()
        thread.join()


def storms(args: argparse.Namespace, work: Path, sender: Host, udpflood: str) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"untraced": [], "agent, bpf_stats off": [], "agent": []}
    agent_cpu: list[float] = []
    scrapes: list[float] = []
    ns_per_run: list[float] = []
    for _ in range(args.repeat):  # round-robin: the machine's other load spreads over all three alike
        rates["untraced"].append(storm(sender, udpflood, args.count))
        with running_agent(work, bpf_stats=False) as agent:
            rates["agent, bpf_stats off"].append(storm(sender, udpflood, args.count))
        with running_agent(work) as agent:
            agent.scrape()  # the first scrape names locations: not part of the storm's cost
            _, before = agent.scrape()
            cpu0, t0 = cpu_seconds(agent.pid), time.monotonic()
            with scraping(agent, 1.0) as durations:
                rates["agent"].append(storm(sender, udpflood, args.count))
            agent_cpu.append((cpu_seconds(agent.pid) - cpu0) / (time.monotonic() - t0) * 100)
            scrapes.extend(durations)
            _, after = agent.scrape()
            runs = after["netsleuth_bpf_program_runs_total"] - before["netsleuth_bpf_program_runs_total"]
            run_s = (
                after["netsleuth_bpf_program_run_seconds_total"]
                - before["netsleuth_bpf_program_run_seconds_total"]
            )
            ns_per_run.append(run_s * 1e9 / max(runs, 1))
    return {
        "rates": {name: statistics.median(values) for name, values in rates.items()},
        "agent_cpu": statistics.median(agent_cpu),
        "scrape_ms": statistics.median(scrapes) * 1000 if scrapes else float("nan"),
        "ns_per_run": statistics.median(ns_per_run),
    }


def idle(args: argparse.Namespace, work: Path) -> dict[str, float]:
    with running_agent(work) as agent:
        started_mib = memory_mib(agent.pid)["VmRSS"]
        first = agent.scrape()[0]
        cpu0, t0 = cpu_seconds(agent.pid), time.monotonic()
        durations = []
        while time.monotonic() - t0 < args.idle:
            durations.append(agent.scrape()[0])
            time.sleep(min(args.scrape_interval, max(0.0, args.idle - (time.monotonic() - t0))))
        cpu = (cpu_seconds(agent.pid) - cpu0) / (time.monotonic() - t0) * 100
        memory = memory_mib(agent.pid)
    return {
        "started_mib": started_mib,
        "first_scrape_ms": first * 1000,
        "cpu": cpu,
        "rss_mib": memory["VmRSS"],
        "peak_mib": memory["VmHWM"],
        "scrape_ms": statistics.median(durations) * 1000,
    }


def session(args: argparse.Namespace, work: Path, sender: Host, udpflood: str, port: int) -> dict[str, Any]:
    with running_agent(work) as agent:
        request = {
            "diagnostic": "drops",
            "filters": {"dport": port},
            "max_events": args.events,
            "duration": 60,
            "cpu_budget_percent": 100,
        }
        flooder = sender.popen(["taskset", "-c", SENDER_CPU, udpflood, "198.18.0.2", str(port), "100000000"])
        try:
            cpu0, t0 = cpu_seconds(agent.pid), time.monotonic()
            with agent.client.session(request) as stream:
                records = list(stream)
            elapsed = time.monotonic() - t0
            cpu = (cpu_seconds(agent.pid) - cpu0) / elapsed * 100
        finally:
            flooder.kill()
            flooder.wait()
        peak = memory_mib(agent.pid)["VmHWM"]
    end, summary = records[-1], records[-2]
    return {
        "events": end["events"],
        "rate": end["events"] / elapsed,
        "cpu": cpu,
        "reason": end["reason"],
        "seen": summary["total"],
        "sampled": summary["sampled"] + summary["lost"],
        "program_cpu": end["bpf_cpu_percent"],
        "peak_mib": peak,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measurement")
    parser.add_argument("--scrape-interval", type=float, default=15.0, help="idle scrape interval, seconds")
    parser.add_argument("--count", type=int, default=1_000_000, help="drops per storm")
    parser.add_argument("--repeat", type=int, default=3, help="storms per configuration (median is kept)")
    parser.add_argument("--events", type=int, default=20_000, help="events each session streams at most")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark loads BPF programs and builds network namespaces")
    lab = Lab()
    with tempfile.TemporaryDirectory(prefix="netsleuth-agent-bench-") as work_dir:
        work = Path(work_dir)
        udpflood = str(work / "udpflood")
        subprocess.run(["gcc", "-O2", "-o", udpflood, str(REPO / "bench" / "udpflood.c")], check=True)
        try:
            a, b = lab.host("a"), lab.host("b")
            lab.link(a, b, ["198.18.0.1/24"], ["198.18.0.2/24"])
            a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "9", "-j", "DROP")
            storm_figures = storms(args, work, a, udpflood)
            idle_figures = idle(args, work)
            netfilter = session(args, work, a, udpflood, 9)
            no_socket = session(args, work, a, udpflood, 10)  # no rule: delivered to b, dropped there
        finally:
            lab.close()

    print(f"netsleuth agent benchmark: {os.cpu_count()} CPUs, kernel {os.uname().release}")
    print(
        f"idle ({args.idle:.0f} s, a scrape every {args.scrape_interval:.0f} s): "
        f"CPU {idle_figures['cpu']:.2f} % of a core; RSS {idle_figures['rss_mib']:.1f} MiB "
        f"(after start {idle_figures['started_mib']:.1f}, peak {idle_figures['peak_mib']:.1f}); "
        f"scrape {idle_figures['scrape_ms']:.1f} ms (first: {idle_figures['first_scrape_ms']:.0f} ms)"
    )
    base = storm_figures["rates"]["untraced"]
    print(f"drop storm ({args.count:,} drops, median of {args.repeat}):")
    for name, rate in storm_figures["rates"].items():
        print(f"  {name:24} {rate:12,.0f} drops/s  {rate / base:6.3f} of untraced")
    print(
        f"  agent CPU during the storm {storm_figures['agent_cpu']:.2f} % of a core (a scrape every second, "
        f"median {storm_figures['scrape_ms']:.1f} ms); exporter program {storm_figures['ns_per_run']:.0f} ns "
        "per run (bpf_stats)"
    )
    for name, figures in (("NETFILTER_DROP + rule", netfilter), ("NO_SOCKET", no_socket)):
        print(
            f"session streaming {name:22} {figures['events']:,} events at {figures['rate']:,.0f}/s, "
            f"agent CPU {figures['cpu']:.0f} % of a core, "
            f"session program {figures['program_cpu']:.1f} % of a CPU, "
            f"{figures['sampled']:,} of {figures['seen']:,} matched left out (sampled/lost), "
            f"peak RSS {figures['peak_mib']:.0f} MiB; ended by {figures['reason']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
