"""Attach time: from exec to "attached", `netsleuth drops --summary` against bpftrace on the same tracepoint.

Two measurements, both from outside the process:

- as a user sees it (`measure_user_attach`): `netsleuth drops --summary --ready-file F`, run as the installed
  console script, from exec until F exists, against
  `bpftrace -e 'tracepoint:skb:kfree_skb { @[args->reason] = count(); } BEGIN { printf("ready\n"); }'` until
  its standard output (a pipe) says `ready`; neither pinned, neither filtered, alternately, medians;
- the narrower, pinned one (`measure_attach`), below.

In the narrower one netsleuth says it is attached by creating its --ready-file; bpftrace by printing
"ready" in BEGIN, which it runs once every probe is attached. The two are started alternately (pairs),
each pinned to the same CPU, and their readiness polled every millisecond, so a noisy, shared machine slows
both alike; medians and the median of the per-pair ratios are reported, for the wall time and for the time
each process was on the CPU by then (which leaves out waiting behind other work on a busy machine).

    python bench/attach_time.py [--rounds N] [--baseline SRC]      (also part of bench/drops_storm.py)

--baseline SRC adds a third contender in the same rounds: netsleuth run from another checkout's source tree
(e.g. `git worktree add /tmp/before <commit>` and SRC=/tmp/before/src), for before/after figures that the
machine's drift cannot bias.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
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

__all__ = [
    "AttachTimes",
    "UserAttach",
    "measure_attach",
    "measure_user_attach",
    "netsleuth_command",
    "use_compiled_bytecode",
]

# Exactly the user's comparison (issue 22): every drop counted by reason, BEGIN says when it is attached.
BPFTRACE_USER = 'tracepoint:skb:kfree_skb { @[args->reason] = count(); } BEGIN { printf("ready\\n"); }'
BPFTRACE_COUNT = (
    'BEGIN { printf("ready\\n"); } '
    "tracepoint:skb:kfree_skb /args->reason != 1/ { @[args->reason] = count(); }"
)


@dataclass
class AttachTimes:
    """Per round, exec -> attached: wall seconds, and the CPU seconds the process and its children had used
    by then (a cgroup's cpu.stat, read when its readiness is seen). On a shared machine the wall time also
    holds the time spent waiting for the CPU behind other work; the CPU time does not."""

    netsleuth: list[float]
    bpftrace: list[float]
    baseline: list[float] = field(default_factory=list)  # --baseline's netsleuth, same rounds
    netsleuth_cpu: list[float] = field(default_factory=list)
    bpftrace_cpu: list[float] = field(default_factory=list)
    baseline_cpu: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return _ratios(self.netsleuth, self.bpftrace)

    def lines(self) -> list[str]:
        lines = [f"attach time (exec -> attached), median of {len(self.netsleuth)} rounds on one CPU:"]
        for title, ours, theirs, before in (
            ("wall", self.netsleuth, self.bpftrace, self.baseline),
            ("on-CPU", self.netsleuth_cpu, self.bpftrace_cpu, self.baseline_cpu),
        ):
            if not ours:
                continue
            lines += [
                f" {title}:",
                f"  netsleuth drops --summary  {_median_min(ours)}",
                f"  bpftrace count()           {_median_min(theirs)}",
                f"  netsleuth / bpftrace       {_ratio_line(ours, theirs)}; target < 1",
            ]
            if before:
                lines += [
                    f"  baseline netsleuth         {_median_min(before)}",
                    f"  baseline / bpftrace        {_ratio_line(before, theirs)}",
                    f"  netsleuth / baseline       {_ratio_line(ours, before)}",
                ]
        return lines


def _median_min(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s   (min {min(values):.3f})"


def _ratio_line(ours: list[float], theirs: list[float]) -> str:
    return (
        f"{statistics.median(ours) / statistics.median(theirs):.3f}  "
        f"(median of pair ratios {statistics.median(_ratios(ours, theirs)):.3f})"
    )


def _ratios(ours: list[float], theirs: list[float]) -> list[float]:
    return [a / b for a, b in zip(ours, theirs, strict=True)]


class _CgroupCpu:
    """The CPU time of a process and of everything it starts, ended or not (bpftrace runs `clang -Wp,-v`
    and worker threads on its way to attaching): a cgroup v2 group of its own, read from its cpu.stat.
    None from `create` when there is no writable cgroup v2 hierarchy; then only wall times are shown."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str) -> _CgroupCpu | None:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                path = Path(fields[1]) / name
                try:
                    path.mkdir()
                except OSError:
                    return None
                return cls(path)
        return None

    def enter(self) -> None:
        """Called in the child between fork and exec: "0" is the writing process."""
        (self.path / "cgroup.procs").write_text("0")

    def seconds(self) -> float:
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise RuntimeError(f"no usage_usec in {self.path}/cpu.stat")

    def remove(self) -> None:
        # Empty once the last timed process has been waited for; a moment later on a slow machine.
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)


def use_compiled_bytecode(directory: Path, *other_sources: Path) -> None:
    """Run netsleuth as an installed package runs: from compiled bytecode. pip compiles .pyc files at
    install; a checkout run with PYTHONDONTWRITEBYTECODE=1 (as in CI here) would compile every module on
    every start instead, which is not what a user pays. The bytecode goes to its own directory
    (PYTHONPYCACHEPREFIX), not into the source tree; child processes inherit the setting."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(directory / "pycache")
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "src" / "netsleuth")]
        + [str(source / "netsleuth") for source in other_sources],
        check=True,
        env=os.environ,
    )


def _time_until(
    argv: list[str],
    ready: Callable[[], bool],
    stdout: Path,
    cpu: _CgroupCpu | None,
    env: dict[str, str] | None = None,
) -> tuple[float, float | None]:
    """(wall, on-CPU) seconds from exec to `ready`; on-CPU is None without a cgroup to measure it."""
    with stdout.open("wb") as out:
        used_before = cpu.seconds() if cpu is not None else 0.0
        started = time.monotonic()
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=cpu.enter if cpu is not None else None,  # the bench runs no threads
        )
        deadline = started + 60
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                _, err = process.communicate()
                raise RuntimeError(f"{argv} did not attach: {err.decode()[-300:]}")
            time.sleep(0.001)
        elapsed = time.monotonic() - started
        on_cpu = cpu.seconds() - used_before if cpu is not None else None
        _stop(process)
    return elapsed, on_cpu


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as a user stops either tool. bpftrace can miss a SIGINT that arrives right after its BEGIN
    probe ran (it then waits forever), so one that has not ended after a few seconds gets another."""
    for _ in range(3):
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
    process.kill()
    process.communicate()


def measure_attach(
    rounds: int,
    cpu: str,
    netns: str | None = None,
    work: Path | None = None,
    baseline: Path | None = None,
) -> AttachTimes:
    """`rounds` rounds of each contender; `netns` narrows netsleuth to one namespace (as the storm benchmark
    runs it); `baseline`, a source tree, adds netsleuth run from there (PYTHONPATH) to every round."""
    directory = work or Path(tempfile.mkdtemp(prefix="netsleuth-attach-"))
    ready_file = directory / "attach-ready"
    bt_out = directory / "attach-bt.out"
    netsleuth = [sys.executable, "-m", "netsleuth", "drops", "--summary", "--ready-file", str(ready_file)]
    if netns:
        netsleuth += ["--netns", netns]
    bpftrace = ["bpftrace", "-B", "line", "-e", BPFTRACE_COUNT]

    def bt_ready() -> bool:
        return bt_out.exists() and b"ready" in bt_out.read_bytes()

    meter = _CgroupCpu.create(f"netsleuth-attach-{os.getpid()}")

    def run_netsleuth(env: dict[str, str] | None = None) -> tuple[float, float | None]:
        ready_file.unlink(missing_ok=True)
        argv = ["taskset", "-c", cpu, *netsleuth]
        return _time_until(argv, ready_file.exists, directory / "attach-ns.out", meter, env)

    def run_bpftrace() -> tuple[float, float | None]:
        bt_out.unlink(missing_ok=True)
        return _time_until(["taskset", "-c", cpu, *bpftrace], bt_ready, bt_out, meter)

    times = AttachTimes([], [])
    contenders: list[_Contender] = [
        (run_netsleuth, times.netsleuth, times.netsleuth_cpu),
        (run_bpftrace, times.bpftrace, times.bpftrace_cpu),
    ]
    if baseline is not None:
        env = dict(os.environ, PYTHONPATH=str(baseline))
        contenders.append((lambda: run_netsleuth(env), times.baseline, times.baseline_cpu))
    _rotate(contenders, rounds, meter, None if work else directory)
    return times


_Contender = tuple[Callable[[], tuple[float, float | None]], list[float], list[float]]


def _rotate(
    contenders: list[_Contender], rounds: int, meter: _CgroupCpu | None, scratch: Path | None
) -> None:
    """Run every contender once per round, appending its (wall, on-CPU) seconds to its two lists; who goes
    first rotates, so none always runs right after another's exit. One round first, not counted: files in
    the page cache and bytecode written for all alike. Then the meter's cgroup and `scratch` are removed."""
    try:
        for run, _, _ in contenders:
            run()
        for index in range(rounds):
            shift = index % len(contenders)
            for run, walls, cpus in contenders[shift:] + contenders[:shift]:
                wall, on_cpu = run()
                walls.append(wall)
                if on_cpu is not None:
                    cpus.append(on_cpu)
    finally:
        if meter is not None:
            meter.remove()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def netsleuth_command() -> list[str]:
    """What a user runs: the `netsleuth` console script installed beside this interpreter (pip's entry point,
    the same as a package install), else `python -m netsleuth`."""
    script = Path(sys.executable).parent / "netsleuth"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "netsleuth"]


@dataclass
class UserAttach:
    """Exec -> attached as a user sees it, per round: wall seconds, and the CPU seconds the process (and what
    it started) had used by then, which a shared machine's waits for the CPU do not inflate."""

    netsleuth: list[float] = field(default_factory=list)
    bpftrace: list[float] = field(default_factory=list)
    netsleuth_cpu: list[float] = field(default_factory=list)
    bpftrace_cpu: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)  # --baseline's netsleuth, same rounds
    baseline_cpu: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """netsleuth's median wall time over bpftrace's (the figure the issue asks under 1)."""
        return statistics.median(self.netsleuth) / statistics.median(self.bpftrace)

    def lines(self) -> list[str]:
        lines = [
            f"attach as a user sees it (exec -> attached, not pinned), median of {len(self.netsleuth)} "
            "alternating runs:",
            f"  netsleuth drops --summary --ready-file F   {_median_range(self.netsleuth)}",
            f"  bpftrace count() by reason, BEGIN ready    {_median_range(self.bpftrace)}",
            f"  netsleuth / bpftrace                       {_ratio_line(self.netsleuth, self.bpftrace)}; "
            "target < 1",
        ]
        if self.baseline:
            lines += [
                f"  baseline netsleuth                         {_median_range(self.baseline)}",
                f"  netsleuth / baseline                       {_ratio_line(self.netsleuth, self.baseline)}",
            ]
        if self.netsleuth_cpu and self.bpftrace_cpu:
            lines += [
                " on-CPU by then (the process and its children):",
                f"  netsleuth                                  {_median_range(self.netsleuth_cpu)}",
                f"  bpftrace                                   {_median_range(self.bpftrace_cpu)}",
                f"  netsleuth / bpftrace                       "
                f"{_ratio_line(self.netsleuth_cpu, self.bpftrace_cpu)}",
            ]
            if self.baseline_cpu:
                lines += [
                    f"  baseline netsleuth                         {_median_range(self.baseline_cpu)}",
                    f"  netsleuth / baseline                       "
                    f"{_ratio_line(self.netsleuth_cpu, self.baseline_cpu)}",
                ]
        return lines


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s   ({min(values):.3f}-{max(values):.3f})"


def _wait_for_line(process: subprocess.Popen[bytes], word: bytes, deadline: float) -> bool:
    """Read the process's standard output (a pipe) until a line is `word`; False if it ended or the deadline
    passed first. select() wakes on the write itself: no polling delay on this side."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    seen = b""
    while time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return False
        seen += chunk
        if word in seen.splitlines():
            return True
    return False


def _user_run(
    argv: list[str], ready_file: Path | None, cpu: _CgroupCpu | None, env: dict[str, str] | None = None
) -> tuple[float, float | None]:
    """(wall, on-CPU) seconds from exec to attached: `ready_file` exists (polled every millisecond), or,
    without one, the process prints `ready`."""
    used_before = cpu.seconds() if cpu is not None else 0.0
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE if ready_file is None else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=cpu.enter if cpu is not None else None,  # the bench runs no threads
    )
    deadline = started + 60
    if ready_file is None:
        attached = _wait_for_line(process, b"ready", deadline)
    else:
        while not (attached := ready_file.exists()) and process.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.001)
        attached = ready_file.exists()
    elapsed = time.monotonic() - started
    on_cpu = cpu.seconds() - used_before if cpu is not None else None
    if not attached:
        process.kill()
        _, err = process.communicate()
        raise RuntimeError(f"{argv} did not attach: {err.decode()[-300:]}")
    _stop(process)
    return elapsed, on_cpu


def measure_user_attach(rounds: int, work: Path | None = None, baseline: Path | None = None) -> UserAttach:
    """`rounds` rounds, netsleuth and bpftrace in turn (who goes first rotates), after one not counted (files
    in the page cache for all); `baseline`, a source tree, adds netsleuth run from there (PYTHONPATH)."""
    directory = work or Path(tempfile.mkdtemp(prefix="netsleuth-attach-"))
    ready_file = directory / "user-ready"
    netsleuth = [*netsleuth_command(), "drops", "--summary", "--ready-file", str(ready_file)]
    bpftrace = ["bpftrace", "-e", BPFTRACE_USER]
    meter = _CgroupCpu.create(f"netsleuth-user-attach-{os.getpid()}")
    times = UserAttach()

    def run_netsleuth() -> tuple[float, float | None]:
        ready_file.unlink(missing_ok=True)
        return _user_run(netsleuth, ready_file, meter)

    def run_bpftrace() -> tuple[float, float | None]:
        return _user_run(bpftrace, None, meter)

    contenders: list[_Contender] = [
        (run_netsleuth, times.netsleuth, times.netsleuth_cpu),
        (run_bpftrace, times.bpftrace, times.bpftrace_cpu),
    ]
    if baseline is not None:
        env = dict(os.environ, PYTHONPATH=str(baseline))

        def run_baseline() -> tuple[float, float | None]:
            ready_file.unlink(missing_ok=True)
            return _user_run(netsleuth, ready_file, meter, env)

        contenders.append((run_baseline, times.baseline, times.baseline_cpu))
    _rotate(contenders, rounds, meter, None if work else directory)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cpu", default="0")
    parser.add_argument(
        "--baseline", type=Path, metavar="SRC", help="also time netsleuth from this source tree (before)"
    )
    parser.add_argument(
        "--only",
        choices=("user", "pinned"),
        help="only the user's measurement (not pinned, console script) or only the pinned one",
    )
    args = parser.parse_args()
    if args.baseline is not None and not (args.baseline / "netsleuth" / "__main__.py").is_file():
        sys.exit(f"--baseline {args.baseline}: not a source tree with netsleuth/ in it")
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark loads BPF programs")
    from bench.harness import mount_tracefs_for_bpftrace

    mount_tracefs_for_bpftrace()
    if not shutil.which("bpftrace"):
        sys.exit("bpftrace is needed for the comparison: apt install bpftrace")
    with tempfile.TemporaryDirectory(prefix="netsleuth-attach-") as directory:
        use_compiled_bytecode(Path(directory), *([args.baseline] if args.baseline else []))
        if args.only != "pinned":
            user = measure_user_attach(args.rounds, Path(directory), baseline=args.baseline)
            print("\n".join(user.lines()))
        if args.only != "user":
            print("\n".join(measure_attach(args.rounds, args.cpu, baseline=args.baseline).lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
