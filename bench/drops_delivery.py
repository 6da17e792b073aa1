"""How many drop events a consumer delivers per second, unsampled, and from which storm rate it samples.

Used by bench/drops_storm.py. A storm faster than any consumer is sent while the consumer writes every
event it gets (to a file, or to a pipe read by this process); the kernel samples what the consumer cannot
take (the ring buffer's back-pressure), so the lines written per second of delivery are the consumer's
own speed: delivered/s = lines / (last line's time - storm start). The same for bpftrace's printf, whose
perf buffer loses instead of sampling, and for an agent session (rule names on, read over its socket).

The sampling threshold: paced storms (bench/udpflood.c's PER_SECOND argument) at fractions of the
delivered rate; the threshold is the fastest pace at which nothing was sampled or lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.udp_storm import Storm

__all__ = [
    "BPFTRACE_PRINTF",
    "WARM_UP_DROPS",
    "Delivery",
    "LineCounter",
    "StormRun",
    "agent_delivery",
    "agent_storm_delivery",
    "cpu_seconds",
    "deliver",
    "sampling_threshold",
    "storm_delivery",
]

_QUIET_S = 0.6  # no new line for this long: the consumer has delivered everything it will
# bpftrace's side of the delivery comparison: every drop's time, reason, location and protocol, printed.
BPFTRACE_PRINTF = (
    "tracepoint:skb:kfree_skb /args->reason != 1/ "
    '{ printf("%d %d %p %d\\n", nsecs, args->reason, args->location, args->protocol); }'
)
WARM_UP_DROPS = 2000  # fits the ring buffer whole: none sampled while the consumer loads names


@dataclass
class Delivery:
    name: str
    lines: int  # event lines delivered
    seconds: float  # storm start -> last line
    total: int | None = None  # netsleuth: the exact total (summary), to show what was sampled/lost
    sampled: int | None = None
    lost: int | None = None
    cpu_seconds: float | None = None  # the consumer's own CPU time (user + system) from storm start to quiet
    warm: int = 0  # event lines of the warm-up storm before (in `total`, not in `lines`)

    @property
    def rate(self) -> float:
        return self.lines / self.seconds if self.seconds > 0 else 0.0

    @property
    def per_cpu_second(self) -> float | None:
        """Events delivered per second of the consumer's CPU: its speed when it has a core to itself. The
        rate above can be no faster than the storm, which on a loaded machine is slower than the consumer."""
        return self.lines / self.cpu_seconds if self.cpu_seconds else None


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (taskset execs the consumer in place, so its pid is the consumer's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def irq_work_interrupts() -> int | None:
    """IRQ work interrupts taken so far, all CPUs (/proc/interrupts `IWI`, x86): how a BPF program's ring or
    perf buffer wakes its reader from the traced context, one per wake-up. None where the row is missing."""
    for line in Path("/proc/interrupts").read_text().splitlines():
        fields = line.split()
        if fields and fields[0] == "IWI:":
            return sum(int(field) for field in fields[1:] if field.isdigit())
    return None


def _difference(after: int | None, before: int | None) -> int | None:
    return after - before if after is not None and before is not None else None


class LineCounter:
    """Counts newline-terminated lines from a binary stream on a thread, remembering when the last came;
    keeps the last few lines (a netsleuth run ends with its summary)."""

    def __init__(self, stream: IO[bytes], needle: bytes = b"") -> None:
        """`needle`: also count the lines holding it (`needles`)."""
        self._stream = stream
        self._needle = needle
        self.lines = 0
        self.needles = 0
        self.last_at = 0.0
        self.tail = b""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            read = getattr(self._stream, "read1", self._stream.read)
            try:
                chunk = read(1 << 20)
            except (OSError, ValueError):  # the stream was closed under us (an agent session ended)
                return
            if not chunk:
                return
            self.lines += chunk.count(b"\n")
            if self._needle:
                # A needle cut between two chunks: the last chunk's end, one byte short of a whole needle
                # (a whole one there was counted with it), and this chunk.
                carried = self.tail[max(0, len(self.tail) - len(self._needle) + 1) :]
                self.needles += (carried + chunk).count(self._needle)
            self.last_at = time.monotonic()
            self.tail = (self.tail + chunk)[-65536:]

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class _FileWatch:
    """Lines in a file written by another process, and when it last grew (polled)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self.last_at = 0.0

    def poll(self) -> None:
        size = self.path.stat().st_size if self.path.exists() else 0
        if size != self.size:
            self.size = size
            self.last_at = time.monotonic()


def _wait_quiet(last_at: Callable[[], float], poll: Callable[[], None] = lambda: None) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        poll()
        if time.monotonic() - last_at() > _QUIET_S:
            return
        time.sleep(0.02)


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _summary(lines: list[bytes]) -> dict[str, Any] | None:
    for line in reversed(lines):
        if line.startswith(b'{"type":"summary"'):
            summary: dict[str, Any] = json.loads(line)
            return summary
    return None


def deliver(
    name: str,
    argv: list[str],
    storm: Callable[[], float],
    *,
    pipe: bool,
    ready: Callable[[Path], bool],
    work: Path,
    cpu: str,
    header_lines: int = 0,
    warm_up: Callable[[], object] | None = None,
) -> Delivery:
    """Start `argv` (pinned to `cpu`) writing to a file or a pipe, wait until `ready(output)`, run
    `warm_up` (a small storm: a consumer names its first drops after attaching - kallsyms, namespaces, the
    firewall - and what the ring buffer cannot hold meanwhile is sampled, which is start-up, not delivery
    speed) and wait for its lines, then run the storm, wait for the output to go quiet, stop it with
    SIGINT; lines exclude the warm-up's, `header_lines` and the summary."""
    output = work / f"{name.replace(' ', '_').replace('|', 'pipe')}.out"
    output.write_text("")
    stdout: IO[Any] = subprocess.PIPE if pipe else output.open("wb")  # type: ignore[assignment]
    process = subprocess.Popen(["taskset", "-c", cpu, *argv], stdout=stdout, stderr=subprocess.PIPE)
    counter = LineCounter(process.stdout) if pipe and process.stdout is not None else None
    watch = _FileWatch(output)
    try:
        if counter is not None:
            _wait(lambda: ready(output) or counter.lines > 0 or process.poll() is not None, f"{name} ready")
        else:
            _wait(lambda: ready(output) or process.poll() is not None, f"{name} ready")
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {process.stderr.read().decode() if process.stderr else ''}")
        warm = 0
        if warm_up is not None:
            warm_up()
            # Its first line, then quiet: the consumer has named and written what it got.
            if counter is not None:
                _wait(lambda: counter.lines > header_lines, f"{name} warm-up lines")
                _wait_quiet(lambda: counter.last_at)
                warm = counter.lines
            else:
                _wait(lambda: output.read_bytes().count(b"\n") > header_lines, f"{name} warm-up lines")
                watch.poll()
                _wait_quiet(lambda: watch.last_at, watch.poll)
                warm = output.read_bytes().count(b"\n")
            warm -= header_lines
        cpu_before = cpu_seconds(process.pid)
        started = time.monotonic()
        storm()
        if counter is not None:
            _wait_quiet(lambda: counter.last_at)
            last_at = counter.last_at
        else:
            _wait_quiet(lambda: watch.last_at, watch.poll)
            last_at = watch.last_at
        used = cpu_seconds(process.pid) - cpu_before
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=300) if counter is None else process.wait(timeout=300)
        if counter is not None:
            counter.join(30)
        if not pipe:
            stdout.close()
    if counter is not None:
        lines, tail = counter.lines, counter.tail.splitlines()
    else:
        data = output.read_bytes()
        lines, tail = data.count(b"\n"), data[-65536:].splitlines()
    summary = _summary(tail)
    events = lines - header_lines - warm - (1 if summary is not None else 0)
    return Delivery(
        name,
        events,
        max(last_at - started, 1e-9),
        summary.get("total") if summary else None,
        summary.get("sampled") if summary else None,
        summary.get("lost") if summary else None,
        used,
        warm,
    )


@dataclass
class StormRun:
    """One consumer under one full-speed storm, measured as a user would: the records of the storm's drops
    it wrote, divided by the storm's own duration (the sender's clock, first to last send). What the kernel
    sampled away while the consumer was busy is not in `records`; netsleuth's summary counts it (`summary`),
    and `written` every drop record, this storm's and any other the machine dropped meanwhile."""

    name: str
    records: int
    storm_drops: int
    storm_seconds: float
    cpu_seconds: float | None  # the consumer's CPU from storm start to quiet
    summary: dict[str, Any] | None = None
    written: int | None = None  # every drop record written (the storm's and others' of the same reason)
    wakeups: int | None = None  # IRQ work interrupts during the storm (`irq_work_interrupts`)

    @property
    def rate(self) -> float:
        return self.records / self.storm_seconds if self.storm_seconds > 0 else 0.0

    @property
    def per_cpu_second(self) -> float | None:
        return self.records / self.cpu_seconds if self.cpu_seconds else None

    def accounting(self) -> str:
        """netsleuth's exact totals: seen = total + filtered out; total = delivered + sampled + lost."""
        if self.summary is None:
            return ""
        seen, total = int(self.summary["seen"]), int(self.summary["total"])
        emitted, sampled, lost = (int(self.summary[key]) for key in ("emitted", "sampled", "lost"))
        written = self.written if self.written is not None else self.records
        exact = "exact" if total == emitted + sampled + lost and emitted == written else "NOT EXACT"
        return (
            f"seen {seen:,} = total {total:,} + filtered {seen - total:,}; total = delivered {emitted:,} + "
            f"sampled {sampled:,} + lost {lost:,} ({exact}: {written:,} records written)"
        )


def _count_records(path: Path, is_record: Callable[[bytes], bool]) -> tuple[int, int, list[bytes]]:
    """Lines of `path` that are the storm's records, every drop record (a JSON line of type drop, or any
    other line starting with a digit: bpftrace's), and its last few other lines (netsleuth ends with its
    summary)."""
    count = written = 0
    tail: list[bytes] = []
    with path.open("rb") as lines:
        for line in lines:
            if is_record(line):
                count += 1
            if line.startswith(b'{"type":"drop"') or line[:1].isdigit():
                written += 1
            else:
                tail = [*tail[-8:], line]
    return count, written, tail


def storm_delivery(
    name: str,
    argv: list[str],
    storm: Callable[[], Storm],
    *,
    ready: Callable[[Path], bool],
    is_record: Callable[[bytes, int], bool],
    work: Path,
    cpu: str,
) -> StormRun:
    """Start `argv` pinned to `cpu` with its standard output to a file, wait until `ready(file)`, run the
    storm at once (no warm-up: what a consumer does while it names its first drops is part of what a user
    gets), wait for the file to stop growing, stop it with SIGINT; count the lines that `is_record(line,
    the storm's sender pid)` accepts."""
    output = work / f"storm-{name.split()[0]}.out"
    with output.open("wb") as stdout:
        process = subprocess.Popen(["taskset", "-c", cpu, *argv], stdout=stdout, stderr=subprocess.PIPE)
        watch = _FileWatch(output)
        try:
            _wait(lambda: ready(output) or process.poll() is not None, f"{name} ready")
            if process.poll() is not None:
                stderr = process.stderr.read().decode() if process.stderr else ""
                raise RuntimeError(f"{name} exited: {stderr}")
            cpu_before = cpu_seconds(process.pid)
            wakeups_before = irq_work_interrupts()
            sent = storm()
            wakeups = _difference(irq_work_interrupts(), wakeups_before)
            _wait_quiet(lambda: watch.last_at, watch.poll)
            used = cpu_seconds(process.pid) - cpu_before
        finally:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=300)
    records, written, tail = _count_records(output, lambda line: is_record(line, sent.pid))
    output.unlink()
    return StormRun(name, records, sent.drops, sent.seconds, used, _summary(tail), written, wakeups)


def agent_storm_delivery(request: dict[str, Any], storm: Callable[[], Storm], cpu: str) -> StormRun:
    """An agent session (firewall rules named) under the storm, its stream read raw off the agent's socket by
    this process, as `storm_delivery` measures a command: the storm's drop records (its sender's comm,
    `udpflood`, as the owner) ÷ the storm's own seconds."""
    from tests.privileged.test_agent_harness import AgentProcess

    limits = {"max_duration": 300, "max_events": 100_000_000, "max_bytes": 1 << 40, "cpu_budget_percent": 100}
    budget = {"duration": 120, "max_events": 100_000_000, "max_bytes": 1 << 40, "cpu_budget_percent": 100}
    with AgentProcess({"sessions": limits}, argv_prefix=["taskset", "-c", cpu]) as agent:
        agent.wait_ready()
        with agent.client.session({**request, **budget}) as stream:
            response = stream._response  # the raw chunked body: counting lines, not parsing them
            first = response.readline()
            assert first.startswith(b'{"type":"session_start"'), first[:200]
            counter = LineCounter(response, needle=b'"comm":"udpflood"')
            cpu_before = cpu_seconds(agent.process.pid)
            wakeups_before = irq_work_interrupts()
            sent = storm()
            wakeups = _difference(irq_work_interrupts(), wakeups_before)
            _wait(lambda: counter.lines > 0, "agent records")
            _wait_quiet(lambda: counter.last_at)
            used = cpu_seconds(agent.process.pid) - cpu_before
            # Every line so far is a drop record: the session ends (summary, end) only at its duration.
            records, written = counter.needles, counter.lines
    name = "agent session (rule names)"
    return StormRun(name, records, sent.drops, sent.seconds, used, written=written, wakeups=wakeups)


def sampling_threshold(
    paced_storm: Callable[[float, int], None],
    start: Callable[[], tuple[subprocess.Popen[bytes], Path]],
    rates: list[float],
    seconds: float,
    warm_up: Callable[[], object] | None = None,
) -> list[tuple[float, int, int, int]]:
    """For each pace (drops/s), a storm of `seconds` under a fresh `start()`ed netsleuth --json run, after
    `warm_up` and its lines (see `deliver`): (pace, total, sampled, lost) from its summary."""
    found = []
    for rate in rates:
        process, output = start()
        try:
            if warm_up is not None:
                watch = _FileWatch(output)
                warm_up()
                _wait(lambda: output.stat().st_size > 0, "warm-up lines")  # noqa: B023 (within the iteration)
                watch.poll()
                _wait_quiet(lambda: watch.last_at, watch.poll)  # noqa: B023
            paced_storm(rate, max(int(rate * seconds), 1000))
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=300)
        summary = _summary(output.read_bytes()[-65536:].splitlines()) or {}
        total, sampled, lost = (int(summary.get(key, 0)) for key in ("total", "sampled", "lost"))
        found.append((rate, total, sampled, lost))
    return found


def agent_delivery(
    storm: Callable[[], float], netns: str, cpu: str, warm_up: Callable[[], object] | None = None
) -> Delivery:
    """An agent session streaming `drops` of namespace `netns` (firewall rules named), read raw off its
    socket by this process while the storm runs (after `warm_up`, as in `deliver`)."""
    from tests.privileged.test_agent_harness import AgentProcess

    limits = {"max_duration": 300, "max_events": 100_000_000, "max_bytes": 1 << 40, "cpu_budget_percent": 100}
    with AgentProcess({"sessions": limits}, argv_prefix=["taskset", "-c", cpu]) as agent:
        agent.wait_ready()
        request = {
            "diagnostic": "drops",
            "filters": {"netns": netns},
            "duration": 120,
            "max_events": 100_000_000,
            "max_bytes": 1 << 40,
            "cpu_budget_percent": 100,
        }
        with agent.client.session(request) as stream:
            response = stream._response  # the raw chunked body: counting lines, not parsing them
            first = response.readline()
            assert first.startswith(b'{"type":"session_start"'), first[:200]
            counter = LineCounter(response)
            warm = 0
            if warm_up is not None:
                warm_up()
                _wait(lambda: counter.lines > 0, "agent warm-up lines")
                _wait_quiet(lambda: counter.last_at)
                warm = counter.lines
            cpu_before = cpu_seconds(agent.process.pid)
            started = time.monotonic()
            storm()
            _wait_quiet(lambda: counter.last_at)
            seconds = counter.last_at - started
            used = cpu_seconds(agent.process.pid) - cpu_before
            lines = counter.lines - warm
    return Delivery("agent session (rule names)", lines, max(seconds, 1e-9), cpu_seconds=used, warm=warm)


def main() -> int:
    """Delivery alone, without the rest of drops_storm.py: the storm lab, then each chosen consumer under
    a storm of --count drops; --profile also writes a cProfile of `drops --json > file`."""
    import argparse
    import os
    import shutil
    import sys
    import tempfile

    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo))
    from tests.netlab import Lab

    from bench.attach_time import use_compiled_bytecode
    from bench.harness import BPFTRACE_READY
    from bench.udp_storm import SENDER_CPU, TRACER_CPU, build_sender, storm

    choices = ("file", "pipe", "bpftrace-file", "bpftrace-pipe", "agent")
    parser = argparse.ArgumentParser(description="delivered drop events/s, unsampled")
    parser.add_argument("--count", type=int, default=1_000_000, help="drops per storm")
    parser.add_argument("--only", default=",".join(choices), help=f"comma-separated, of {', '.join(choices)}")
    parser.add_argument("--profile", metavar="PATH", help="also profile `drops --json > file` into PATH")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark loads BPF programs and builds network namespaces")
    from bench.harness import mount_tracefs_for_bpftrace

    mount_tracefs_for_bpftrace()
    wanted = args.only.split(",")
    lab = Lab()
    work = Path(tempfile.mkdtemp(prefix="netsleuth-delivery-"))
    use_compiled_bytecode(work)
    found: list[Delivery] = []
    try:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, ["198.18.0.1/24"], ["198.18.0.2/24"])
        a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "9", "-j", "DROP")
        sender = build_sender(work)

        def full_storm() -> float:
            return storm(a.argv, sender, "198.18.0.2", args.count)

        def warm_up() -> float:
            return storm(a.argv, sender, "198.18.0.2", WARM_UP_DROPS)

        ready_file = work / "ready"

        def ns_ready(_output: Path) -> bool:
            return ready_file.exists()

        def bt_ready(output: Path) -> bool:
            return b"ready" in output.read_bytes()[:64]

        json_argv = [sys.executable, "-m", "netsleuth", "drops", "--netns", a.name, "--json"]
        bt_argv = ["bpftrace", "-B", "line", "-e", BPFTRACE_READY + BPFTRACE_PRINTF]
        runs: list[tuple[str, str, list[str], bool, Callable[[Path], bool], int]] = [
            ("file", "netsleuth drops --json > file", json_argv, False, ns_ready, 0),
            ("pipe", "netsleuth drops --json | pipe", json_argv, True, ns_ready, 0),
            ("bpftrace-file", "bpftrace printf > file", bt_argv, False, bt_ready, 1),
            ("bpftrace-pipe", "bpftrace printf | pipe", bt_argv, True, bt_ready, 1),
        ]
        if args.profile:
            profiled = [sys.executable, "-m", "cProfile", "-o", args.profile, "-m", *json_argv[2:]]
            runs.insert(0, ("file", "profiled drops --json > file", profiled, False, ns_ready, 0))
        for key, name, argv, pipe, ready, header in runs:
            if key not in wanted:
                continue
            ready_file.unlink(missing_ok=True)
            extra = ["--ready-file", str(ready_file)] if argv[0] == sys.executable else []
            found.append(
                deliver(
                    name,
                    [*argv, *extra],
                    full_storm,
                    pipe=pipe,
                    ready=ready,
                    work=work,
                    cpu=TRACER_CPU,
                    header_lines=header,
                    warm_up=warm_up,
                )
            )
        if "agent" in wanted:
            found.append(agent_delivery(full_storm, a.name, TRACER_CPU, warm_up))
    finally:
        lab.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"delivered events/s, unsampled (storms of {args.count:,} drops, sender on CPU {SENDER_CPU}):")
    for item in found:
        accounting = (
            f"total {item.total:,} = {item.lines + item.warm:,}"
            f" + sampled {item.sampled:,} + lost {item.lost:,}"
            if item.total is not None and item.sampled is not None and item.lost is not None
            else ""
        )
        per_cpu = f"{item.per_cpu_second:11,.0f}" if item.per_cpu_second else f"{'-':>11}"
        print(
            f"{item.name:32} {item.lines:10,} {item.seconds:7.2f}s {item.rate:9,.0f}/s "
            f"{per_cpu}/CPU-s  {accounting}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
