"""DNS query storm: answered queries/s untraced vs `netsleuth dns --summary` / `--json`, exact counts, and the
kernel cost per packet (bpf_stats), with bpftrace counting the same packets as a reference.

A batched C responder (bench/dns_responder.c) answers in one namespace, a batched C client
(bench/dns_storm_client.c) keeps a window of queries in flight from another. Each configuration runs the same
storm; they take turns (round-robin) so whatever else the machine does spreads over all alike.

    sudo .venv/bin/python bench/dns_storm.py [--count 300000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.netlab import Host, Lab, wait_for  # noqa: E402

from bench.harness import (  # noqa: E402
    Tracer,
    bpftrace_tracer,
    mount_tracefs_for_bpftrace,
    netsleuth_tracer,
    program_stats,
)
from netsleuth.bpf.stats import RunTimeStats  # noqa: E402

SERVER_CPU, CLIENT_CPU, TRACER_CPU = "1", "0", "1"
WINDOW = 256
# The bpftrace reference: the same packets counted per process at a tracepoint every DNS packet passes
# (bpftrace cannot attach cgroup socket programs, and kprobes are unavailable here); no join, no parsing.
BPFTRACE_COUNT = (
    'BEGIN { printf("ready\\n"); } tracepoint:net:net_dev_queue /args->len < 200/ { @[comm] = count(); }'
)


@dataclass
class Samples:
    rates: list[float] = field(default_factory=list)
    ns_per_run: list[float] = field(default_factory=list)
    runs_per_query: list[float] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)


def build(work: Path) -> tuple[str, str]:
    binaries = []
    for name in ("dns_responder", "dns_storm_client"):
        binary = work / name
        subprocess.run(["gcc", "-O2", "-o", str(binary), str(REPO / "bench" / f"{name}.c")], check=True)
        binaries.append(str(binary))
    return binaries[0], binaries[1]


def storm(client: Host, binary: str, count: int) -> dict[str, float]:
    argv = client.argv("taskset", "-c", CLIENT_CPU, binary, "198.18.0.2", "www.bench.test", str(count))
    result: dict[str, float] = json.loads(
        subprocess.run([*argv, str(WINDOW)], capture_output=True, text=True, check=True).stdout
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=300_000, help="queries per storm")
    parser.add_argument("--repeat", type=int, default=3, help="storms per configuration (median is kept)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark loads BPF programs and builds network namespaces")
    mount_tracefs_for_bpftrace()
    netsleuth = [sys.executable, "-m", "netsleuth"]
    lab = Lab()
    work = Path(tempfile.mkdtemp(prefix="netsleuth-dns-bench-"))
    responder_process: subprocess.Popen[bytes] | None = None
    samples: dict[str, Samples] = {}
    try:
        client, server = lab.host("c"), lab.host("s")
        lab.link(client, server, ["198.18.0.1/24"], ["198.18.0.2/24"])
        responder, client_binary = build(work)
        ready_out = work / "responder.out"
        with ready_out.open("w") as out:
            responder_process = server.popen(
                ["taskset", "-c", SERVER_CPU, responder, "198.18.0.2", "53"], stdout=out
            )
        wait_for(lambda: "ready" in ready_out.read_text(), 10, "the responder")

        def dns(*extra: str, stdout: str) -> Callable[[], Tracer]:
            return netsleuth_tracer(
                [*netsleuth, "dns", "--netns", client.name, *extra], work, stdout, TRACER_CPU
            )

        configurations: list[tuple[str, Callable[[], Tracer | None], str]] = [
            ("untraced", lambda: None, ""),
            (
                "netsleuth dns --summary",
                dns("--summary", "--json", stdout="summary.jsonl"),
                "dns_",
            ),
            ("netsleuth dns --json", dns("--json", stdout="stream.jsonl"), "dns_"),
        ]
        if shutil.which("bpftrace"):
            bpftrace = bpftrace_tracer(BPFTRACE_COUNT, work, "bpftrace.out", TRACER_CPU)
            configurations.append(("bpftrace count (reference)", bpftrace, "net_dev_queue"))
        samples = {name: Samples() for name, _, _ in configurations}
        for _ in range(args.repeat):
            for name, start, prefix in configurations:
                taken = samples[name]
                tracer = start()
                result = storm(client, client_binary, args.count)
                taken.rates.append(result["answered"] / result["seconds"])
                if tracer is None:
                    continue
                # A shorter storm with bpf_stats on: run-time accounting must not count in the rate.
                with RunTimeStats():
                    before = program_stats((prefix,))
                    short = storm(client, client_binary, max(args.count // 10, 1000))
                    after = program_stats((prefix,))
                runs = sum(r for r, _ in after.values()) - sum(r for r, _ in before.values())
                spent = sum(s for _, s in after.values()) - sum(s for _, s in before.values())
                if runs:
                    taken.ns_per_run.append(spent / runs)
                    taken.runs_per_query.append(runs / short["sent"])
                tracer.stop()
                if name.startswith("netsleuth"):
                    output = work / ("summary.jsonl" if "summary" in name else "stream.jsonl")
                    taken.checks.append(check(output, result, short))
    finally:
        if responder_process is not None:
            responder_process.kill()
            responder_process.wait()
        lab.close()

    base = statistics.median(samples["untraced"].rates)
    print(
        f"DNS query storm: {args.count:,} queries per run, window {WINDOW}, median of {args.repeat}, "
        f"{os.cpu_count()} CPUs, kernel {os.uname().release}, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'configuration':30} {'answered q/s':>13} {'vs untraced':>12} {'ns/run':>8} {'runs/query':>11}")
    for name, taken in samples.items():
        rate = statistics.median(taken.rates)
        cost = f"{statistics.median(taken.ns_per_run):.0f}" if taken.ns_per_run else "-"
        per_query = f"{statistics.median(taken.runs_per_query):.2f}" if taken.runs_per_query else "-"
        print(f"{name:30} {rate:13,.0f} {rate / base:12.3f} {cost:>8} {per_query:>11}")
    print()
    for name, taken in samples.items():
        for line in taken.checks[-1:]:
            print(f"{name}: {line}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def check(output: Path, storm_result: dict[str, float], short: dict[str, float]) -> str:
    """The kernel's exact counts against what the client sent and got back (both storms of the run). An
    answer the kernel dropped at the client's socket (receive buffer full) reached the host but not the
    client: counted by netsleuth as an answer and as a DNS drop."""
    summary = [json.loads(line) for line in output.read_text().splitlines() if line.strip()][-1]
    sent = int(storm_result["sent"] + short["sent"])
    answered = int(storm_result["answered"] + short["answered"])
    exact = summary["queries"] == sent and summary["answers"] - summary["dns_drops"] == answered
    # Streaming: every answer is emitted, sampled or lost; --summary emits only drops and counts the rest.
    streamed = summary["total"] == summary["emitted"] + summary["sampled"] + summary["lost"]
    accounted = summary["lost"] == 0 and (streamed or summary["emitted"] == summary["dns_drops"])
    return (
        f"client sent {sent:,}, got {answered:,} answers; netsleuth counted {summary['queries']:,} queries, "
        f"{summary['answers']:,} answers ({summary['dns_drops']} dropped at the socket), "
        f"{summary['timeouts']} timeouts ({'exact' if exact else 'MISMATCH'}); events emitted "
        f"{summary['emitted']:,}, sampled {summary['sampled']:,}, lost {summary['lost']:,}"
        f" ({'all accounted for' if accounted else 'UNACCOUNTED'})"
    )


if __name__ == "__main__":
    sys.exit(main())
