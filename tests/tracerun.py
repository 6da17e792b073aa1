"""Run a netsleuth tracing command in the background the way a user would, for end-to-end tests.

The command writes a ready file once attached (--ready-file); tests wait for it, make traffic, wait for the
records they expect, then stop it with SIGINT and read its complete output. No fixed sleeps.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.netlab import wait_for
from tests.record_check import check_records

__all__ = ["TraceRun", "bpftool_netsleuth_programs", "netsleuth_argv", "programs_held_by"]


def netsleuth_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "netsleuth", *args]


class TraceRun:
    def __init__(self, *args: str, json_output: bool = True) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="netsleuth-test-")
        self.ready = Path(self._dir.name) / "ready"
        self.stdout_path = Path(self._dir.name) / "stdout"
        self.stderr_path = Path(self._dir.name) / "stderr"
        argv = netsleuth_argv(*args, "--ready-file", str(self.ready))
        self.json_output = json_output or "--json" in args
        if json_output and "--json" not in args:
            argv.append("--json")
        self._stdout = self.stdout_path.open("w")
        self._stderr = self.stderr_path.open("w")
        self.process = subprocess.Popen(argv, stdout=self._stdout, stderr=self._stderr)
        self.returncode: int | None = None

    def wait_ready(self, timeout: float = 20.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"netsleuth exited early ({self.process.returncode}): {self.stderr()}")
            return self.ready.exists()

        wait_for(ready, timeout, "netsleuth to attach")

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def records(self) -> list[dict[str, Any]]:
        lines = self.stdout().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def drops(self) -> list[dict[str, Any]]:
        return [record for record in self.records() if record.get("type") == "drop"]

    def wait_records(self, predicate: Any, count: int = 1, timeout: float = 20.0) -> None:
        def enough() -> bool:
            try:
                return sum(1 for record in self.records() if predicate(record)) >= count
            except json.JSONDecodeError:
                return False  # a line being written

        wait_for(enough, timeout, f"{count} matching record(s); stderr: {self.stderr()[-500:]}")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        self.returncode = self.process.wait(timeout)
        self._stdout.close()
        self._stderr.close()
        self._check_schema()
        return self.returncode

    def _check_schema(self) -> None:
        if self.returncode == 0 and self.json_output:
            check_records(self.records())

    def finish(self, timeout: float = 60.0) -> int:
        """Wait for a run with --duration to end by itself."""
        self.returncode = self.process.wait(timeout)
        self._stdout.close()
        self._stderr.close()
        self._check_schema()
        return self.returncode

    def summary(self) -> dict[str, Any]:
        summaries = [record for record in self.records() if record.get("type") == "summary"]
        assert summaries, f"no summary in output; stderr: {self.stderr()}"
        return summaries[-1]

    def __enter__(self) -> TraceRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._stdout.close()
        self._stderr.close()
        self._dir.cleanup()


def diagnose_verdicts(
    *args: str, traffic: Callable[[], object], duration: float = 4.0, attach_timeout: float = 20.0
) -> list[dict[str, Any]]:
    """`netsleuth diagnose ARGS --duration D --json`: `traffic` sent once it is attached, the run left to end
    by itself (exit 0, every record checked against its schema, a summary last), its verdicts returned."""
    with TraceRun("diagnose", *args, "--duration", str(duration)) as run:
        run.wait_ready(attach_timeout)
        traffic()
        assert run.finish() == 0, run.stderr()
        records = run.records()
    assert records[-1]["type"] == "summary"
    return [record for record in records if record["type"] == "verdict"]


def bpftool_netsleuth_programs(prefix: str = "drops_") -> list[dict[str, Any]]:
    """Programs currently loaded whose name starts with `prefix` (kernel names are cut at 15 chars)."""
    output = subprocess.run(
        ["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True
    ).stdout
    return [prog for prog in json.loads(output or "[]") if str(prog.get("name", "")).startswith(prefix)]


def programs_held_by(pid: int) -> set[int]:
    """The ids of the BPF programs a process holds open (its fds' fdinfo say `prog_id`): its own, whatever
    other tracers run on the machine at the same time."""
    held = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            text = info.read_text()
        except OSError:
            continue  # closed meanwhile
        for line in text.splitlines():
            if line.startswith("prog_id:"):
                held.add(int(line.split()[1]))
    return held
