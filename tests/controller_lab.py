"""A real `netsleuth controller` process for a FleetLab: its config (users, roles, the lab's signing key and
NATS credentials) written to the lab's workdir, started on a free port, stopped (or killed) by the test.

    with FleetLab() as lab, ControllerProcess(lab) as controller:
        controller.url                       # http://127.0.0.1:PORT
        controller.tokens["alice"]           # operator: drops/conn/resets/diagnose on every host's own netns
        controller.tokens["bob"]             # only drops, only on host client, only in netns "web"
        controller.tokens["root"]            # admin
        controller.kill()                    # SIGKILL mid-session (agents must stop on their own)

    with ControllerProcess(lab) as a, a.twin("b") as b, Balancer([a.url, b.url]) as balancer:
        balancer.url                         # one address for both: a TCP round robin, like any balancer
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from types import TracebackType

from netsleuth.controller.auth import hash_token, new_token
from tests.fleet_lab import REPO, FleetLab, free_port
from tests.netlab import wait_for

__all__ = ["Balancer", "ControllerProcess"]

ROLES = """
[roles.operators]
diagnostics = ["drops", "conn", "resets", "diagnose", "tcp.states"]
hosts = ["*"]
netns = ["host"]
max_concurrent = 2
max_duration = 30
max_hosts = 5

[roles.web-readonly]
diagnostics = ["drops"]
hosts = ["client"]
netns = ["web"]
max_concurrent = 1
max_duration = 10

[roles.admins]
admin = true
diagnostics = ["*"]
hosts = ["*"]
netns = ["*"]
max_concurrent = 10
max_duration = 300
max_hosts = 1000
"""


class ControllerProcess:
    def __init__(
        self,
        lab: FleetLab,
        extra_config: str = "",
        extra_users: dict[str, list[str]] | None = None,
        records_max_bytes: int = 64 << 20,
        name: str = "controller",
        tokens: dict[str, str] | None = None,
        lease_seconds: float = 10.0,
        stale_after: float = 15.0,
    ) -> None:
        """`extra_users`: more users, name -> roles (defined in `extra_config` as [roles.NAME] tables or
        among ROLES); each gets a token in `tokens` like the built-in three. `records_max_bytes`: what
        NETSLEUTH_RECORDS reserves in the lab's store (the lab's stores are small). `name`: its own folder
        (two controllers of one lab); `tokens`: the users' tokens of another (the same users, as two
        controllers behind a balancer have: `twin`)."""
        self.lab = lab
        self.name = name
        self.stale_after = stale_after  # [sessions] stale_after: a bench whose agents beat slowly raises it
        self.lease_seconds = lease_seconds
        self.workdir = lab.workdir / name
        self.workdir.mkdir(exist_ok=True)
        self.user_roles = {"alice": ["operators"], "bob": ["web-readonly"], "root": ["admins"]}
        self.user_roles.update(extra_users or {})
        self.tokens = dict(tokens) if tokens is not None else {user: new_token() for user in self.user_roles}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_config = extra_config
        self.records_max_bytes = records_max_bytes
        self.process: subprocess.Popen[bytes] | None = None
        self.config_path = self.workdir / "controller.toml"
        self.ready_path = self.workdir / "ready.json"
        self.log_path = self.workdir / "controller.log"

    def _config(self) -> str:
        key_file = self.workdir / "signing.key"
        key_file.write_text(self.lab.controller_key_text + "\n")
        key_file.chmod(0o600)
        creds = self.lab.controller_credentials
        if "nkeys_seed" in creds:  # FleetLab(auth="nkey")
            login = f'nkey_seed_file = "{creds["nkeys_seed"]}"\n'
        else:
            login = f'user = "{creds["user"]}"\npassword = "{creds["password"]}"\n'
        users = "".join(
            f'[[users]]\nname = "{name}"\ntoken_hash = "{hash_token(token)}"\n'
            f"roles = {json.dumps(self.user_roles[name])}\n\n"
            for name, token in self.tokens.items()
        )
        return (
            f'[http]\nlisten = "127.0.0.1:{self.port}"\n\n'
            f'[nats]\nurl = "{self.lab.nats_url_text}"\n{login}'
            f"replicas = {self.lab.replicas}\n\n"
            f'[signing]\nkey_file = "{key_file}"\nkey_id = "{self.lab.key_id}"\n\n'
            "[sessions]\nprepare_timeout = 60\nstart_margin = 0.5\nhost_silence = 5\nend_grace = 60\n"
            f"records_max_bytes = {self.records_max_bytes}\nlease_seconds = {self.lease_seconds}\n"
            f"stale_after = {self.stale_after}\n\n"
            f"{users}{ROLES}\n{self.extra_config}"
        )

    def start(self, timeout: float = 30) -> None:
        self.config_path.write_text(self._config())
        self.config_path.chmod(0o600)
        self.ready_path.unlink(missing_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "netsleuth", "controller", "--config", str(self.config_path),
             "--ready-file", str(self.ready_path)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
        log.close()

        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the controller exited: {self.log_text()[-3000:]}")
            return self.ready_path.exists()

        wait_for(ready, timeout, "the controller to listen")
        assert json.loads(self.ready_path.read_text())["port"] == self.port

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def twin(self, name: str) -> ControllerProcess:
        """Another controller with the same users, roles and tokens, on its own port (not started)."""
        return ControllerProcess(
            self.lab, self.extra_config, {u: r for u, r in self.user_roles.items()}, self.records_max_bytes,
            name, self.tokens, self.lease_seconds,
        )  # fmt: skip

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def env(self, user: str) -> dict[str, str]:
        """The environment a `netsleuth fleet` child needs to act as `user`."""
        return {**os.environ, "NETSLEUTH_CONTROLLER": self.url, "NETSLEUTH_TOKEN": self.tokens[user]}

    def __enter__(self) -> ControllerProcess:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


class Balancer:
    """A TCP round robin in front of several controllers, as any HTTP balancer would be: each new connection
    goes to the next backend that accepts it (one that is down is skipped), and bytes are copied both ways
    until either side closes. What a client of several controllers sees through one address."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = [
            (url.split("//", 1)[1].rsplit(":", 1)[0], int(url.rsplit(":", 1)[1])) for url in backends
        ]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections: list[int] = [0] * len(self.backends)  # per backend, how many it was given
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="balancer", daemon=True)
        self._server: asyncio.Server | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        for _attempt in range(len(self.backends)):
            index = self._next % len(self.backends)
            self._next += 1
            try:
                backend_reader, backend_writer = await asyncio.open_connection(*self.backends[index])
            except OSError:
                continue
            self.connections[index] += 1
            await asyncio.gather(
                self._pipe(client_reader, backend_writer), self._pipe(backend_reader, client_writer)
            )
            return
        client_writer.close()  # no backend up: the client sees its connection closed

    def __enter__(self) -> Balancer:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", self.port), self._loop
        )
        self._server = started.result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
