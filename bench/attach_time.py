"""Attach time: from exec to "attached", `netsleuth drops --summary` against bpftrace on the same tracepoint.

netsleuth says it is attached by creating its --ready-file; bpftrace by printing "ready" in BEGIN, which it
runs once every probe is attached. The two are started alternately (pairs), each pinned to the same CPU,
and their readiness polled every millisecond, so a noisy, shared machine slows both alike; medians and the
median of the per-pair ratios are reported.

    python bench/attach_time.py [--rounds N] [--baseline SRC]      (also part of bench/drops_storm.py)

--baseline SRC adds a third contender in the same rounds: netsleuth run from another checkout's source tree
(e.g. `git worktree add /tmp/before <commit>` and SRC=/tmp/before/src), for before/after figures that the
machine's drift cannot bias.
"""

from __future__ import annotations

import argparse
import os
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

__all__ = ["AttachTimes", "measure_attach", "use_compiled_bytecode"]

BPFTRACE_COUNT = (
    'BEGIN { printf("ready\\n"); } '
    "tracepoint:skb:kfree_skb /args->reason != 1/ { @[args->reason] = count(); }"
)


@dataclass
class AttachTimes:
    netsleuth: list[float]
    bpftrace: list[float]
    baseline: list[float] = field(default_factory=list)  # --baseline's netsleuth, same rounds

    @property
    def ratios(self) -> list[float]:
        return _ratios(self.netsleuth, self.bpftrace)

    def lines(self) -> list[str]:
        ours, theirs = statistics.median(self.netsleuth), statistics.median(self.bpftrace)
        lines = [
            f"attach time (exec -> attached), median of {len(self.netsleuth)} rounds on one CPU:",
            f"  netsleuth drops --summary  {ours:.3f} s   (min {min(self.netsleuth):.3f})",
            f"  bpftrace count()           {theirs:.3f} s   (min {min(self.bpftrace):.3f})",
            f"  netsleuth / bpftrace       {ours / theirs:.3f}  (median of pair ratios "
            f"{statistics.median(self.ratios):.3f}; target < 1)",
        ]
        if self.baseline:
            before = statistics.median(self.baseline)
            lines += [
                f"  baseline netsleuth         {before:.3f} s   (min {min(self.baseline):.3f})",
                f"  baseline / bpftrace        {before / theirs:.3f}  (median of pair ratios "
                f"{statistics.median(_ratios(self.baseline, self.bpftrace)):.3f})",
                f"  netsleuth / baseline       {ours / before:.3f}  (median of pair ratios "
                f"{statistics.median(_ratios(self.netsleuth, self.baseline)):.3f})",
            ]
        return lines


def _ratios(ours: list[float], theirs: list[float]) -> list[float]:
    return [a / b for a, b in zip(ours, theirs, strict=True)]


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
    argv: list[str], ready: Callable[[], bool], stdout: Path, env: dict[str, str] | None = None
) -> float:
    with stdout.open("wb") as out:
        started = time.monotonic()
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, env=env)
        deadline = started + 60
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                _, err = process.communicate()
                raise RuntimeError(f"{argv} did not attach: {err.decode()[-300:]}")
            time.sleep(0.001)
        elapsed = time.monotonic() - started
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    return elapsed


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

    def run_netsleuth(env: dict[str, str] | None = None) -> float:
        ready_file.unlink(missing_ok=True)
        argv = ["taskset", "-c", cpu, *netsleuth]
        return _time_until(argv, ready_file.exists, directory / "attach-ns.out", env)

    def run_bpftrace() -> float:
        bt_out.unlink(missing_ok=True)
        return _time_until(["taskset", "-c", cpu, *bpftrace], bt_ready, bt_out)

    contenders: list[tuple[Callable[[], float], list[float]]] = []
    times = AttachTimes([], [])
    contenders.append((run_netsleuth, times.netsleuth))
    contenders.append((run_bpftrace, times.bpftrace))
    if baseline is not None:
        env = dict(os.environ, PYTHONPATH=str(baseline))
        contenders.append((lambda: run_netsleuth(env), times.baseline))
    try:
        # One round first, not counted: files in the page cache and bytecode written for all alike.
        for run, _ in contenders:
            run()
        for index in range(rounds):
            # Rotate who goes first, so none always runs right after another's exit.
            shift = index % len(contenders)
            for run, samples in contenders[shift:] + contenders[:shift]:
                samples.append(run())
    finally:
        if work is None:
            shutil.rmtree(directory, ignore_errors=True)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cpu", default="0")
    parser.add_argument(
        "--baseline", type=Path, metavar="SRC", help="also time netsleuth from this source tree (before)"
    )
    args = parser.parse_args()
    if args.baseline is not None and not (args.baseline / "netsleuth" / "__main__.py").is_file():
        sys.exit(f"--baseline {args.baseline}: not a source tree with netsleuth/ in it")
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark loads BPF programs")
    if not shutil.which("bpftrace"):
        sys.exit("bpftrace is needed for the comparison: apt install bpftrace")
    with tempfile.TemporaryDirectory(prefix="netsleuth-attach-") as directory:
        use_compiled_bytecode(Path(directory), *([args.baseline] if args.baseline else []))
        print("\n".join(measure_attach(args.rounds, args.cpu, baseline=args.baseline).lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
