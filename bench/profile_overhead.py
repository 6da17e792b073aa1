"""Profiler overhead on a CPU-bound workload: the wall time of a fixed amount of work on every CPU, untraced
vs `netsleuth profile` vs `bpftrace profile:hz` (counting the same (pid, kernel stack, user stack)), at 99 and
999 Hz, in the same run, taking turns (round-robin) so the machine's other load spreads over all alike; and
the kernel's cost per sample of our program (bpf_stats).

    sudo .venv/bin/python bench/profile_overhead.py [--work 3.0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.harness import Tracer, mount_tracefs_for_bpftrace, program_stats  # noqa: E402
from netsleuth.bpf.stats import RunTimeStats  # noqa: E402

WORKLOAD = r"""
#include <stdio.h>
#include <stdlib.h>
volatile unsigned long sink;
__attribute__((noinline)) void work(unsigned long n) { for (unsigned long i = 0; i < n; i++) sink += i * i; }
int main(int argc, char **argv) { work(strtoul(argv[1], 0, 10)); return 0; }
"""


def build(work_dir: Path) -> str:
    source = work_dir / "cpuwork.c"
    source.write_text(WORKLOAD)
    binary = work_dir / "cpuwork"
    subprocess.run(["gcc", "-O1", "-fno-omit-frame-pointer", "-o", str(binary), str(source)], check=True)
    return str(binary)


def run_work(binary: str, iterations: int) -> float:
    """Wall time of one copy of the work per CPU, all at once."""
    cpus = os.cpu_count() or 1
    started = time.monotonic()
    procs = [subprocess.Popen(["taskset", "-c", str(cpu), binary, str(iterations)]) for cpu in range(cpus)]
    for proc in procs:
        proc.wait()
    return time.monotonic() - started


def calibrate(binary: str, seconds: float) -> int:
    iterations = 50_000_000
    cpu_seconds = run_work(binary, iterations) / (os.cpu_count() or 1)
    return int(iterations * seconds / cpu_seconds)


def netsleuth(hz: int, scratch: Path) -> Tracer:
    ready = scratch / f"ready-{hz}"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "netsleuth", "profile", "--hz", str(hz), "--ready-file", str(ready)]
    argv += ["--folded", str(scratch / f"ns-{hz}.folded")]
    return Tracer(argv, ready.exists, scratch / f"ns-{hz}.out", "0-1")


def bpftrace(hz: int, scratch: Path) -> Tracer:
    # The same in-kernel counting; the map is cleared at exit instead of printed: symbolizing every user
    # stack of the host takes bpftrace minutes, and that is not what is measured here.
    script = (
        f'BEGIN {{ printf("ready\\n"); }} profile:hz:{hz} {{ @[pid, kstack, ustack] = count(); }} '
        "END { clear(@); }"
    )
    out = scratch / f"bt-{hz}.out"
    return Tracer(["bpftrace", "-e", script], lambda: "ready" in out.read_text(), out, "0-1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=float, default=3.0, help="seconds of work per run, untraced")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    mount_tracefs_for_bpftrace()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        binary = build(scratch)
        iterations = calibrate(binary, options.work)
        configs = ["untraced", "netsleuth 99", "bpftrace 99", "netsleuth 999", "bpftrace 999"]
        times: dict[str, list[float]] = {name: [] for name in configs}
        ns_per_sample: dict[str, list[float]] = {name: [] for name in configs[1:]}
        for _ in range(options.repeat):
            for name in configs:
                if name == "untraced":
                    times[name].append(run_work(binary, iterations))
                    continue
                tool, hz_text = name.split()
                hz = int(hz_text)
                tracer = (netsleuth if tool == "netsleuth" else bpftrace)(hz, scratch)
                # bpftrace names a profile probe's program after its rate (profile:hz:99 -> "99").
                prefix = "profile_sample" if tool == "netsleuth" else str(hz)
                try:
                    with RunTimeStats():
                        before = program_stats((prefix,))
                        times[name].append(run_work(binary, iterations))
                        after = program_stats((prefix,))
                    runs = after.get(prefix, (0, 0))[0] - before.get(prefix, (0, 0))[0]
                    spent = after.get(prefix, (0, 0))[1] - before.get(prefix, (0, 0))[1]
                    if runs:
                        ns_per_sample[name].append(spent / runs)
                finally:
                    tracer.stop()
        base = statistics.median(times["untraced"])
        cpus = os.cpu_count() or 1
        print(f"CPU-bound work on {cpus} CPUs, median of {options.repeat} runs (untraced {base:.3f} CPU s)")
        print("  config          CPU time    ratio    overhead   ns/sample   BPF cost (ns/sample x hz)")
        for name in configs:
            median = statistics.median(times[name])
            ratio = median / base
            line = f"  {name:<14} {median:7.3f} s   {ratio:6.4f}   {100 * (ratio - 1):+6.2f} %"
            if ns_per_sample.get(name):
                per_sample = statistics.median(ns_per_sample[name])
                hz = int(name.split()[1])
                line += f"   {per_sample:8.0f}   {100 * per_sample * hz / 1e9:.3f} % of each CPU"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
