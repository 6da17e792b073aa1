"""Agent start: from exec of `netsleuth agent` to its --ready-file (attached and serving), and what it
imported on the way, in this tree and another (`--baseline SRC`), in the same run.

1. Time: rounds alternating between the trees (who goes first rotates), each start's wall seconds and the CPU
   seconds it had used by then (its own cgroup v2 group, which a shared machine's waits for the CPU do not
   inflate); medians. Both run from compiled bytecode, as an installed package does (bench/attach_time.py).
2. Imports: one more start of each under `python -X importtime`, until ready: the modules imported and the
   sum of their own import times, and which diagnostics' session or view modules were imported (none should
   be before a session opens).

    python bench/agent_start.py [--rounds 9] [--baseline SRC]      (SRC: a tree's src/, e.g. before a change)
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.attach_time import _CgroupCpu, _rotate, _time_until, use_compiled_bytecode  # noqa: E402

# The modules a diagnostic needs only once a session opens (its kernel side, its text view).
_SESSION_PARTS = (".session", ".view", ".program", ".enrich", ".batch", ".decode")


@dataclass
class Imports:
    """One start under -X importtime: every module it imported by the time it was ready."""

    modules: list[tuple[str, int]] = field(default_factory=list)  # (name, own microseconds)

    @property
    def own_us(self) -> int:
        return sum(us for _, us in self.modules)

    @property
    def session_modules(self) -> list[str]:
        return sorted(
            name
            for name, _ in self.modules
            if name.startswith(("netsleuth.diagnostics.", "netsleuth.diagnose"))
            and name.endswith(_SESSION_PARTS)
        )

    def line(self, label: str) -> str:
        ours = sum(1 for name, _ in self.modules if name.startswith("netsleuth"))
        return (
            f"{label:<9} imports until ready: {len(self.modules)} modules ({ours} netsleuth), "
            f"{self.own_us / 1000:.0f} ms of import time; diagnostics' session/view modules: "
            f"{len(self.session_modules)} {self.session_modules}"
        )


def _agent_argv(work: Path, ready: Path, importtime: bool = False) -> list[str]:
    config = work / "agent.toml"
    if not config.exists():
        config.write_text(f'[agent]\nlisten = "127.0.0.1:0"\nsocket = "{work / "agent.sock"}"\n')
    python = [sys.executable, *(["-X", "importtime"] if importtime else [])]
    return [*python, "-m", "netsleuth", "agent", "--config", str(config), "--ready-file", str(ready)]


def _env(source: Path | None) -> dict[str, str] | None:
    return dict(os.environ, PYTHONPATH=str(source)) if source is not None else None


def measure_imports(work: Path, source: Path | None) -> Imports:
    """One start with -X importtime (its report on stderr, to a file: it is larger than a pipe holds)."""
    ready = work / "ready-importtime"
    ready.unlink(missing_ok=True)
    report = work / "importtime.txt"
    with report.open("wb") as err:
        process = subprocess.Popen(
            _agent_argv(work, ready, importtime=True), stdout=subprocess.DEVNULL, stderr=err, env=_env(source)
        )
        deadline = time.monotonic() + 120
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise RuntimeError(f"the agent did not start: {report.read_text()[-500:]}")
            time.sleep(0.005)
        process.terminate()
        process.wait(60)
    imports = Imports()
    for line in report.read_text().splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        own, _, name = line.removeprefix("import time:").split("|")
        if own.strip().isdigit():
            imports.modules.append((name.strip(), int(own)))
    return imports


def _median_line(label: str, walls: list[float], cpus: list[float]) -> str:
    cpu = f"; on CPU {statistics.median(cpus):.3f} s (min {min(cpus):.3f})" if cpus else ""
    return f"{label:<9} exec -> ready: {statistics.median(walls):.3f} s (min {min(walls):.3f}){cpu}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--baseline", type=Path, metavar="SRC", help="also start the agent from this source tree"
    )
    args = parser.parse_args()
    if args.baseline is not None and not (args.baseline / "netsleuth" / "__main__.py").is_file():
        sys.exit(f"--baseline {args.baseline}: not a source tree with netsleuth/ in it")
    if os.geteuid() != 0:
        sys.exit("run as root: the agent loads BPF programs")
    with tempfile.TemporaryDirectory(prefix="netsleuth-agent-start-") as directory:
        work = Path(directory)
        use_compiled_bytecode(work, *([args.baseline] if args.baseline else []))
        trees: list[tuple[str, Path | None]] = [("this", None)]
        if args.baseline is not None:
            trees.append(("baseline", args.baseline))
        meter = _CgroupCpu.create(f"netsleuth-agent-start-{os.getpid()}")
        times: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label, _ in trees}

        def starter(label: str, source: Path | None) -> tuple[float, float | None]:
            ready = work / f"ready-{label}"
            ready.unlink(missing_ok=True)
            return _time_until(
                _agent_argv(work, ready), ready.exists, work / "agent.out", meter, _env(source)
            )

        _rotate(
            [(functools.partial(starter, label, source), *times[label]) for label, source in trees],
            args.rounds,
            meter,
            None,
        )
        for label, _ in trees:
            print(_median_line(label, *times[label]))
        for label, source in trees:
            print(measure_imports(work, source).line(label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
