"""The agent's HTTP servers on real sockets (TCP on loopback, a unix socket in a temp dir), with a scripted
diagnostic instead of BPF: endpoints, token rules, streaming, disconnects, shutdown."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from netsleuth.agent.client import AgentClient, AgentError
from netsleuth.agent.config import ListenAddress, SessionLimits
from netsleuth.agent.http import TcpServer, UnixServer
from netsleuth.agent.programs import ProgramLedger
from netsleuth.agent.session_diagnostics import DiagnosticContext
from netsleuth.agent.sessions import SessionManager
from netsleuth.bpf.stats import ProgramStats
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.reasons import DropReasons
from tests.netlab import wait_for
from tests.unit.json_record import JsonRecord

TOKEN = "test-token-0123456789abcdef"


class Ticking:
    """A diagnostic that yields one record per poll, in real time."""

    def __init__(self, config: Mapping[str, Any], _context: DiagnosticContext) -> None:
        self.attach_kind = "fake"
        self.count = 0
        self.pad = "x" * int(config.get("pad", 0))

    def start(self) -> None:
        pass

    def poll(self, timeout_ms: int) -> list[JsonRecord]:
        time.sleep(min(timeout_ms, 20) / 1000)
        self.count += 1
        return [JsonRecord({"type": "drop", "n": self.count, "pad": self.pad})]

    def drain(self) -> list[JsonRecord]:
        return []

    def totals(self) -> EventTotals:
        return EventTotals(matched=self.count, emitted=self.count)

    def summary(self, interrupted: bool) -> JsonRecord:
        return JsonRecord({"type": "summary", "total": self.count, "interrupted": interrupted, "groups": []})

    def program_fds(self) -> dict[str, int]:
        return {"fake": 1000}

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class Counting:
    def collect(self) -> list[Metric]:
        return [CounterMetricFamily("netsleuth_test_things", "Things counted", value=42)]


@dataclass
class Endpoints:
    sessions: SessionManager
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    ready: bool = False

    def is_ready(self) -> bool:
        return self.ready


@dataclass
class Servers:
    endpoints: Endpoints
    tcp: TcpServer
    unix: UnixServer
    threads: list[threading.Thread]

    @property
    def http(self) -> AgentClient:
        return AgentClient.tcp("127.0.0.1", self.tcp.bound.port, timeout=10)

    @property
    def socket(self) -> AgentClient:
        return AgentClient.unix(str(self.unix.path), timeout=10)

    def stop(self) -> None:
        self.endpoints.sessions.stop_all(timeout=5)
        for server in (self.tcp, self.unix):
            server.shutdown()
            server.server_close()
        for thread in self.threads:
            thread.join(5)


def start(tmp_path: Path, token: str | None = None, max_concurrent: int = 4) -> Servers:
    sessions = SessionManager(
        SessionLimits(max_concurrent=max_concurrent, max_duration=60),
        DiagnosticContext(DropReasons({}, "test")),
        ProgramLedger(lambda fd: ProgramStats(0, 0)),
        lambda: True,
        diagnostics={"tick": Ticking},
        read_config=lambda _name, config: config,  # the ticking diagnostic reads its own config
    )
    endpoints = Endpoints(sessions)
    endpoints.registry.register(Counting())
    tcp = TcpServer(ListenAddress("127.0.0.1", 0), endpoints, token)
    unix = UnixServer(tmp_path / "run" / "agent.sock", 0o600, endpoints)
    threads = [threading.Thread(target=server.serve_forever, args=(0.05,)) for server in (tcp, unix)]
    for thread in threads:
        thread.start()
    return Servers(endpoints, tcp, unix, threads)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    running = start(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def test_metrics_health_and_readiness(servers: Servers) -> None:
    status, body = servers.http.get("/metrics")
    assert status == 200 and "netsleuth_test_things_total 42.0" in body.decode()
    assert servers.http.get("/healthz") == (200, b"ok\n")
    assert servers.http.get("/readyz")[0] == 503
    servers.endpoints.ready = True
    assert servers.http.get("/readyz") == (200, b"ready\n")
    assert servers.http.get("/nope")[0] == 404
    assert servers.socket.get("/metrics")[0] == 200  # the socket serves everything


def test_session_over_the_unix_socket(servers: Servers) -> None:
    with servers.socket.session({"diagnostic": "tick", "duration": 0.5}) as stream:
        records = list(stream)
    assert records[0]["type"] == "session_start" and records[0]["diagnostic"] == "tick"
    assert {record["type"] for record in records[1:-2]} == {"drop"}
    assert records[-1]["type"] == "session_end" and records[-1]["reason"] == "duration"
    assert records[-1]["events"] == len(records) - 3


def test_tcp_serves_no_sessions_without_a_token(servers: Servers) -> None:
    with pytest.raises(AgentError) as refused:
        servers.http.session({"diagnostic": "tick", "duration": 0.2})
    assert refused.value.status == 404 and "unix socket" in str(refused.value)


def test_tcp_sessions_need_the_exact_token(tmp_path: Path) -> None:
    running = start(tmp_path, token=TOKEN)
    try:
        port = running.tcp.bound.port
        for token in (None, "wrong", TOKEN + "x"):
            with pytest.raises(AgentError) as refused:
                AgentClient.tcp("127.0.0.1", port, token).session({"diagnostic": "tick", "duration": 0.2})
            assert refused.value.status == 401
        with AgentClient.tcp("127.0.0.1", port, TOKEN).session(
            {"diagnostic": "tick", "duration": 0.2}
        ) as stream:
            assert list(stream)[-1]["reason"] == "duration"
        assert AgentClient.tcp("127.0.0.1", port, TOKEN).sessions() == []
        # The unix socket never asks for the token: its file mode is the access control.
        assert running.socket.sessions() == []
    finally:
        running.stop()


def test_bad_requests_are_refused_with_one_sentence(servers: Servers) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"diagnostic": "tick", "duration": 61}, 400, "exceeds this agent's limit of 60 seconds"),
        ({"diagnostic": "nope"}, 400, "unknown diagnostic 'nope' (known: tick)."),
    ]
    for request, status, text in cases:
        with pytest.raises(AgentError) as refused:
            servers.socket.session(request)
        assert refused.value.status == status and text in str(refused.value)


def test_concurrency_limit_is_enforced_over_http(tmp_path: Path) -> None:
    running = start(tmp_path, max_concurrent=1)
    try:
        with running.socket.session({"diagnostic": "tick", "duration": 30}) as first:
            next(iter(first))
            with pytest.raises(AgentError) as refused:
                running.socket.session({"diagnostic": "tick", "duration": 1})
            assert refused.value.status == 429
        wait_for(lambda: running.socket.sessions() == [], 5, "the first session to end")
        with running.socket.session({"diagnostic": "tick", "duration": 0.2}) as second:
            assert list(second)[-1]["reason"] == "duration"
    finally:
        running.stop()


def test_a_client_that_disconnects_ends_its_session(servers: Servers) -> None:
    stream = servers.socket.session({"diagnostic": "tick", "duration": 60})
    assert next(iter(stream))["type"] == "session_start"
    assert len(servers.socket.sessions()) == 1
    stream.close()
    # Ended long before its 60 s, and for that reason (how soon the agent notices is no unit test's to time).
    wait_for(lambda: servers.socket.sessions() == [], 5, "the session to notice its client left")
    assert servers.endpoints.sessions.stats.ended[("tick", "client_gone")] == 1


def test_a_client_that_stops_reading_cannot_hold_a_session_past_its_deadline(servers: Servers) -> None:
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(str(servers.unix.path))
    # 64 KiB records fill the socket buffers within a few polls.
    body = json.dumps({"diagnostic": "tick", "duration": 1, "options": {"pad": 65536}}).encode()
    raw.sendall(
        b"POST /v1/sessions HTTP/1.1\r\nHost: agent\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    try:
        wait_for(lambda: len(servers.socket.sessions()) == 1, 5, "the session to start")
        # Never read: the agent's writes block, and must give up at the deadline (+ a short grace).
        wait_for(lambda: servers.socket.sessions() == [], 1 + 2 + 3, "the session to end at its deadline")
        assert servers.endpoints.sessions.stats.ended[("tick", "client_gone")] == 1  # the write gave up
    finally:
        raw.close()


def test_stopping_ends_sessions_with_their_summary(servers: Servers) -> None:
    records: list[dict[str, Any]] = []
    with servers.socket.session({"diagnostic": "tick", "duration": 60}) as stream:
        lines = iter(stream)
        records.append(next(lines))
        reader = threading.Thread(target=lambda: records.extend(lines))
        reader.start()
        assert servers.endpoints.sessions.stop_all(timeout=5)
        reader.join(5)
    assert records[-1]["reason"] == "agent_stopping" and records[-2]["type"] == "summary"
    with pytest.raises(AgentError) as refused:
        servers.socket.session({"diagnostic": "tick"})
    assert refused.value.status == 503


def test_socket_file_mode_and_stale_socket(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # a socket file nobody listens on: what a SIGKILLed agent leaves
    endpoints = Endpoints(
        SessionManager(
            SessionLimits(), DiagnosticContext(DropReasons({}, "t")), ProgramLedger(), lambda: True
        )
    )
    server = UnixServer(path, 0o660, endpoints)
    try:
        assert path.stat().st_mode & 0o777 == 0o660
        with pytest.raises(EnvironmentProblem, match="already serving"):
            UnixServer(path, 0o660, endpoints)
    finally:
        server.server_close()
    assert not path.exists()
    path.write_text("not a socket")
    with pytest.raises(EnvironmentProblem, match="not a socket"):
        UnixServer(path, 0o660, endpoints)
