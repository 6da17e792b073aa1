"""Connect/close storm benchmark: what the tcp-family tracers cost, against untraced and bpftrace, in one run.

A C program (embedded below, built with gcc) opens and gracefully closes N connections over loopback inside
a private namespace, both ends in one process, so connections/s is the kernel's TCP work per connection plus
whatever the tracers add. Each connection makes 10 state changes (client CLOSE -> SYN_SENT -> ESTABLISHED ->
FIN_WAIT1 -> FIN_WAIT2 -> CLOSE, server LISTEN -> SYN_RECV -> ESTABLISHED -> CLOSE_WAIT -> LAST_ACK ->
CLOSE). Configurations run round-robin; kernel-side cost per program run comes from bpf_stats in a separate,
shorter storm (run-time accounting itself costs two clock reads per run).

    python bench/tcp_storm.py [--count N] [--repeat R]
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

from tests.netlab import Lab  # noqa: E402

from bench.harness import (  # noqa: E402
    BPFTRACE_READY,
    Tracer,
    bpftrace_tracer,
    mount_tracefs_for_bpftrace,
    netsleuth_tracer,
    program_stats,
)
from netsleuth.bpf.stats import RunTimeStats  # noqa: E402

STORM_C = r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    long count = atol(argv[2]), done = 0;
    int one = 1, listener = socket(AF_INET, SOCK_STREAM, 0);
    struct timespec start, end;
    char byte;

    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(listener, (struct sockaddr *)&addr, sizeof(addr)) || listen(listener, 128))
        return perror("listen"), 1;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (; done < count; done++) {
        int client = socket(AF_INET, SOCK_STREAM, 0), server;

        if (connect(client, (struct sockaddr *)&addr, sizeof(addr)))
            return perror("connect"), 1;
        server = accept(listener, NULL, NULL);
        close(client);                       /* FIN from the client ... */
        if (read(server, &byte, 1) != 0)     /* ... seen by the server ... */
            return fprintf(stderr, "unexpected data\n"), 1;
        close(server);                       /* ... which closes too: both ends reach CLOSE */
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    printf("{\"connections\": %ld, \"seconds\": %.6f}\n", done,
           (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9);
    return 0;
}
"""
STATE_CHANGES_PER_CONNECTION = 10
BPFTRACE_COUNT = "tracepoint:sock:inet_sock_set_state { @[args->oldstate, args->newstate] = count(); }"
BPFTRACE_PRINTF = (
    "tracepoint:sock:inet_sock_set_state "
    '{ printf("%d %d %d %d %d %d\\n", nsecs, pid, args->sport, args->dport, '
    "args->oldstate, args->newstate); }"
)
# The storm (and so the traced kernel path) on one CPU, every tracer's userspace on the other.
STORM_CPU, TRACER_CPU = "1", "0"
PORT = "7900"


@dataclass
class Samples:
    rates: list[float] = field(default_factory=list)
    attach: list[float] = field(default_factory=list)
    ns_per_run: dict[str, list[float]] = field(default_factory=dict)
    runs_per_connection: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""


def build_storm(directory: Path) -> str:
    source = directory / "tcpstorm.c"
    source.write_text(STORM_C)
    binary = directory / "tcpstorm"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(source)], check=True)
    return str(binary)


def storm(argv: Callable[..., list[str]], binary: str, count: int) -> float:
    result = json.loads(
        subprocess.run(
            argv("taskset", "-c", STORM_CPU, binary, PORT, str(count)),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert result["connections"] == count, result
    return float(result["connections"] / result["seconds"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50_000, help="connections per storm")
    parser.add_argument("--repeat", type=int, default=3, help="storms per configuration (median is kept)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark loads BPF programs and builds network namespaces")
    mount_tracefs_for_bpftrace()
    if not shutil.which("bpftrace"):
        sys.exit("bpftrace is needed for the comparison: apt install bpftrace")
    netsleuth = [sys.executable, "-m", "netsleuth"]
    lab = Lab()
    work = Path(tempfile.mkdtemp(prefix="netsleuth-bench-"))
    try:
        host = lab.host("s")
        binary = build_storm(work)

        def measure_once(
            samples: Samples, start: Callable[[], Tracer | None], prefixes: tuple[str, ...]
        ) -> None:
            tracer = start()
            samples.rates.append(storm(host.argv, binary, args.count))
            if tracer is None:
                return
            cost_count = max(args.count // 5, 1000)
            with RunTimeStats():
                before = program_stats(prefixes)
                storm(host.argv, binary, cost_count)
                after = program_stats(prefixes)
            samples.attach.append(tracer.attach_s)
            samples.note = tracer.stop()[-300:].strip()
            for name, (runs, spent) in after.items():
                ran = runs - before.get(name, (0, 0))[0]
                if ran:
                    took = spent - before.get(name, (0, 0))[1]
                    samples.ns_per_run.setdefault(name, []).append(took / ran)
                    samples.runs_per_connection.setdefault(name, []).append(ran / cost_count)

        def ours(*command: str, stdout: str) -> Callable[[], Tracer]:
            return netsleuth_tracer([*netsleuth, *command, "--netns", host.name], work, stdout, TRACER_CPU)

        def bpftrace(program: str, stdout: str) -> Callable[[], Tracer]:
            return bpftrace_tracer(BPFTRACE_READY + program, work, stdout, TRACER_CPU)

        configurations: list[tuple[str, Callable[[], Tracer | None], tuple[str, ...]]] = [
            ("untraced", lambda: None, ()),
            (
                "netsleuth tcp states --summary",
                ours("tcp", "states", "--summary", stdout="s.out"),
                ("nst_",),
            ),
            (
                "netsleuth tcp states --json",
                ours("tcp", "states", "--json", stdout="states.jsonl"),
                ("nst_",),
            ),
            (
                "netsleuth tcp life --json",
                ours("tcp", "life", "--json", stdout="life.jsonl"),
                ("nst_",),
            ),
            (
                "netsleuth resets --json",
                ours("resets", "--json", stdout="resets.jsonl"),
                ("nst_",),
            ),
            (
                "netsleuth conn --json",
                ours("conn", "--json", stdout="conn.jsonl"),
                ("nst_", "drops_"),
            ),
            ("bpftrace count()", bpftrace(BPFTRACE_COUNT, "bt_count.out"), ("inet_sock_set_s",)),
            ("bpftrace printf", bpftrace(BPFTRACE_PRINTF, "bt_printf.out"), ("inet_sock_set_s",)),
        ]
        samples = {name: Samples() for name, _, _ in configurations}
        for _ in range(args.repeat):
            for name, start, prefixes in configurations:
                measure_once(samples[name], start, prefixes)
        states_summary = json.loads((work / "states.jsonl").read_text().splitlines()[-1])
        conn_summary = json.loads((work / "conn.jsonl").read_text().splitlines()[-1])
        bt_lines = sum(1 for _ in (work / "bt_printf.out").open()) - 1
    finally:
        lab.close()
        shutil.rmtree(work, ignore_errors=True)

    base = statistics.median(samples["untraced"].rates)
    print(
        f"connect/close storm over loopback: {args.count:,} connections per run "
        f"({STATE_CHANGES_PER_CONNECTION} state changes each), median of {args.repeat}, {os.cpu_count()} "
        "CPUs, "
        f"kernel {os.uname().release}"
    )
    print(
        f"{'configuration':34} {'conn/s':>10} {'vs untraced':>12} {'attach s':>9}  kernel ns/run (runs/conn)"
    )
    rates = {}
    for name, taken in samples.items():
        rate = statistics.median(taken.rates)
        rates[name] = rate
        attach = f"{statistics.median(taken.attach):.3f}" if taken.attach else "-"
        costs = ", ".join(
            f"{program} {statistics.median(values):.0f} "
            f"({statistics.median(taken.runs_per_connection[program]):.1f})"
            for program, values in sorted(taken.ns_per_run.items())
        )
        print(f"{name:34} {rate:10,.0f} {rate / base:12.3f} {attach:>9}  {costs or '-'}")
    summary_ratio = rates["netsleuth tcp states --summary"] / rates["bpftrace count()"]
    stream_ratio = rates["netsleuth tcp states --json"] / rates["bpftrace printf"]
    conn_sampled = sum(kind["sampled"] for kind in conn_summary["events"].values())
    expected_lines = args.count * STATE_CHANGES_PER_CONNECTION
    print()
    print(f"states --summary vs bpftrace count(): {summary_ratio:.3f}")
    print(f"states --json vs bpftrace printf:     {stream_ratio:.3f}")
    print(
        f"states --json accounting (last run): total {states_summary['total']:,} = emitted "
        f"{states_summary['emitted']:,} + sampled {states_summary['sampled']:,} + lost "
        f"{states_summary['lost']:,}"
    )
    print(
        f"conn --json (last run): {conn_summary['connections']:,} connections reported, "
        f"{conn_sampled:,} events "
        "sampled away under overload"
    )
    print(f"bpftrace printf lines written (last run): {bt_lines:,} (storm: {expected_lines:,} state changes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
