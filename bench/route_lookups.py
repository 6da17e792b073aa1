"""Route lookups with the route programs attached: unconnected UDP sends (one fib lookup each) per second
untraced vs `netsleuth route --summary` vs a bpftrace count of fib:fib_table_lookup (fib6:fib6_table_lookup
with --family 6) by table and result, taking turns; the kernel cost per lookup (bpf_stats of route_fib or
route_fib6, in a separate storm so its accounting does not slow the measured one); and the exact check:
lookups counted for the flow equal the datagrams sent.

    sudo .venv/bin/python bench/route_lookups.py [--family 4|6] [--count 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.netlab import Host, Lab  # noqa: E402

from bench.harness import Tracer, mount_tracefs_for_bpftrace, print_rates, program_cost, program_stats  # noqa: E402
from netsleuth.bpf.stats import RunTimeStats  # noqa: E402

SENDER_CPU, TRACER_CPU = "0", "1"
# Per family: the two ends, the tracepoint bpftrace counts, the program whose bpf_stats give the cost.
FAMILIES = {
    4: ("198.18.0.1/24", "198.18.0.2", "fib:fib_table_lookup", "route_fib"),
    6: ("2001:db8::1/64", "2001:db8::2", "fib6:fib6_table_lookup", "route_fib6"),
}


def bpftrace_script(tracepoint: str) -> str:
    count_by_table = "{ @[args->tb_id, args->err] = count(); }"
    return f'BEGIN {{ printf("ready\\n"); }} tracepoint:{tracepoint} {count_by_table}'


def send(sender: Host, flood: str, count: int, destination: str) -> float:
    started = time.monotonic()
    result = json.loads(sender.run("taskset", "-c", SENDER_CPU, flood, destination, "9", str(count)).stdout)
    return float(result["sent"]) / (time.monotonic() - started)


def _printed_ready(out: Path) -> Callable[[], bool]:
    return lambda: "ready" in out.read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", type=int, choices=(4, 6), default=4)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    mount_tracefs_for_bpftrace()
    source, destination, tracepoint, program = FAMILIES[options.family]
    prefix = source.split("/", 1)[1]
    lab = Lab(prefix="nsbr")
    rates: dict[str, list[float]] = {"untraced": [], "netsleuth": [], "bpftrace": []}
    ns_per_lookup: list[float] = []
    exact: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        flood = scratch / "udpflood"
        subprocess.run(["gcc", "-O2", "-o", str(flood), str(REPO / "bench" / "udpflood.c")], check=True)
        try:
            sender, receiver = lab.host("a"), lab.host("b")
            lab.link(sender, receiver, [source], [f"{destination}/{prefix}"])  # IPv6 with nodad
            send(sender, str(flood), 10, destination)  # ARP / neighbour discovery
            for round_number in range(options.repeat):
                for name in rates:
                    if name == "untraced":
                        rates[name].append(send(sender, str(flood), options.count, destination))
                    elif name == "netsleuth":
                        ready = scratch / f"ready-{round_number}"
                        out = scratch / f"route-{round_number}.json"
                        argv = [sys.executable, "-m", "netsleuth", "route", "--summary", "--json"]
                        argv += [f"-{options.family}", "--netns", sender.name, "--dst", destination]
                        argv += ["--ready-file", str(ready)]
                        tracer = Tracer(argv, ready.exists, out, TRACER_CPU)
                        # The rate is taken with bpf_stats off (its clock reads per program run would be
                        # charged to us); the cost per lookup comes from a second, smaller storm with it on.
                        rates[name].append(send(sender, str(flood), options.count, destination))
                        with RunTimeStats():
                            before = program_stats((program,))
                            send(sender, str(flood), options.count // 4, destination)
                            after = program_stats((program,))
                        tracer.stop()
                        summary = json.loads(out.read_text().splitlines()[-1])
                        flow = sum(
                            group["count"]
                            for group in summary["groups"]
                            if group["kind"] == "lookup" and group["example"]["dport"] == 9
                        )
                        sent = options.count + options.count // 4
                        exact.append(f"lookups counted for the flow {flow} vs datagrams sent {sent}")
                        cost = program_cost(before, after).ns_per_run
                        if cost is not None:
                            ns_per_lookup.append(cost)
                    else:
                        out = scratch / f"bpftrace-{round_number}.out"
                        tracer = Tracer(
                            ["bpftrace", "-e", bpftrace_script(tracepoint)],
                            _printed_ready(out),
                            out,
                            TRACER_CPU,
                        )
                        rates[name].append(send(sender, str(flood), options.count, destination))
                        tracer.stop()
        finally:
            lab.close()
    print(
        f"{options.count} unconnected UDP sends over IPv{options.family} (one route lookup each), "
        f"median of {options.repeat} runs"
    )
    print_rates(rates, "sends/s")
    if ns_per_lookup:
        per_lookup = statistics.median(ns_per_lookup)
        print(f"  netsleuth {program}: {per_lookup:.0f} ns per lookup (bpf_stats, every lookup on the host)")
    for line in exact:
        print(f"  exact: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
