"""UDP storm through veth NAPI with the softirq programs attached: packets/s received untraced vs `netsleuth
softirq` vs a bpftrace script keeping the same histograms (raise->entry, entry->exit per CPU and vector, NAPI
work per device), taking turns; the kernel cost per event of our programs (bpf_stats, in a separate storm so
its accounting does not slow the measured one); and the exact check:
the NAPI packets we counted equal the receiving device's rx_packets growth.

    sudo .venv/bin/python bench/softirq_storm.py [--count 200000] [--repeat 3]
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

from bench.harness import Tracer, print_rates, program_cost, program_stats  # noqa: E402
from netsleuth.bpf.stats import RunTimeStats  # noqa: E402

SENDER_CPU, TRACER_CPU = "0", "1"
BPFTRACE = (
    'BEGIN { printf("ready\\n"); } '
    "tracepoint:irq:softirq_raise { @raised[cpu, args->vec] = nsecs; } "
    "tracepoint:irq:softirq_entry { if (@raised[cpu, args->vec]) { "
    "@wait[cpu, args->vec] = hist(nsecs - @raised[cpu, args->vec]); delete(@raised[cpu, args->vec]); } "
    "@entered[cpu, args->vec] = nsecs; } "
    "tracepoint:irq:softirq_exit { @run[cpu, args->vec] = hist(nsecs - @entered[cpu, args->vec]); } "
    "tracepoint:napi:napi_poll { @work[str(args->dev_name)] = hist(args->work); "
    "@polls[str(args->dev_name)] = count(); }"
)


def rx_packets(host: Host) -> int:
    return int(host.run("cat", "/sys/class/net/veth0/statistics/rx_packets").stdout)


def storm(sender: Host, receiver: Host, flood: str, count: int) -> tuple[float, int]:
    before = rx_packets(receiver)
    started = time.monotonic()
    sender.run("taskset", "-c", SENDER_CPU, flood, "198.18.0.2", "9", str(count))
    elapsed = time.monotonic() - started
    received = rx_packets(receiver) - before
    return received / elapsed, received


def _printed_ready(out: Path) -> Callable[[], bool]:
    return lambda: "ready" in out.read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    lab = Lab(prefix="nsbq")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        flood = scratch / "udpflood"
        subprocess.run(["gcc", "-O2", "-o", str(flood), str(REPO / "bench" / "udpflood.c")], check=True)
        try:
            sender, receiver = lab.host("a"), lab.host("b")
            lab.link(sender, receiver, ["198.18.0.1/24"], ["198.18.0.2/24"])
            receiver.run(
                "ethtool", "-K", "veth0", "gro", "on"
            )  # veth NAPI (see tests/privileged/test_softirq.py)
            sender.run("ethtool", "-K", "veth0", "tso", "off")
            storm(sender, receiver, str(flood), 10)  # ARP
            rates: dict[str, list[float]] = {"untraced": [], "netsleuth": [], "bpftrace": []}
            ns_per_event: list[float] = []
            per_program: dict[str, list[float]] = {}
            events_per_packet: list[float] = []
            exact: list[str] = []
            for round_number in range(options.repeat):
                for name in rates:
                    if name == "untraced":
                        rates[name].append(storm(sender, receiver, str(flood), options.count)[0])
                        continue
                    if name == "netsleuth":
                        ready = scratch / f"ready-{round_number}"
                        out = scratch / f"softirq-{round_number}.json"
                        argv = [
                            sys.executable,
                            "-m",
                            "netsleuth",
                            "softirq",
                            "--json",
                            "--ready-file",
                            str(ready),
                        ]
                        argv += ["--netns", receiver.name]
                        tracer = Tracer(argv, ready.exists, out, TRACER_CPU)
                        # The rate is taken with bpf_stats off (its two clock reads per program run would be
                        # charged to us); the cost per event comes from a second, smaller storm with it on.
                        rate, received = storm(sender, receiver, str(flood), options.count)
                        with RunTimeStats():
                            before = program_stats(("sirq_",))
                            received += storm(sender, receiver, str(flood), options.count // 4)[1]
                            after = program_stats(("sirq_",))
                        tracer.stop()
                        summary = json.loads(out.read_text())
                        napi = [n for n in summary["napi"] if n["dev"] == "veth0"]
                        counted = sum(n["packets"] for n in napi)
                        exact.append(f"NAPI packets {counted} vs rx_packets growth {received}")
                        cost = program_cost(before, after)
                        for program, per_run in cost.ns_per_run_by_program.items():
                            per_program.setdefault(program, []).append(per_run)
                        if cost.ns_per_run is not None:
                            ns_per_event.append(cost.ns_per_run)
                            events_per_packet.append(cost.runs / max(1, options.count // 4))
                        rates[name].append(rate)
                    else:
                        out = scratch / f"bpftrace-{round_number}.out"
                        tracer = Tracer(
                            ["bpftrace", "-e", BPFTRACE],
                            _printed_ready(out),
                            out,
                            TRACER_CPU,
                        )
                        rates[name].append(storm(sender, receiver, str(flood), options.count)[0])
                        tracer.stop()
        finally:
            lab.close()
    print(f"UDP storm of {options.count} datagrams into veth NAPI, median of {options.repeat} runs")
    print_rates(rates, "packets/s received")
    if ns_per_event:
        print(
            f"  netsleuth softirq programs: {statistics.median(ns_per_event):.0f} ns per event (bpf_stats), "
            f"{statistics.median(events_per_packet):.2f} events per packet"
        )
        for program, values in sorted(per_program.items()):
            print(f"    {program:<16} {statistics.median(values):6.0f} ns per run")
    for line in exact:
        print(f"  exact: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
