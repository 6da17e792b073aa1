"""What every benchmark needs: tracers started and timed until attached, and bpf_stats per program."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.netlab import wait_for  # noqa: E402

__all__ = [
    "BPFTRACE_READY",
    "ProgramCost",
    "Tracer",
    "bpftrace_tracer",
    "mount_tracefs_for_bpftrace",
    "netsleuth_tracer",
    "print_rates",
    "program_cost",
    "program_stats",
]


def mount_tracefs_for_bpftrace() -> None:
    """bpftrace's tracepoint probes read tracefs, which a fresh VM may boot without: mount it as netsleuth
    itself would (netsleuth.kernel.tracefs) and say so."""
    from netsleuth.kernel.tracefs import ensure_tracefs

    state = ensure_tracefs()
    if state.note:
        print(f"bench: {state.note}", file=sys.stderr)
    elif state.events is None:
        print(f"bench: bpftrace's tracepoints will fail: {state.problem}", file=sys.stderr)


def program_stats(prefixes: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """name -> (run_cnt, run_time_ns) of loaded programs whose name starts with one of the prefixes (bpftool
    shows run time only while bpf_stats is on)."""
    output = subprocess.run(
        ["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True
    ).stdout
    found: dict[str, tuple[int, int]] = {}
    for prog in json.loads(output or "[]"):
        name = str(prog.get("name", ""))
        if name.startswith(prefixes):
            runs, spent = found.get(name, (0, 0))
            found[name] = (runs + int(prog.get("run_cnt", 0)), spent + int(prog.get("run_time_ns", 0)))
    return found


@dataclass(frozen=True)
class ProgramCost:
    """What the programs cost between two `program_stats` readings (taken while bpf_stats was on)."""

    runs: int
    ns: int
    ns_per_run_by_program: dict[str, float]

    @property
    def ns_per_run(self) -> float | None:
        return self.ns / self.runs if self.runs else None


def program_cost(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> ProgramCost:
    by_program = {}
    for name, (runs_after, spent_after) in after.items():
        runs_before, spent_before = before.get(name, (0, 0))
        if runs_after > runs_before:
            by_program[name] = (spent_after - spent_before) / (runs_after - runs_before)
    runs = sum(v[0] for v in after.values()) - sum(v[0] for v in before.values())
    spent = sum(v[1] for v in after.values()) - sum(v[1] for v in before.values())
    return ProgramCost(runs, spent, by_program)


def print_rates(rates: dict[str, list[float]], unit: str) -> None:
    """Each configuration's median rate against the untraced one's, and paired by round: each traced run
    against the untraced run just before it, so a slow spell of a shared machine moves both sides of a
    ratio."""
    base = statistics.median(rates["untraced"])
    for name, values in rates.items():
        median = statistics.median(values)
        paired = statistics.median(v / u for v, u in zip(values, rates["untraced"], strict=True))
        print(
            f"  {name:<14} {median:10.0f} {unit}   ratio vs untraced {median / base:.3f}"
            f"   paired by round {paired:.3f}"
        )


class Tracer:
    """A tracer process pinned to `cpu`, waited for until attached (timed), then stopped with SIGINT."""

    def __init__(self, argv: list[str], ready: Callable[[], bool], stdout_path: Path, cpu: str) -> None:
        self._stdout = stdout_path.open("w")
        started = time.monotonic()
        self.process = subprocess.Popen(
            ["taskset", "-c", cpu, *argv], stdout=self._stdout, stderr=subprocess.PIPE, text=True
        )
        wait_for(lambda: ready() or self.process.poll() is not None, 60, f"{argv[0]} to attach")
        if self.process.poll() is not None:
            raise RuntimeError(f"{argv} exited: {self.process.stderr.read() if self.process.stderr else ''}")
        self.attach_s = time.monotonic() - started

    def stop(self) -> str:
        self.process.send_signal(signal.SIGINT)
        _, stderr = self.process.communicate(timeout=300)
        self._stdout.close()
        return stderr


# Put first in a bpftrace program: BEGIN runs once every probe is attached, so "ready" says it is.
BPFTRACE_READY = 'BEGIN { printf("ready\\n"); } '


def netsleuth_tracer(argv: list[str], work: Path, stdout: str, cpu: str) -> Callable[[], Tracer]:
    """Starts `argv` (a netsleuth command with its options) as a Tracer, attached once its --ready-file
    exists, output to `work`/`stdout`."""

    def start() -> Tracer:
        ready = work / "ready"
        ready.unlink(missing_ok=True)
        return Tracer([*argv, "--ready-file", str(ready)], ready.exists, work / stdout, cpu)

    return start


def bpftrace_tracer(program: str, work: Path, stdout: str, cpu: str) -> Callable[[], Tracer]:
    """Starts bpftrace running `program` (which prints "ready" in BEGIN: BPFTRACE_READY) as a Tracer, its
    output line-buffered to `work`/`stdout`."""

    def start() -> Tracer:
        out = work / stdout
        out.write_text("")
        argv = ["bpftrace", "-B", "line", "-e", program]
        return Tracer(argv, lambda: "ready" in out.read_text().splitlines(), out, cpu)

    return start
