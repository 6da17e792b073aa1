"""Debian's `prometheus` and `prometheus-alertmanager` for tests: each our own process on a free loopback port
with its own temporary config and storage, stopped (and its files removed) by the test.

    with Prometheus(config_yaml, files={"rules.yml": text}, flags=["--rules.alert.resend-delay=1s"]) as prom:
        prom.query('up'); prom.scalar('sum(up)'); prom.alerts()
    with Alertmanager(config_yaml, files={"token": secret}) as am:
        am.url; am.alerts()

`{dir}` in a config or file text is replaced by the process's temporary directory (where `files` are written).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.fleet_lab import free_port
from tests.netlab import wait_for

__all__ = ["Alertmanager", "Prometheus", "ServedProcess"]


class ServedProcess:
    """One server binary with a temp dir, a free port, a readiness URL and an HTTP JSON getter."""

    binary_name = ""
    ready_path = "/-/ready"

    def __init__(
        self, config: str, files: dict[str, str] | None = None, flags: list[str] | None = None
    ) -> None:
        binary = shutil.which(self.binary_name)
        if binary is None:
            raise AssertionError(f"Debian's {self.binary_name} is not installed (make deps installs it)")
        self._tmp = tempfile.TemporaryDirectory(prefix=f"netsleuth-{self.binary_name}-")
        self.dir = Path(self._tmp.name)
        for name, text in (files or {}).items():
            path = self.dir / name
            path.write_text(text.replace("{dir}", str(self.dir)))
            path.chmod(0o600)
        self.config_path = self.dir / "config.yml"
        self.config_path.write_text(config.replace("{dir}", str(self.dir)))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.dir / "log"
        self._argv = [binary, *self.arguments(), *(flags or [])]
        self.process: subprocess.Popen[bytes] | None = None

    def arguments(self) -> list[str]:
        raise NotImplementedError

    def __enter__(self) -> ServedProcess:
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(self._argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(self._ready, 60, f"{self.binary_name} to be ready")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as response:
                return int(response.status), bytes(response.read())
        except OSError:
            return 0, b""

    def _ready(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(f"{self.binary_name} exited: {self.log_text()[-2000:]}")
        return self.get(self.ready_path)[0] == 200

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self._tmp.cleanup()


class Prometheus(ServedProcess):
    binary_name = "prometheus"

    @classmethod
    def scraping(cls, target: str) -> Prometheus:
        """Every second, one target, job `netsleuth`."""
        return cls(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: netsleuth\n    static_configs:\n"
            f"      - targets: ['{target}']\n"
        )

    def arguments(self) -> list[str]:
        return [
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]

    def __enter__(self) -> Prometheus:
        super().__enter__()
        return self

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
        status, body = self.get("/api/v1/query?" + urllib.parse.urlencode(params))
        assert status == 200, body
        payload = json.loads(body)
        assert payload["status"] == "success", payload
        result: list[dict[str, Any]] = payload["data"]["result"]
        return result

    def scalar(self, promql: str, at: float | None = None) -> float | None:
        result = self.query(promql, at)
        return float(result[0]["value"][1]) if result else None

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts (GET /api/v1/alerts)."""
        status, body = self.get("/api/v1/alerts")
        assert status == 200, body
        alerts: list[dict[str, Any]] = json.loads(body)["data"]["alerts"]
        return alerts


class Alertmanager(ServedProcess):
    binary_name = "prometheus-alertmanager"

    def arguments(self) -> list[str]:
        return [
            f"--config.file={self.config_path}",
            f"--storage.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip port: one instance, nothing listens beyond loopback
        ]

    def __enter__(self) -> Alertmanager:
        super().__enter__()
        return self

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts it holds (API v2), each with its fingerprint and labels."""
        status, body = self.get("/api/v2/alerts")
        assert status == 200, body
        alerts: list[dict[str, Any]] = json.loads(body)
        return alerts
