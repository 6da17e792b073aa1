"""What every benchmark needs: tracers started and timed until attached, and bpf_stats per program."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.netlab import wait_for  # noqa: E402

__all__ = ["Tracer", "program_stats"]


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
