"""The agent's HTTP face, on a TCP address and on a unix socket.

    GET  /metrics       Prometheus text (or OpenMetrics when asked); collectors read the kernel at scrape time
    GET  /healthz       200 while the process serves requests
    GET  /readyz        200 once the exporter's programs are attached, 503 before and while stopping
    GET  /v1/sessions   the sessions running now
    POST /v1/sessions   run a bounded session; the response streams JSON lines (see sessions.py)

The session API loads programs into the kernel on request, so it is served on the unix socket (access is
the socket file's owner, group and mode) and on TCP only when a token is configured (bearer token,
compared in constant time). Both servers use a thread per connection and wait for responses in flight when
they stop, so a SIGTERM lets a scrape or a session's final lines finish.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import select
import socket
import socketserver
import stat
import struct
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from netsleuth.agent.config import ListenAddress
from netsleuth.agent.sessions import ClientGone, SessionManager, SessionRefused
from netsleuth.errors import EnvironmentProblem

__all__ = ["AgentEndpoints", "SocketSink", "TcpServer", "UnixServer", "bind_tcp", "bind_unix"]

_LOG = logging.getLogger("netsleuth.agent")
# After its deadline a session still gets this long to hand its summary to a slow reader.
_WRITE_GRACE_S = 2.0


class AgentEndpoints(Protocol):
    registry: CollectorRegistry

    @property
    def sessions(self) -> SessionManager: ...

    def is_ready(self) -> bool: ...


class SocketSink:
    """A session's connection: bounded writes, and a cheap check that the peer is still there."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection

    def write(self, data: bytes, deadline: float) -> None:
        timeout = max(0.05, deadline + _WRITE_GRACE_S - time.monotonic())
        try:
            self._connection.settimeout(timeout)
            self._connection.sendall(data)
        except TimeoutError:
            raise ClientGone("the client stopped reading") from None
        except OSError as error:
            raise ClientGone(f"the connection failed: {error.strerror or error}") from None

    def client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self._connection], [], [], 0)
            if not readable:
                return False
            # Readable with nothing to read is the peer's FIN: it closed (or half-closed) the connection.
            return self._connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True


class _Handler(BaseHTTPRequestHandler):
    server: TcpServer | UnixServer
    server_version = "netsleuth-agent"

    def log_message(self, format: str, *args: Any) -> None:
        _LOG.debug("%s %s", self.address_string(), format % args)

    def address_string(self) -> str:
        return self.server.peer_of(self.connection, self.client_address)

    def _reply(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._reply(status, json.dumps(payload).encode() + b"\n", "application/json", headers)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._json(status, {"type": "error", "error": message}, headers)

    def _sessions_allowed(self) -> bool:
        token = self.server.token
        if not self.server.sessions_need_token:
            return True
        if token is None:
            self._error(
                404,
                "the session API is served on the agent's unix socket (set sessions.token_file to "
                "serve it over TCP)",
            )
            return False
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            self._error(401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"})
            return False
        return True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        endpoints = self.server.endpoints
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, encoder(endpoints.registry), content_type)
        elif path == "/healthz":
            self._reply(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/readyz":
            ready = endpoints.is_ready()
            self._reply(
                200 if ready else 503, b"ready\n" if ready else b"not ready\n", "text/plain; charset=utf-8"
            )
        elif path == "/v1/sessions":
            if self._sessions_allowed():
                self._json(200, {"sessions": endpoints.sessions.active()})
        else:
            self._error(404, f"no such endpoint {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path != "/v1/sessions":
            self._error(404, f"no such endpoint {path}")
            return
        if not self._sessions_allowed():
            return
        length_text = self.headers.get("Content-Length", "0")
        if not length_text.isdigit():
            self._error(400, "Content-Length must be a number")
            return
        body = self.rfile.read(int(length_text))
        try:
            session = self.server.endpoints.sessions.open(body, self.address_string())
        except SessionRefused as refused:
            self._error(refused.status, str(refused))
            return
        try:
            # No Content-Length: the stream ends when the agent closes the connection (HTTP/1.0 style).
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.flush()
        except OSError:
            session.abandon("the client left before the stream began")
            return
        session.stream(SocketSink(self.connection))
        self.close_connection = True


class TcpServer(ThreadingHTTPServer):
    daemon_threads = False  # stop() waits for responses in flight
    block_on_close = True
    sessions_need_token = True

    def __init__(self, address: ListenAddress, endpoints: AgentEndpoints, token: str | None) -> None:
        self.address_family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        self.endpoints = endpoints
        self.token = token
        try:
            super().__init__((address.host, address.port), _Handler)
        except OSError as error:
            raise EnvironmentProblem(f"cannot listen on {address}: {error.strerror}") from None

    def peer_of(self, connection: socket.socket, client_address: Any) -> str:
        return f"{client_address[0]}:{client_address[1]}"

    @property
    def bound(self) -> ListenAddress:
        host, port = self.server_address[:2]
        return ListenAddress(str(host), int(port))


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = False
    block_on_close = True
    sessions_need_token = False
    token = None

    def __init__(self, path: Path, mode: int, endpoints: AgentEndpoints) -> None:
        self.endpoints = endpoints
        self.path = path
        _remove_stale_socket(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # Created with no permission for others, then opened to exactly `mode`: never wider in between.
            old_umask = os.umask(0o177)
            try:
                super().__init__(str(path), _Handler)
            finally:
                os.umask(old_umask)
            os.chmod(path, mode)
        except OSError as error:
            raise EnvironmentProblem(f"cannot create the session socket {path}: {error.strerror}") from None

    def peer_of(self, connection: socket.socket, client_address: Any) -> str:
        try:
            credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, _ = struct.unpack("3i", credentials)
            return f"unix:uid={uid},pid={pid}"
        except OSError:
            return "unix"

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _remove_stale_socket(path: Path) -> None:
    """A socket file left by an agent that was killed; refuse if an agent still answers on it."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise EnvironmentProblem(f"{path} exists and is not a socket: remove it or set agent.socket")
    except FileNotFoundError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise EnvironmentProblem(f"another agent is already serving {path}")


def bind_tcp(address: ListenAddress, endpoints: AgentEndpoints, token: str | None) -> TcpServer:
    return TcpServer(address, endpoints, token)


def bind_unix(path: Path, mode: int, endpoints: AgentEndpoints) -> UnixServer:
    return UnixServer(path, mode, endpoints)
