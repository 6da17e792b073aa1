"""A small client for the agent's HTTP API, over its unix socket or TCP (with the bearer token).

    client = AgentClient.unix("/run/netsleuth/agent.sock")
    with client.session({"diagnostic": "drops", "filters": {"dport": 53}, "duration": 10}) as stream:
        for record in stream:
            ...

Plain `curl --unix-socket /run/netsleuth/agent.sock -d '{...}' http://agent/v1/sessions` does the same.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

__all__ = ["AgentClient", "AgentError", "SessionStream", "StreamCut"]


class AgentError(Exception):
    """The agent refused a request; `status` is its HTTP status, the message its one sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class StreamCut(AgentError):
    """The stream ended in the middle of a record: the agent gave up on a client that read too slowly to
    finish by the session's deadline (or the agent died)."""

    def __init__(self) -> None:
        super().__init__(0, "the session's stream was cut mid-record: read faster, or ask for fewer events")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("agent", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.settimeout(self.timeout)
        unix.connect(self._path)
        self.sock = unix


class SessionStream:
    """The JSON lines of one session; closing it early ends the session on the agent (client_gone)."""

    def __init__(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        self._connection = connection
        self._response = response

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            line = self._response.readline()
            if not line:
                return
            if not line.endswith(b"\n"):
                raise StreamCut()
            record: dict[str, Any] = json.loads(line)
            yield record

    def close(self) -> None:
        # Shut the socket down, not just close our file object: the agent must see the FIN now.
        sock = self._connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already reset by the agent
                sock.shutdown(socket.SHUT_RDWR)
        self._response.close()
        self._connection.close()

    def __enter__(self) -> SessionStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True)
class AgentClient:
    socket_path: str | None = None
    host: str | None = None
    port: int | None = None
    token: str | None = None
    timeout: float = 330.0  # longer than any session may run (sessions.max_duration is at most a day)

    @classmethod
    def unix(cls, path: str, timeout: float = 330.0) -> AgentClient:
        return cls(socket_path=path, timeout=timeout)

    @classmethod
    def tcp(cls, host: str, port: int, token: str | None = None, timeout: float = 330.0) -> AgentClient:
        return cls(host=host, port=port, token=token, timeout=timeout)

    def _connection(self) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path, self.timeout)
        return http.client.HTTPConnection(self.host or "127.0.0.1", self.port, timeout=self.timeout)

    def _headers(self, body: bytes | None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if body is not None:
            headers["Content-Type"] = "application/json"
        return headers

    def get(self, path: str) -> tuple[int, bytes]:
        connection = self._connection()
        try:
            connection.request("GET", path, headers=self._headers(None))
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def sessions(self) -> list[dict[str, Any]]:
        status, body = self.get("/v1/sessions")
        payload: dict[str, Any] = json.loads(body)
        if status != 200:
            raise AgentError(status, str(payload.get("error")))
        sessions: list[dict[str, Any]] = payload["sessions"]
        return sessions

    def session(self, request: dict[str, Any]) -> SessionStream:
        """Start a session; raises AgentError when the agent refuses it."""
        body = json.dumps(request).encode()
        connection = self._connection()
        connection.request("POST", "/v1/sessions", body=body, headers=self._headers(body))
        response = connection.getresponse()
        if response.status != 200:
            try:
                message = json.loads(response.read()).get("error", "")
            except ValueError:
                message = response.reason
            connection.close()
            raise AgentError(response.status, message)
        return SessionStream(connection, response)
