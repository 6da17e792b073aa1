"""Drop-storm benchmark: how much `netsleuth drops` slows a storm of drops, against bpftrace, in one run.

A C sender (bench/udpflood.c) sends UDP into an iptables OUTPUT DROP inside a private namespace; every
sendto() is refused with EPERM after exactly one NETFILTER_DROP, so drops/s = refusals / sender seconds.
Each configuration runs the same storm; ratios compare with the untraced run and with bpftrace (Debian's
package) doing the same work on the same tracepoint. Kernel-side cost per event comes from bpf_stats.

Then, in the same lab (bench/drops_delivery.py, bench/attach_time.py):
- delivered events/s, unsampled: `drops --json` (firewall rules named) to a file and to a pipe, an agent
  session, and bpftrace printf to a file and a pipe, each under a storm faster than it can take;
- the sampling threshold: paced storms around the delivered rate, the fastest with nothing sampled;
- attach time, exec -> attached, `drops --summary` and bpftrace count() alternately, medians.

And last the three figures as a user measures them (issue 22), each against bpftrace or the floor of the
same run, with the load average at start and end (the machine may be shared):
- attach: the installed `netsleuth drops --summary --ready-file F` from exec until F exists, against
  bpftrace counting by reason until its BEGIN prints `ready`, neither pinned (bench/attach_time.py);
- unsampled delivery: a storm of --user-storm drops at full speed, no warm-up; `drops --reason
  NETFILTER_DROP --json > file` against bpftrace printing pid, reason and location of the same drops to a
  file, and an agent session naming rules: records written / the storm's own duration, in turn, medians;
- `drops --summary`'s storm rate as a share of the floor's (an empty program on the same tracepoint) in the
  same rounds.
netsleuth runs from compiled bytecode, as an installed package does (see use_compiled_bytecode).

    python bench/drops_storm.py [--count N] [--repeat R] [--attach-rounds N] [--issue22]
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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.netlab import Host, Lab  # noqa: E402

from bench.attach_time import (  # noqa: E402
    AttachTimes,
    UserAttach,
    measure_attach,
    measure_user_attach,
    netsleuth_command,
    use_compiled_bytecode,
)
from bench.drops_delivery import (  # noqa: E402
    BPFTRACE_PRINTF,
    WARM_UP_DROPS,
    Delivery,
    StormRun,
    agent_delivery,
    agent_storm_delivery,
    deliver,
    sampling_threshold,
    storm_delivery,
)
from bench.floor_tracer import build_floor, floor_argv  # noqa: E402
from bench.harness import (  # noqa: E402
    BPFTRACE_READY,
    Tracer,
    bpftrace_tracer,
    mount_tracefs_for_bpftrace,
    netsleuth_tracer,
    program_stats,
)
from bench.udp_storm import SENDER_CPU, TRACER_CPU, Storm, build_sender, storm, timed_storm  # noqa: E402
from netsleuth.bpf.stats import RunTimeStats  # noqa: E402

BPFTRACE_COUNT = "tracepoint:skb:kfree_skb /args->reason != 1/ { @drops[args->reason] = count(); }"
# The user's comparison for delivery (issue 22): bpftrace printing who, why and where for each drop of the
# reason netsleuth is asked for, to a file, exactly as `bpftrace -e '...' > file` runs.
BPFTRACE_USER_PRINTF = (
    "tracepoint:skb:kfree_skb /args->reason == {reason}/ "
    '{{ printf("%d %d %p\\n", pid, args->reason, args->location); }}'
)
FLOOR = "floor: empty tp_btf program"


@dataclass
class Result:
    name: str
    rate: float  # drops per second the sender achieved
    attach_s: float | None = None
    kernel_ns_per_event: float | None = None
    note: str = ""
    vs_untraced: float = 1.0  # median over rounds of this rate / the untraced rate of the same round


def bpf_program_stats(name_prefix: str) -> tuple[int, int]:
    """(run_cnt, run_time_ns) summed over loaded programs whose name starts with the prefix."""
    stats = program_stats((name_prefix,)).values()
    return sum(runs for runs, _ in stats), sum(spent for _, spent in stats)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="drops per storm")
    parser.add_argument("--repeat", type=int, default=3, help="storms per configuration (median is kept)")
    parser.add_argument("--attach-rounds", type=int, default=7, help="attach-time pairs (median is kept)")
    parser.add_argument(
        "--pace-seconds", type=float, default=2.0, help="length of each paced storm (sampling threshold)"
    )
    parser.add_argument(
        "--user-storm", type=int, default=2_000_000, help="drops per storm of the user's delivery measurement"
    )
    parser.add_argument(
        "--user-rounds", type=int, default=3, help="rounds of the user's delivery measurement (median kept)"
    )
    parser.add_argument(
        "--user-attach-rounds", type=int, default=11, help="runs of each of the user's attach measurement"
    )
    parser.add_argument(
        "--issue22",
        action="store_true",
        help="only the three figures as a user measures them: untraced, floor, --summary and --json "
        "storms, the user's delivery and attach measurements",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark loads BPF programs and builds network namespaces")
    mount_tracefs_for_bpftrace()
    if not shutil.which("bpftrace"):
        sys.exit("bpftrace is needed for the comparison: apt install bpftrace")
    load_start = os.getloadavg()
    lab = Lab()
    work = Path(tempfile.mkdtemp(prefix="netsleuth-bench-"))
    use_compiled_bytecode(work)
    try:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, ["198.18.0.1/24"], ["198.18.0.2/24"])
        a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "9", "-j", "DROP")
        sender = build_sender(work)
        rounds = storm_rounds(a, sender, work, args.count, args.repeat, only_floor=args.issue22)
        narrow = None if args.issue22 else narrow_measurements(a, sender, work, args)
        user_runs = user_delivery(a.argv, sender, work, args.user_storm, args.user_rounds)
        user_attach = measure_user_attach(args.user_attach_rounds, work=work)
    finally:
        lab.close()
        shutil.rmtree(work, ignore_errors=True)

    print("\n".join(rounds.lines(args.count, args.repeat)))
    if narrow is not None:
        print("\n".join(narrow.lines(rounds, args.count)))
    print()
    print("\n".join(user_attach.lines()))
    print()
    print("\n".join(user_delivery_lines(user_runs, args.user_storm)))
    print()
    print("\n".join(headline(rounds, user_attach, user_runs, load_start)))
    return 0


@dataclass
class Samples:
    rates: list[float] = field(default_factory=list)
    attach: list[float] = field(default_factory=list)
    ns_per_event: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    note: str = ""


@dataclass
class StormRounds:
    """Every configuration's storms, round by round (the same order in every round)."""

    samples: dict[str, Samples]
    results: list[Result]
    stream_summary: dict[str, Any] | None  # the last `drops --json` run's summary
    bt_lines: int | None  # lines the last bpftrace printf run wrote

    @property
    def by_name(self) -> dict[str, Result]:
        return {result.name: result for result in self.results}

    @property
    def base(self) -> float:
        return self.by_name["untraced"].rate

    @property
    def summary_of_floor(self) -> float:
        """The floor ran just before the summary in every round: the ratio of the two rates of one round is
        the share of what any tracer can keep that our program keeps, whatever the machine did between
        rounds; the median over rounds."""
        return statistics.median(
            ours / theirs
            for ours, theirs in zip(self.samples[SUMMARY].rates, self.samples[FLOOR].rates, strict=True)
        )

    def lines(self, count: int, repeat: int) -> list[str]:
        base = self.base
        lines = [
            f"drop storm: {count:,} drops per run, median of {repeat}, {os.cpu_count()} CPUs, "
            f"kernel {os.uname().release}",
            f"{'configuration':28} {'drops/s':>12} {'vs untraced':>12} {'paired':>7} {'attach s':>9} "
            f"{'kernel ns/event':>16}",
        ]
        for result in self.results:
            attach = f"{result.attach_s:.3f}" if result.attach_s is not None else "-"
            cost = f"{result.kernel_ns_per_event:.0f}" if result.kernel_ns_per_event is not None else "-"
            lines.append(
                f"{result.name:28} {result.rate:12,.0f} {result.rate / base:12.3f} {result.vs_untraced:7.3f} "
                f"{attach:>9} {cost:>16}"
            )
        summary, floor = self.by_name[SUMMARY], self.by_name[FLOOR]
        lines += [
            "",
            f"summary vs untraced rate:          {summary.rate / base:.3f}, paired by round "
            f"{summary.vs_untraced:.3f}",
            f"floor (an empty tp_btf program):    {floor.vs_untraced:.3f} of untraced, paired: what the "
            "kernel's dispatch alone leaves any tracer",
            f"summary vs the floor:              {self.summary_of_floor:.3f} paired by round  (the share of "
            "the floor's rate our program keeps; target >= 0.98)",
        ]
        if summary.kernel_ns_per_event and floor.kernel_ns_per_event:
            own = summary.kernel_ns_per_event - floor.kernel_ns_per_event
            lines.append(
                f"summary in-kernel ns/event:        {summary.kernel_ns_per_event:.0f} (floor "
                f"{floor.kernel_ns_per_event:.0f}: {own:.0f} ns of our own)"
            )
        return lines


SUMMARY = "netsleuth drops --summary"


def storm_rounds(a: Host, sender: str, work: Path, count: int, repeat: int, only_floor: bool) -> StormRounds:
    """`repeat` rounds of a storm of `count` drops per configuration (untraced, the floor, netsleuth counting
    and streaming, bpftrace counting and printing; with `only_floor` the first four: what the streaming
    program costs per event in the kernel is issue 22's delivery's ceiling)."""
    netsleuth = [sys.executable, "-m", "netsleuth"]

    def measure_once(samples: Samples, start: Callable[[], Tracer | None], prefix: str) -> None:
        """One storm for the rate, then (traced only) a short one with bpf_stats on for the cost per
        event: run-time accounting adds two clock reads per run, which must not count in the rate."""
        tracer = start()
        samples.rates.append(storm(a.argv, sender, "198.18.0.2", count))
        if tracer is not None:
            with RunTimeStats():
                before = bpf_program_stats(prefix)
                storm(a.argv, sender, "198.18.0.2", max(count // 10, 1000))
                after = bpf_program_stats(prefix)
            samples.attach.append(tracer.attach_s)
            samples.note = tracer.stop()[-300:].strip()
            if after[0] - before[0]:
                samples.ns_per_event.append((after[1] - before[1]) / (after[0] - before[0]))

    def drops(option: str, stdout: str) -> Callable[[], Tracer]:
        return netsleuth_tracer([*netsleuth, "drops", "--netns", a.name, option], work, stdout, TRACER_CPU)

    def bpftrace(program: str, stdout: str) -> Callable[[], Tracer]:
        return bpftrace_tracer(BPFTRACE_READY + program, work, stdout, TRACER_CPU)

    floor_object = build_floor(work)

    def floor_tracer() -> Tracer:
        ready = work / "floor-ready"
        ready.unlink(missing_ok=True)
        argv = floor_argv(floor_object, ready, ("kfree_skb_floor",))
        return Tracer(argv, ready.exists, work / "floor.out", TRACER_CPU)

    configurations: list[tuple[str, Callable[[], Tracer | None], str]] = [
        ("untraced", lambda: None, ""),
        (FLOOR, floor_tracer, "kfree_skb_floor"),
        (SUMMARY, drops("--summary", "summary.out"), "drops_"),
        ("netsleuth drops --json", drops("--json", "stream.jsonl"), "drops_"),
        ("bpftrace count()", bpftrace(BPFTRACE_COUNT, "bt_count.out"), "kfree_skb"),
        ("bpftrace printf", bpftrace(BPFTRACE_PRINTF, "bt_printf.out"), "kfree_skb"),
    ]
    if only_floor:
        configurations = configurations[:4]
    samples = {name: Samples() for name, _, _ in configurations}
    # Round-robin, so whatever else the machine does spreads over every configuration alike; each traced
    # rate is also divided by the untraced rate of its own round, which cancels slow drifts in load.
    for _ in range(repeat):
        for name, start, prefix in configurations:
            measure_once(samples[name], start, prefix)
            samples[name].ratios.append(samples[name].rates[-1] / samples["untraced"].rates[-1])
    results = [
        Result(
            name,
            statistics.median(taken.rates),
            statistics.median(taken.attach) if taken.attach else None,
            statistics.median(taken.ns_per_event) if taken.ns_per_event else None,
            taken.note,
            statistics.median(taken.ratios),
        )
        for name, taken in samples.items()
    ]
    stream, printf = work / "stream.jsonl", work / "bt_printf.out"
    stream_summary = json.loads(stream.read_text().splitlines()[-1]) if stream.exists() else None
    bt_lines = sum(1 for _ in printf.open()) - 1 if printf.exists() else None
    return StormRounds(samples, results, stream_summary, bt_lines)


@dataclass
class Narrow:
    """The measurements before issue 22's: delivery after a warm-up, to a file and a pipe; the sampling
    threshold; attach time pinned to one CPU."""

    deliveries: list[Delivery]
    paces: list[tuple[float, int, int, int]]
    attach: AttachTimes

    def lines(self, rounds: StormRounds, count: int) -> list[str]:
        by_name = rounds.by_name
        summary, stream = by_name[SUMMARY], by_name["netsleuth drops --json"]
        bt_count, bt_printf = by_name["bpftrace count()"], by_name["bpftrace printf"]
        lines = [f"summary vs bpftrace count() rate:  {summary.rate / bt_count.rate:.3f}"]
        if summary.kernel_ns_per_event and bt_count.kernel_ns_per_event:
            # On a shared machine the rates swing with other load; the programs' own run time does not. What
            # it alone would cost: one untraced drop takes 1/base seconds, a traced one that plus the program.
            untraced_ns = 1e9 / rounds.base
            allowed_summary = untraced_ns / (untraced_ns + summary.kernel_ns_per_event)
            allowed_count = untraced_ns / (untraced_ns + bt_count.kernel_ns_per_event)
            lines.append(
                f"rate the in-kernel cost allows:    summary {allowed_summary:.3f}, "
                f"bpftrace count() {allowed_count:.3f} of untraced"
            )
        lines.append(f"streaming vs bpftrace printf rate: {stream.rate / bt_printf.rate:.3f}")
        if rounds.stream_summary is not None:
            totals = rounds.stream_summary
            lines.append(
                f"streaming accounting (last run):   total {totals['total']:,} = emitted "
                f"{totals['emitted']:,} + sampled {totals['sampled']:,} + lost {totals['lost']:,}"
            )
        if rounds.bt_lines is not None:
            lines.append(f"bpftrace printf lines written (last run): {rounds.bt_lines:,} of {count:,}")
        lines += [
            "",
            f"delivered events/s, unsampled, after a warm-up (storms of {count:,} drops, faster than any "
            "consumer):",
            f"{'consumer':34} {'events':>10} {'seconds':>8} {'events/s':>11} {'per CPU second':>16}  "
            "exact total = delivered + sampled",
        ]
        for item in self.deliveries:
            accounting = (
                f"{item.total:,} = {item.lines + item.warm:,} + {item.sampled:,} + {item.lost:,} lost"
                if item.total is not None and item.sampled is not None
                else ""
            )
            per_cpu = f"{item.per_cpu_second:,.0f}/CPU-s" if item.per_cpu_second else "-"
            columns = f"{item.name:34} {item.lines:10,} {item.seconds:8.2f} {item.rate:11,.0f} {per_cpu:>16}"
            lines.append(f"{columns}  {accounting}")
        by_delivery = {item.name: item for item in self.deliveries}
        for where in ("file", "pipe"):
            ours = by_delivery[f"netsleuth drops --json > {where}"]
            theirs = by_delivery[f"bpftrace printf > {where}"]
            lines.append(f"netsleuth vs bpftrace printf, {where}: {ours.rate / theirs.rate:.2f}x")
        lines += ["", "sampling threshold (paced storms, drops --json to a file; sampling starts past it):"]
        threshold = 0.0
        for rate, total, sampled, lost in self.paces:
            lines.append(f"  paced {rate:11,.0f}/s: total {total:,}, sampled {sampled:,}, lost {lost:,}")
            if sampled == 0 and lost == 0 and total > 0:
                threshold = max(threshold, rate)
        lines += [f"  fastest storm delivered whole: {threshold:,.0f} drops/s", "", *self.attach.lines()]
        return lines


def narrow_measurements(a: Host, sender: str, work: Path, args: argparse.Namespace) -> Narrow:
    netsleuth = [sys.executable, "-m", "netsleuth"]

    def full_storm() -> float:
        return storm(a.argv, sender, "198.18.0.2", args.count)

    def warm_up() -> float:
        return storm(a.argv, sender, "198.18.0.2", WARM_UP_DROPS)

    json_argv = [*netsleuth, "drops", "--netns", a.name, "--json"]
    bt_argv = ["bpftrace", "-B", "line", "-e", BPFTRACE_READY + BPFTRACE_PRINTF]

    def bt_ready(output: Path) -> bool:
        return b"ready" in output.read_bytes()[:64]

    ready_file = work / "delivery-ready"

    def ns_ready(_output: Path) -> bool:
        return ready_file.exists()

    deliveries: list[Delivery] = []
    for pipe in (False, True):
        where = "pipe" if pipe else "file"
        ready_file.unlink(missing_ok=True)
        deliveries.append(
            deliver(
                f"netsleuth drops --json > {where}",
                [*json_argv, "--ready-file", str(ready_file)],
                full_storm,
                pipe=pipe,
                ready=ns_ready,
                work=work,
                cpu=TRACER_CPU,
                warm_up=warm_up,
            )
        )
        deliveries.append(
            deliver(
                f"bpftrace printf > {where}",
                bt_argv,
                full_storm,
                pipe=pipe,
                ready=bt_ready,
                work=work,
                cpu=TRACER_CPU,
                header_lines=1,
                warm_up=warm_up,
            )
        )
    deliveries.append(agent_delivery(full_storm, a.name, TRACER_CPU, warm_up))

    # -- the sampling threshold: paced storms around the delivered rate (to a file) --------------------------
    delivered = deliveries[0].rate

    def paced_storm(rate: float, count: int) -> None:
        argv = a.argv("taskset", "-c", SENDER_CPU, sender, "198.18.0.2", "9", str(count), "16", str(rate))
        subprocess.run(argv, capture_output=True, check=True)

    def start_paced() -> tuple[subprocess.Popen[bytes], Path]:
        output = work / "paced.jsonl"
        ready_file.unlink(missing_ok=True)
        process = subprocess.Popen(
            ["taskset", "-c", TRACER_CPU, *json_argv, "--ready-file", str(ready_file)],
            stdout=output.open("wb"),
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not ready_file.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return process, output

    fractions = (0.5, 0.75, 1.0, 1.25, 1.5)
    paces = sampling_threshold(
        paced_storm,
        start_paced,
        [delivered * fraction for fraction in fractions],
        args.pace_seconds,
        warm_up,
    )
    attach = measure_attach(args.attach_rounds, TRACER_CPU, netns=a.name, work=work)
    return Narrow(deliveries, paces, attach)


def headline(
    rounds: StormRounds,
    user_attach: UserAttach,
    user_runs: dict[str, list[StormRun]],
    load_start: tuple[float, float, float],
) -> list[str]:
    """The three figures issue 22 asks for, each against bpftrace or the floor of the same run."""
    ns_rate, bt_rate, agent_rate = (
        statistics.median(run.rate for run in user_runs[name]) for name in USER_CONSUMERS
    )
    ours, theirs, agent = (user_runs[name] for name in USER_CONSUMERS)
    ns_vs_bt = statistics.median(a.rate / b.rate for a, b in zip(ours, theirs, strict=True))
    agent_vs_bt = statistics.median(a.rate / b.rate for a, b in zip(agent, theirs, strict=True))
    load_end = os.getloadavg()
    return [
        f"issue 22, as a user measures it (untraced storm {rounds.base:,.0f} drops/s; load average "
        f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at end, {os.cpu_count()} CPUs):",
        f"  attach, exec -> attached:  netsleuth {statistics.median(user_attach.netsleuth):.3f} s, bpftrace "
        f"{statistics.median(user_attach.bpftrace):.3f} s: {user_attach.ratio:.2f}  (target < 1)",
        f"  unsampled delivery:        netsleuth {ns_rate:,.0f}/s, bpftrace printf {bt_rate:,.0f}/s: "
        f"{ns_vs_bt:.2f}x paired  (target >= 2)",
        f"                             agent session naming rules {agent_rate:,.0f}/s: {agent_vs_bt:.2f}x  "
        "(target >= 1)",
        f"  drops --summary:           {rounds.summary_of_floor:.3f} of the floor's rate, paired  "
        "(target >= 0.98)",
    ]


USER_CONSUMERS = ("netsleuth drops --json > file", "bpftrace printf > file", "agent session (rule names)")


def user_delivery(
    host_argv: Callable[..., list[str]], sender: str, work: Path, count: int, rounds: int
) -> dict[str, list[StormRun]]:
    """Issue 22's delivery measurement: a storm of `count` drops at full speed, `drops --reason NETFILTER_DROP
    --json > file` against bpftrace printing pid, reason and location of the same drops to a file, and an
    agent session naming rules; records written / the storm's duration, in turn for `rounds` rounds."""
    from netsleuth.kernel.reasons import load_drop_reasons

    netfilter = load_drop_reasons().value("NETFILTER_DROP")
    ready_file = work / "user-delivery-ready"

    def storm() -> Storm:
        return timed_storm(host_argv, sender, "198.18.0.2", count)

    def netsleuth() -> StormRun:
        ready_file.unlink(missing_ok=True)
        argv = [*netsleuth_command(), "drops", "--reason", "NETFILTER_DROP", "--json"]
        return storm_delivery(
            USER_CONSUMERS[0],
            [*argv, "--ready-file", str(ready_file)],
            storm,
            ready=lambda _output: ready_file.exists(),
            # The storm's drops happen in the sender's own context: its pid is the owner netsleuth reports.
            is_record=lambda line, pid: line.startswith(b'{"type":"drop"') and b'"pid":%d,' % pid in line,
            work=work,
            cpu=TRACER_CPU,
        )

    def bpftrace() -> StormRun:
        program = BPFTRACE_READY + BPFTRACE_USER_PRINTF.format(reason=netfilter)
        return storm_delivery(
            USER_CONSUMERS[1],
            ["bpftrace", "-e", program],
            storm,
            ready=lambda output: b"ready\n" in output.read_bytes()[:256],
            is_record=lambda line, pid: line.startswith(b"%d " % pid),
            work=work,
            cpu=TRACER_CPU,
        )

    def agent() -> StormRun:
        request = {"diagnostic": "drops", "config": {"reason": ["NETFILTER_DROP"]}}
        return agent_storm_delivery(request, storm, TRACER_CPU)

    runs: dict[str, list[StormRun]] = {name: [] for name in USER_CONSUMERS}
    for _ in range(rounds):
        for name, measure in zip(USER_CONSUMERS, (netsleuth, bpftrace, agent), strict=True):
            runs[name].append(measure())
    return runs


def user_delivery_lines(runs: dict[str, list[StormRun]], count: int) -> list[str]:
    lines = [
        f"unsampled delivery as a user measures it: records written / storm seconds, storms of {count:,} "
        "drops at full speed, no warm-up:",
        f"  {'consumer':30} {'records':>10} {'storm s':>8} {'records/s':>11} {'per CPU s':>11} "
        f"{'wake-ups':>10}",
    ]
    for name, taken in runs.items():
        for run in taken:
            per_cpu = f"{run.per_cpu_second:11,.0f}" if run.per_cpu_second else f"{'-':>11}"
            wakeups = f"{run.wakeups:10,}" if run.wakeups is not None else f"{'-':>10}"
            lines.append(
                f"  {name:30} {run.records:10,} {run.storm_seconds:8.2f} {run.rate:11,.0f} {per_cpu} "
                f"{wakeups}" + (f"  {run.accounting()}" if run.summary else "")
            )
    lines.append(
        "  (wake-ups: IRQ work interrupts during the storm, /proc/interrupts IWI - the traced CPU waking the "
        "reader)"
    )
    return lines


if __name__ == "__main__":
    sys.exit(main())
