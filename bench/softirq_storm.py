"""UDP storm through veth NAPI, packets/s received: untraced, with the floor, netsleuth softirq, bpftrace.

Taking turns: untraced; the floor (programs that do nothing on the same four tracepoints, bench/floor.bpf.c:
what the kernel's dispatch alone leaves any tracer); the floor + clocks (one clock read at raise, entry and
exit: the least any tracer timing softirqs does); `netsleuth softirq`; a
bpftrace script keeping the same histograms (raise->entry, entry->exit per CPU and vector, NAPI work per
device). Then the kernel cost per event of our programs and of the floor's (bpf_stats, in a separate storm so
its accounting does not slow the measured one), and the exact check: the NAPI packets we counted equal the
receiving device's rx_packets growth.

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
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.netlab import Host, Lab  # noqa: E402

from bench.floor_tracer import build_floor, floor_argv  # noqa: E402
from bench.harness import Tracer, mount_tracefs_for_bpftrace, print_rates, program_cost, program_stats  # noqa: E402
from netsleuth.bpf.stats import RunTimeStats  # noqa: E402

SENDER_CPU, TRACER_CPU = "0", "1"
# bench/floor.bpf.c programs per floor configuration, and what each one is.
FLOORS: dict[str, tuple[tuple[str, ...], str]] = {
    "floor": (
        ("sirq_raise_floor", "sirq_entry_floor", "sirq_exit_floor", "napi_poll_floor"),
        "programs that do nothing",
    ),
    # What timing raise, entry and exit (as we do) cannot avoid.
    "floor + clocks": (
        ("sirq_raise_clk", "sirq_entry_clk", "sirq_exit_clk", "napi_poll_floor"),
        "one clock read at raise, entry, exit",
    ),
}
# Whole names (tp_btf and raw_tp builds), not a "sirq_" prefix another experiment's programs may share.
NETSLEUTH_PROGRAMS = tuple(
    f"sirq_{hook}_{build}" for hook in ("raise", "entry", "exit", "napi") for build in "br"
)
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


@dataclass
class Costs:
    """What bpf_stats said, per round: ns per event of each configuration's programs, and per program."""

    ns_per_event: dict[str, list[float]] = field(default_factory=dict)
    per_program: dict[str, list[float]] = field(default_factory=dict)
    events_per_packet: list[float] = field(default_factory=list)
    exact: list[str] = field(default_factory=list)


class Storms:
    """The lab's two hosts and the sender binary: one storm at a time."""

    def __init__(self, sender: Host, receiver: Host, flood: Path, count: int) -> None:
        self.sender, self.receiver, self.flood, self.count = sender, receiver, str(flood), count

    def rate(self) -> tuple[float, int]:
        return storm(self.sender, self.receiver, self.flood, self.count)

    def cost(self, programs: tuple[str, ...], costs: Costs, label: str) -> int:
        """A second, smaller storm with bpf_stats on (its two clock reads per program run would be charged to
        the measured rate): ns per event of the programs whose names start with one of `programs`. Returns
        the packets received."""
        with RunTimeStats():
            before = program_stats(programs)
            received = storm(self.sender, self.receiver, self.flood, self.count // 4)[1]
            after = program_stats(programs)
        cost = program_cost(before, after)
        if cost.ns_per_run is not None:
            costs.ns_per_event.setdefault(label, []).append(cost.ns_per_run)
        if label == "netsleuth":
            for program, per_run in cost.ns_per_run_by_program.items():
                costs.per_program.setdefault(program, []).append(per_run)
            costs.events_per_packet.append(cost.runs / max(1, self.count // 4))
        return received


def traced_by_netsleuth(storms: Storms, scratch: Path, round_number: int, costs: Costs) -> float:
    ready = scratch / f"ready-{round_number}"
    out = scratch / f"softirq-{round_number}.json"
    argv = [sys.executable, "-m", "netsleuth", "softirq", "--json", "--ready-file", str(ready)]
    argv += ["--netns", storms.receiver.name]
    tracer = Tracer(argv, ready.exists, out, TRACER_CPU)
    rate, received = storms.rate()
    received += storms.cost(NETSLEUTH_PROGRAMS, costs, "netsleuth")
    tracer.stop()
    summary = json.loads(out.read_text())
    counted = sum(napi["packets"] for napi in summary["napi"] if napi["dev"] == "veth0")
    costs.exact.append(f"NAPI packets {counted} vs rx_packets growth {received}")
    return rate


def traced_by_floor(
    storms: Storms, floor: Path, scratch: Path, round_number: int, costs: Costs, label: str
) -> float:
    programs = FLOORS[label][0]
    ready = scratch / f"{label}-ready-{round_number}"
    tracer = Tracer(floor_argv(floor, ready, programs), ready.exists, scratch / "floor.out", TRACER_CPU)
    rate = storms.rate()[0]
    storms.cost(programs, costs, label)
    tracer.stop()
    return rate


def traced_by_bpftrace(storms: Storms, scratch: Path, round_number: int) -> float:
    out = scratch / f"bpftrace-{round_number}.out"
    tracer = Tracer(["bpftrace", "-e", BPFTRACE], _printed_ready(out), out, TRACER_CPU)
    rate = storms.rate()[0]
    tracer.stop()
    return rate


def print_costs(costs: Costs) -> None:
    if "netsleuth" in costs.ns_per_event:
        print(
            f"  netsleuth softirq programs: {statistics.median(costs.ns_per_event['netsleuth']):.0f} ns per "
            f"event (bpf_stats), {statistics.median(costs.events_per_packet):.2f} events per packet"
        )
        for program, values in sorted(costs.per_program.items()):
            print(f"    {program:<16} {statistics.median(values):6.0f} ns per run")
    for label, (_programs, what) in FLOORS.items():
        if label in costs.ns_per_event:
            cost = statistics.median(costs.ns_per_event[label])
            print(f"  {label} ({what}): {cost:.0f} ns per event (bpf_stats)")
    for line in costs.exact:
        print(f"  exact: {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    mount_tracefs_for_bpftrace()
    lab = Lab(prefix="nsbq")
    rates: dict[str, list[float]] = {
        "untraced": [],
        "floor": [],
        "floor + clocks": [],
        "netsleuth": [],
        "bpftrace": [],
    }
    costs = Costs()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        flood = scratch / "udpflood"
        subprocess.run(["gcc", "-O2", "-o", str(flood), str(REPO / "bench" / "udpflood.c")], check=True)
        floor = build_floor(scratch)
        try:
            sender, receiver = lab.host("a"), lab.host("b")
            lab.link(sender, receiver, ["198.18.0.1/24"], ["198.18.0.2/24"])
            # veth NAPI (see tests/privileged/test_softirq.py)
            receiver.run("ethtool", "-K", "veth0", "gro", "on")
            sender.run("ethtool", "-K", "veth0", "tso", "off")
            storm(sender, receiver, str(flood), 10)  # ARP
            storms = Storms(sender, receiver, flood, options.count)
            for round_number in range(options.repeat):
                rates["untraced"].append(storms.rate()[0])
                for label in FLOORS:
                    rates[label].append(traced_by_floor(storms, floor, scratch, round_number, costs, label))
                rates["netsleuth"].append(traced_by_netsleuth(storms, scratch, round_number, costs))
                rates["bpftrace"].append(traced_by_bpftrace(storms, scratch, round_number))
        finally:
            lab.close()
    print(f"UDP storm of {options.count} datagrams into veth NAPI, median of {options.repeat} runs")
    print_rates(rates, "packets/s received")
    print_costs(costs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
