"""Running `netsleuth agent` the way systemd would (a separate process, a config file, signals), the helpers
the other agent tests share, and the agent's start/stop contract: ready once attached, SIGTERM ends sessions
with their summary and detaches, SIGKILL leaves nothing attached.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from netsleuth.agent.client import AgentClient
from tests.netlab import wait_for

__all__ = ["AgentProcess", "bpf_object_ids", "loaded_ids", "render_toml", "wait_released"]


def render_toml(config: dict[str, Any]) -> str:
    """Nested dicts of scalars -> TOML (enough for the agent's config)."""
    lines: list[str] = []

    def table(prefix: str, values: dict[str, Any]) -> None:
        scalars = {key: value for key, value in values.items() if not isinstance(value, dict)}
        if prefix and scalars:
            lines.append(f"[{prefix}]")
        for key, value in scalars.items():
            lines.append(f"{key} = {json.dumps(value)}")
        for key, value in values.items():
            if isinstance(value, dict):
                table(f"{prefix}.{key}" if prefix else key, value)

    table("", config)
    return "\n".join(lines) + "\n"


def bpf_object_ids(pid: int) -> tuple[set[int], set[int]]:
    """(program ids, link ids) a process holds, from its fds' fdinfo: robust against other BPF users."""
    programs: set[int] = set()
    links: set[int] = set()
    fdinfo = Path(f"/proc/{pid}/fdinfo")
    for entry in fdinfo.iterdir():
        try:
            text = entry.read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if "link_id" in fields:
            links.add(int(fields["link_id"]))
        elif "prog_id" in fields:
            programs.add(int(fields["prog_id"]))
    return programs, links


def loaded_ids() -> tuple[set[int], set[int]]:
    """Every program and link id the kernel has right now."""

    def ids(kind: str) -> set[int]:
        # bpftool lists the ids, then opens each: one freed in between (another process's, on a shared
        # machine) makes it fail ("can't get link by id"). Listed again, a few times.
        for _attempt in range(5):
            output = subprocess.run(["bpftool", "-j", kind, "show"], capture_output=True, text=True)
            if output.returncode == 0:
                return {int(item["id"]) for item in json.loads(output.stdout or "[]")}
        raise RuntimeError(f"bpftool {kind} show failed 5 times: {output.stderr.strip()}")

    return ids("prog"), ids("link")


def wait_released(programs: set[int], links: set[int]) -> None:
    """The kernel frees programs and links with their last fd (after an RCU grace period): nothing of
    ours may be pinned or otherwise kept alive."""

    def released() -> bool:
        loaded_programs, loaded_links = loaded_ids()
        return not programs & loaded_programs and not links & loaded_links

    wait_for(released, 10, f"programs {sorted(programs)} and links {sorted(links)} to be released")


class AgentProcess:
    """`python -m netsleuth agent --config FILE --ready-file PATH` in the background."""

    def __init__(self, config: dict[str, Any] | None = None, argv_prefix: list[str] | None = None) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="netsleuth-agent-")
        self.dir = Path(self._dir.name)
        self.socket = self.dir / "agent.sock"
        base: dict[str, Any] = {"agent": {"listen": "127.0.0.1:0", "socket": str(self.socket)}}
        for section, values in (config or {}).items():
            if isinstance(values, dict):
                merged = dict(base.get(section, {}))
                merged.update(values)
                base[section] = merged
            else:
                base[section] = values
        self.config_path = self.dir / "agent.toml"
        self.config_path.write_text(render_toml(base))
        self.ready_path = self.dir / "ready.json"
        self.stderr_path = self.dir / "stderr"
        self._stderr = self.stderr_path.open("w")
        argv = [
            *(argv_prefix or []),
            sys.executable,
            "-m",
            "netsleuth",
            "agent",
            "--config",
            str(self.config_path),
            "--ready-file",
            str(self.ready_path),
        ]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self._stderr)
        self.ready: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the agent exited early ({self.process.returncode}): {self.stderr()}")
            return self.ready_path.exists() and self.ready_path.read_text().endswith("\n")

        wait_for(ready, timeout, "the agent to attach and serve")
        self.ready = json.loads(self.ready_path.read_text())

    @property
    def port(self) -> int:
        return int(str(self.ready["listen"]).rsplit(":", 1)[1])

    @property
    def client(self) -> AgentClient:
        return AgentClient.unix(str(self.socket), timeout=60)

    @property
    def http(self) -> AgentClient:
        return AgentClient.tcp("127.0.0.1", self.port, timeout=60)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, body = self.http.get("/metrics")
        assert status == 200
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
        }

    def metric(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, tuple(sorted(labels.items()))))

    def bpf_ids(self) -> tuple[set[int], set[int]]:
        return bpf_object_ids(self.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def __enter__(self) -> AgentProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._stderr.close()
        self._dir.cleanup()


def test_ready_only_once_attached_and_serving() -> None:
    with AgentProcess() as agent:
        agent.wait_ready()
        assert agent.ready["attach"] in ("tp_btf", "raw_tp") and agent.ready["pid"] == agent.pid
        assert agent.http.get("/readyz") == (200, b"ready\n")
        assert agent.http.get("/healthz") == (200, b"ok\n")
        programs, links = agent.bpf_ids()
        assert len(programs) == 1 and len(links) == 1  # the exporter's summary attachment, nothing else
        assert (
            agent.metric(
                "netsleuth_bpf_programs_attached", owner="exporter", program=f"drops_{agent.ready['attach']}"
            )
            == 1
        )
        assert oct(agent.socket.stat().st_mode & 0o777) == oct(0o660)


def test_sigterm_ends_sessions_with_their_summary_and_detaches() -> None:
    with AgentProcess() as agent:
        agent.wait_ready()
        stream = agent.client.session({"diagnostic": "drops", "duration": 120})
        lines = iter(stream)
        assert next(lines)["type"] == "session_start"
        programs, links = agent.bpf_ids()
        assert len(programs) == 2 and len(links) == 2
        started = time.monotonic()
        agent.process.send_signal(signal.SIGTERM)
        rest = list(lines)
        stream.close()
        assert agent.process.wait(30) == 0
        assert time.monotonic() - started < 10
        assert [record["type"] for record in rest[-2:]] == ["summary", "session_end"]
        assert rest[-1]["reason"] == "agent_stopping"
        assert "stopping" in agent.stderr() and "Traceback" not in agent.stderr()
        assert not agent.socket.exists()  # the socket file is removed on a clean stop
    wait_released(programs, links)


def test_sigkill_leaves_nothing_attached() -> None:
    with AgentProcess() as agent:
        agent.wait_ready()
        stream = agent.client.session({"diagnostic": "drops", "duration": 120})
        assert next(iter(stream))["type"] == "session_start"
        programs, links = agent.bpf_ids()
        assert len(programs) == 2 and len(links) == 2
        assert programs <= loaded_ids()[0] and links <= loaded_ids()[1]
        assert agent.stop(signal.SIGKILL) == -signal.SIGKILL
        stream.close()
        wait_released(programs, links)
        # A restart reuses the socket path the killed agent left behind.
        with AgentProcess({"agent": {"socket": str(agent.socket)}}) as again:
            again.wait_ready()
            assert again.http.get("/readyz")[0] == 200
