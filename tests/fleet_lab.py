"""A fleet on one machine: nats-server with JetStream, hosts as network namespaces on a bridge, one real
`netsleuth agent` per host. Used by the fleet tests (agent, controller, web UI) and `make fleet-demo`.

    from tests.fleet_lab import FleetLab

    with FleetLab(hosts=("client", "lb", "server")) as lab:
        lab.nats_url                      # nats://127.0.0.1:PORT
        lab.controller_credentials        # {"user": "controller", "password": ...}: nats.connect(**creds)
                                          # (FleetLab(auth="nkey"): {"nkeys_seed": path}, agents the same)
        lab.admin_credentials             # no permission limits (lab set-up, tests that play an attacker)
        lab.controller_key                # the Ed25519 private key the agents trust (controller_key_text too)
        lab.controller_public_key_text    # "ed25519:...", what an agent's [fleet] controller_key holds
        lab.key_id                        # "lab-controller"
        lab.hosts["lb"].netns             # the namespace name (a tests.netlab.Host: .run(...), .popen(...))
        lab.hosts["lb"].address           # 198.18.1.10
        lab.agent("lb")                   # its AgentProcess: .pid, .log_text(), .config_path
        lab.kill_agent("lb")              # SIGKILL (a crashed agent); lab.stop_agent("lb") = SIGTERM
        lab.start_agent("lb")             # again, e.g. after a kill; scoped=False: a whole-host agent
        lab.agent("lb").metrics()         # its /metrics text (netsleuth_fleet_* series; drops too with
                                          # FleetLab(drops_exporter=True))
        lab.stop_nats(); lab.start_nats(); lab.restart_nats()   # same port, same JetStream store
        lab.nats_pid                      # nats-server's pid (None while stopped)
    FleetLab(nats_servers=3): a three-server cluster (routes on loopback, JetStream replicated): the agents
    and ControllerProcess get every URL (lab.nats_url_text); lab.nats_urls, lab.nats_pids;
        lab.stop_nats(index=1, kill=True); lab.start_nats(index=1)   # one server (same port, same store)
        lab.nats_server_of("netsleuth-controller")   # the index of the server a named client is on
        lab.registry()                    # {host: HostEntry} from the KV bucket
        lab.wait_registered(["lb"], since_ns=t)  # until each host wrote an entry after t
        lab.task("lb", session="s1", diagnostic="drops", config={...}, deadline_s=3)  -> Task
        lab.sign(task)                    # -> SignedTask, signed with the controller key
        lab.nats_request(subject, data)   # one request as the controller (sync; from any thread or loop)

    serve(lab, "server", 8081)            # a TCP listener in a host's namespace (gone with the lab)
    connect(lab, "client", VIP, 80)       # one TCP connect from a host: "connected", "TimeoutError", ...
    with DirectController(lab) as c:      # the controller's side of the protocol, without the controller
        c.run_session("s1", ["client", "server"], config={"proto": "tcp"}, deadline_s=2)
        c.wait_states("s1", {"server": ("ended",)}); c.states("s1"); c.records("s1", "server")

Topology (every address in 198.18.0.0/16, one L2 segment on a bridge inside a "fabric" namespace):
    client 198.18.0.5   lb 198.18.1.10   server 198.18.2.7   any other host 198.18.3.<n>
    lb:     nftables DNAT 198.18.1.10:80 -> 198.18.2.7:8080 and 198.18.1.10:81 -> 198.18.2.7:8081, no SNAT
            (so a reply from the server on 8081 goes straight to the client: the DNAT-bypass reset)
    server: iptables -A INPUT -p tcp --dport 8080 -j DROP (the firewall drop on a far host)
    lb:     also 198.18.1.10:82 -> 198.18.2.7:9000; server: REDIRECT :9000 -> :15006 (the seed-001 story)

Agents run in the root namespace (BPF programs see every namespace) and are scoped to their host's
namespace by their config (`[fleet] netns`). nats-server listens on a free loopback port; each agent has
its own NATS user whose permissions reach only its own host's subjects (netsleuth.fleet.nats_config).
Everything the lab starts it stops, also when the block raises: agents, nats-server, namespaces, files.
Namespaces are named `nsf<pid>-<n>-<host>` and veth ends are created inside them (nothing appears in the root
namespace); a lab whose process was killed is cleaned up by the next lab that starts (`reap_leftovers`).
`python -m tests.fleet_lab` brings one up and prints it; `--demo` (`make fleet-demo`) adds the controller and
runs the seed-001 story under `netsleuth fleet run conn`, merged verdict first; `--record FILE` writes one
`conn` session over the three stories as the merge's unit-test fixture.

The seed-001 story (serve_story, invalid_ack): the server's application listens on APP_PORT (9000) and its
sidecar on SIDECAR_PORT (15006), where `iptables -t nat -A PREROUTING --dport 9000 -j REDIRECT` sends every
inbound connection (the server answers through the lb: a policy route for those two source ports); the lb
DNATs VIP:82 to server:9000 with nf_conntrack_tcp_be_liberal=1. The client opens a connection through the VIP,
then sends one ACK of it 1 GiB ahead of its sequence: the server's conntrack marks it INVALID, so the
REDIRECT is skipped, the application's LISTEN socket answers with a RST, and the lb carries that RST back to
the client, whose connection dies (ECONNRESET).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from netsleuth.fleet.nats_config import (
    NatsUser,
    agent_user,
    cluster_routes,
    controller_permissions,
    render_server_config,
)
from netsleuth.fleet.protocol import (
    HOSTS_BUCKET,
    Budgets,
    Control,
    HostEntry,
    HostStatus,
    RecordBatch,
    Scope,
    SignedTask,
    Task,
    TaskReply,
    control_subject,
    decode,
    generate_private_key,
    new_task_id,
    private_key_to_text,
    public_key_to_text,
    session_subjects,
    task_subject,
)
from tests.netlab import Host, run, wait_for

__all__ = [
    "AgentProcess",
    "DirectController",
    "FleetLab",
    "LabHost",
    "NkeyUser",
    "connect",
    "invalid_ack",
    "new_nkey_seed",
    "reap_leftovers",
    "serve",
    "serve_story",
    "session_fixture",
]

REPO = Path(__file__).resolve().parents[1]
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable
ADDRESSES = {"client": "198.18.0.5", "lb": "198.18.1.10", "server": "198.18.2.7"}
VIP = "198.18.1.10"
STORY_VIP_PORT = 82  # lb DNATs VIP:82 to the server's app port (the seed-001 story)
APP_PORT = 9000  # the server's application listens here ...
SIDECAR_PORT = 15006  # ... and its sidecar here, where the server's REDIRECT sends inbound :9000
_T = TypeVar("_T")
_LAB_COUNT = itertools.count()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def reap_leftovers() -> list[str]:
    """Namespaces of labs whose process is gone (killed before it could clean up): their processes are
    killed and the namespaces deleted. Labs of live processes are never touched."""
    reaped = []
    netns_dir = Path("/run/netns")
    for entry in sorted(netns_dir.glob("nsf*-*-*")) if netns_dir.is_dir() else []:
        owner = entry.name[3:].split("-", 1)[0]
        if not owner.isdigit() or Path(f"/proc/{owner}").exists():
            continue
        for pid in run("ip", "netns", "pids", entry.name, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        run("ip", "netns", "del", entry.name, check=False)
        reaped.append(entry.name)
    return reaped


class _LoopThread:
    """An asyncio loop on a thread, so the lab's sync API works from plain tests and from inside a loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fleet-lab-io", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout: float = 30) -> _T:
        future: Future[_T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def new_nkey_seed() -> bytes:
    """A fresh NATS user nkey seed (SU...)."""
    import nkeys

    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


@dataclass(frozen=True)
class NkeyUser(NatsUser):
    """A NATS user the server lists by its nkey's public key (it logs in by signing the server's nonce with
    the seed; `password` is unused): the users of FleetLab(auth="nkey"), with the same permissions."""

    seed: bytes = field(default=b"", repr=False)

    @staticmethod
    def like(user: NatsUser) -> NkeyUser:
        return NkeyUser(user.user, "", user.permissions, new_nkey_seed())

    @property
    def public_key(self) -> str:
        import nkeys

        return bytes(nkeys.from_seed(bytearray(self.seed)).public_key).decode()

    def to_config(self) -> dict[str, Any]:
        body: dict[str, Any] = {"nkey": self.public_key}
        if self.permissions is not None:
            body["permissions"] = self.permissions
        return body


@dataclass
class AgentProcess:
    host: str
    config_path: Path
    log_path: Path
    ready_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics(self) -> str:
        """The agent's /metrics page (its HTTP address is in its ready file)."""
        import urllib.request

        wait_for(self.ready_path.exists, 30, f"the agent of {self.host} to write its ready file")
        listen = json.loads(self.ready_path.read_text())["listen"]
        with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as response:
            return str(response.read().decode())


@dataclass
class LabHost:
    name: str  # the host id (NATS subject token, registry key)
    netns: str  # its network namespace
    address: str
    ns: Host = field(repr=False)
    user: NatsUser = field(repr=False)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.ns.run(*argv, check=check)


class FleetLab:
    def __init__(
        self,
        hosts: Sequence[str] = ("client", "lb", "server"),
        agents: bool = True,
        heartbeat_seconds: float = 1.0,
        agent_settings: str = "",
        workdir: Path | None = None,
        auth: Literal["password", "nkey"] = "password",
        max_file_store: str = "1G",
        nats_servers: int = 1,
        drops_exporter: bool = False,
    ) -> None:
        """`auth="nkey"`: the controller and the agents log in with nkey seeds (files in the workdir), the
        server lists them by public key; the lab's own admin user keeps its password. `max_file_store`:
        nats-server's JetStream disk limit (a test that fills the store keeps it small). `nats_servers=3`:
        a cluster of three nats-servers joined by routes (JetStream R3 is the controller's to ask for).
        `drops_exporter`: the agents export drop counters on /metrics (off by default: each agent's program
        sees every netns)."""
        self.host_names = tuple(hosts)
        self.auth = auth
        self.start_agents = agents
        self.heartbeat_seconds = heartbeat_seconds
        self.agent_settings = agent_settings  # extra TOML appended to each agent's config (e.g. [sessions])
        self.max_file_store = max_file_store
        self.nats_servers = nats_servers
        self.drops_exporter = drops_exporter
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="netsleuth-fleet-lab-"))
        # The pid and a per-process count: two labs at once never share a name, and a lab whose process
        # was killed is recognised (and removed) by the next one (`reap_leftovers`).
        self.prefix = f"nsf{os.getpid()}-{next(_LAB_COUNT)}-"
        self.ports: list[int] = []  # client port of each server
        self.monitor_ports: list[int] = []
        self.cluster_ports: list[int] = []
        self.key_id = "lab-controller"
        self.controller_key = generate_private_key()
        self.controller_key_text = private_key_to_text(self.controller_key)
        self.controller_public_key_text = public_key_to_text(self.controller_key.public_key())
        self.controller_user = self._lab_user(
            NatsUser("controller", f"c-{os.urandom(12).hex()}", controller_permissions())
        )
        self.admin_user = NatsUser("admin", f"a-{os.urandom(12).hex()}", None)
        self.hosts: dict[str, LabHost] = {}
        self._agents: dict[str, AgentProcess] = {}
        self._nats: list[subprocess.Popen[bytes] | None] = []
        self._namespaces: list[str] = []
        self._io: _LoopThread | None = None
        self._admin: Client | None = None

    # -- addresses and credentials ---------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def monitor_port(self) -> int:
        return self.monitor_ports[0]

    @property
    def replicas(self) -> int:
        """What the lab's JetStream assets get (and a controller's [nats] replicas): 3 on a cluster."""
        return 3 if self.nats_servers >= 3 else 1

    @property
    def nats_url(self) -> str:
        """The first server's URL (what `nats.connect` takes; a client learns the others from it)."""
        return self.nats_urls[0]

    @property
    def nats_urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.ports]

    @property
    def nats_url_text(self) -> str:
        """Every server, comma-separated: an agent's [fleet] url and the controller's [nats] url."""
        return ",".join(self.nats_urls)

    def _lab_user(self, user: NatsUser) -> NatsUser:
        return NkeyUser.like(user) if self.auth == "nkey" else user

    def seed_file(self, user: NkeyUser, seed: bytes | None = None) -> Path:
        """The user's seed (or another one, e.g. one the server does not know) in a 0600 file."""
        path = self.workdir / (f"{user.user}.nk" if seed is None else f"{user.user}-other.nk")
        path.write_bytes((seed or user.seed) + b"\n")
        path.chmod(0o600)
        return path

    def _credentials(self, user: NatsUser) -> dict[str, str]:
        """nats.connect(**this) logs in as `user`."""
        if isinstance(user, NkeyUser):
            return {"nkeys_seed": str(self.seed_file(user))}
        return {"user": user.user, "password": user.password}

    @property
    def controller_credentials(self) -> dict[str, str]:
        return self._credentials(self.controller_user)

    @property
    def admin_credentials(self) -> dict[str, str]:
        return {"user": self.admin_user.user, "password": self.admin_user.password}

    def agent_credentials(self, host: str) -> dict[str, str]:
        return self._credentials(self.hosts[host].user)

    @property
    def nats_config_path(self) -> Path:
        return self.nats_config_paths[0]

    @property
    def nats_config_paths(self) -> list[Path]:
        if self.nats_servers == 1:
            return [self.workdir / "nats.conf"]
        return [self.workdir / f"nats-{index}.conf" for index in range(self.nats_servers)]

    # -- context manager -------------------------------------------------------------------------------
    def __enter__(self) -> FleetLab:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        reap_leftovers()
        self._io = _LoopThread()
        self._build_hosts()
        count = self.nats_servers
        self.ports = [free_port() for _ in range(count)]
        self.monitor_ports = [free_port() for _ in range(count)]
        self.cluster_ports = [free_port() for _ in range(count)] if count > 1 else []
        self._nats = [None] * count
        users = [self.admin_user, self.controller_user, *(host.user for host in self.hosts.values())]
        members = [("127.0.0.1", port) for port in self.cluster_ports]
        route_password = os.urandom(12).hex()
        for index, path in enumerate(self.nats_config_paths):
            path.write_text(
                render_server_config(
                    users,
                    self.workdir / ("jetstream" if count == 1 else f"jetstream-{index}"),
                    port=self.ports[index],
                    monitor_port=self.monitor_ports[index],
                    max_file_store=self.max_file_store,
                    server_name=f"lab-{index}" if count > 1 else None,
                    cluster=cluster_routes(
                        "lab", members, ("127.0.0.1", self.cluster_ports[index]), password=route_password
                    )
                    if count > 1
                    else None,
                )
            )
            path.chmod(0o600)
        self.start_nats()
        self._run(self._create_bucket())
        if self.start_agents:
            for name in self.host_names:
                self.start_agent(name, wait=False)
            self.wait_registered(self.host_names, timeout=30)

    def close(self) -> None:
        for name in list(self._agents):
            with contextlib.suppress(Exception):
                self.stop_agent(name)
        if self._io is not None:
            if self._admin is not None:
                with contextlib.suppress(Exception):
                    self._io.run(self._admin.close(), timeout=5)
                self._admin = None
            self._io.close()
            self._io = None
        with contextlib.suppress(Exception):
            self.stop_nats()
        for name in reversed(self._namespaces):
            for pid in run("ip", "netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            run("ip", "netns", "del", name, check=False)
        self._namespaces.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- hosts -----------------------------------------------------------------------------------------
    def _netns(self, short: str) -> Host:
        host = Host(f"{self.prefix}{short}")
        run("ip", "netns", "add", host.name)
        self._namespaces.append(host.name)
        host.run("ip", "link", "set", "lo", "up")
        return host

    def _build_hosts(self) -> None:
        fabric = self._netns("fab")
        fabric.run("ip", "link", "add", "br0", "type", "bridge")
        fabric.run("ip", "link", "set", "br0", "up")
        others = 0
        for index, name in enumerate(self.host_names):
            if name in ADDRESSES:
                address = ADDRESSES[name]
            else:
                others += 1
                address = f"198.18.3.{others}"
            ns = self._netns(name)
            # Both ends are created straight in their namespaces: no name ever exists in the root one.
            outer = f"port{index}"
            run(
                "ip",
                "link",
                "add",
                outer,
                "netns",
                fabric.name,
                "type",
                "veth",
                "peer",
                "eth0",
                "netns",
                ns.name,
            )
            fabric.run("ip", "link", "set", outer, "master", "br0")
            fabric.run("ip", "link", "set", outer, "up")
            ns.run("ip", "addr", "add", f"{address}/16", "dev", "eth0")
            ns.run("ip", "link", "set", "eth0", "up")
            self.hosts[name] = LabHost(name, ns.name, address, ns, self._lab_user(agent_user(name)))
        if "lb" in self.hosts:
            lb = self.hosts["lb"].ns
            # Namespace-local sysctls: they vanish with the namespace.
            lb.run("sysctl", "-qw", "net.ipv4.ip_forward=1")
            lb.run("sysctl", "-qw", "net.ipv4.conf.all.send_redirects=0")
            lb.run("sysctl", "-qw", "net.ipv4.conf.eth0.send_redirects=0")
            server = ADDRESSES["server"]
            # Liberal TCP window tracking on the middle host (kube-proxy's --conntrack-tcp-be-liberal): the
            # out-of-window ACK of the seed-001 story passes it translated, and only the server judges it.
            lb.run("sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_be_liberal=1")
            rules = (
                "table ip lab_nat {\n"
                " chain prerouting {\n"
                "  type nat hook prerouting priority dstnat; policy accept;\n"
                f"  ip daddr {VIP} tcp dport 80 dnat to {server}:8080\n"
                f"  ip daddr {VIP} tcp dport 81 dnat to {server}:8081\n"
                f"  ip daddr {VIP} tcp dport {STORY_VIP_PORT} dnat to {server}:{APP_PORT}\n"
                " }\n"
                "}\n"
            )
            run(*lb.argv("nft", "-f", "-"), input_text=rules)
        if "server" in self.hosts:
            server_ns = self.hosts["server"].ns
            server_ns.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "8080", "-j", "DROP")
            # The sidecar's capture, as istio-init writes it: inbound :9000 goes to the proxy on :15006.
            server_ns.run(
                "iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", str(APP_PORT),
                "-j", "REDIRECT", "--to-ports", str(SIDECAR_PORT),
            )  # fmt: skip
            # Its answers (the proxy's, the application's) go back through the lb, which undoes the DNAT;
            # the rest of the server still answers the client straight (the asymmetric-reply story on :81).
            server_ns.run("ip", "route", "add", "default", "via", ADDRESSES["lb"], "table", "90")
            for port in (APP_PORT, SIDECAR_PORT):
                server_ns.run("ip", "rule", "add", "ipproto", "tcp", "sport", str(port), "table", "90")

    # -- nats-server -----------------------------------------------------------------------------------
    def _indices(self, index: int | None) -> list[int]:
        return list(range(self.nats_servers)) if index is None else [index]

    def start_nats(self, timeout: float = 30, index: int | None = None) -> None:
        """Start every server (or one: `index`), then wait until JetStream answers on each started one
        (in a cluster: until the servers have elected a JetStream meta leader)."""
        if shutil.which("nats-server") is None:
            raise RuntimeError("nats-server is not installed: apt-get install nats-server (make deps does)")
        for which in self._indices(index):
            process = self._nats[which]
            if process is not None and process.poll() is None:
                continue
            log = (self.workdir / self._nats_log_name(which)).open("ab")
            argv = ["nats-server", "-c", str(self.nats_config_paths[which])]
            self._nats[which] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            log.close()
        for which in self._indices(index):
            what = f"nats-server {which} with JetStream to be ready"
            wait_for(functools.partial(self._nats_healthy, which), timeout, what)

    def _nats_log_name(self, index: int) -> str:
        return "nats.log" if self.nats_servers == 1 else f"nats-{index}.log"

    def _monitor(self, index: int, path: str) -> tuple[int, bytes]:
        with socket.create_connection(("127.0.0.1", self.monitor_ports[index]), timeout=2) as conn:
            conn.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    def monitor_json(self, index: int, path: str) -> dict[str, Any]:
        """A server's monitoring endpoint (/varz, /connz, /jsz ...) as JSON."""
        status, body = self._monitor(index, path)
        if status != 200:
            raise RuntimeError(f"nats-server {index} {path}: HTTP {status}")
        found: dict[str, Any] = json.loads(body)
        return found

    def _nats_healthy(self, index: int) -> bool:
        process = self._nats[index]
        if process is None or process.poll() is not None:
            log = (self.workdir / self._nats_log_name(index)).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"nats-server {index} exited: {log}")
        try:
            if self._monitor(index, "/healthz?js-enabled-only=true")[0] != 200:
                return False
            if self.nats_servers == 1:
                return True
            meta = self.monitor_json(index, "/jsz").get("meta_cluster") or {}
            return bool(meta.get("leader"))
        except (OSError, ValueError, IndexError):
            return False

    def stop_nats(self, kill: bool = False, index: int | None = None) -> None:
        for which in self._indices(index):
            process = self._nats[which] if which < len(self._nats) else None
            if process is None:
                continue
            if process.poll() is None:
                process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)
            self._nats[which] = None

    def restart_nats(self) -> None:
        self.stop_nats()
        self.start_nats()

    @property
    def nats_pid(self) -> int | None:
        return self.nats_pids[0] if self.nats_pids else None

    @property
    def nats_pids(self) -> list[int | None]:
        return [p.pid if p is not None and p.poll() is None else None for p in self._nats]

    def nats_running(self, index: int = 0) -> bool:
        process = self._nats[index] if index < len(self._nats) else None
        return process is not None and process.poll() is None

    def nats_server_of(self, client_name: str) -> int:
        """The index of the server a client (by its connection name) is connected to now."""
        for index in range(self.nats_servers):
            if not self.nats_running(index):
                continue
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                connections = self.monitor_json(index, "/connz?limit=10000").get("connections") or []
                if any(connection.get("name") == client_name for connection in connections):
                    return index
        raise LookupError(f"no running nats-server has a client named {client_name!r}")

    # -- agents ----------------------------------------------------------------------------------------
    def _agent_login(self, host: LabHost, nkey_seed: bytes | None) -> str:
        """The [fleet] keys that say how the agent logs in to NATS."""
        if isinstance(host.user, NkeyUser):
            return f'nkey_seed_file = "{self.seed_file(host.user, nkey_seed)}"\n'
        assert nkey_seed is None, "nkey_seed needs FleetLab(auth='nkey')"
        password_file = self.workdir / f"{host.name}.password"
        password_file.write_text(host.user.password + "\n")
        password_file.chmod(0o600)
        return f'user = "{host.user.user}"\npassword_file = "{password_file}"\n'

    def _agent_config(self, host: LabHost, scoped: bool = True, nkey_seed: bytes | None = None) -> str:
        return (
            "[agent]\n"
            'listen = "127.0.0.1:0"\n'
            'socket = ""\n'
            "[exporter.drops]\n"
            f"enabled = {'true' if self.drops_exporter else 'false'}\n"
            "[fleet]\n"
            f'url = "{self.nats_url_text}"\n'
            f'host_id = "{host.name}"\n'
            f"{self._agent_login(host, nkey_seed)}"
            f'controller_key = "{self.controller_public_key_text}"\n'
            f'controller_key_id = "{self.key_id}"\n'
            f'netns = "{host.netns if scoped else ""}"\n'
            f"heartbeat_seconds = {self.heartbeat_seconds}\n"
            "[fleet.labels]\n"
            f'role = "{host.name}"\n'
            f"{self.agent_settings}"
        )

    def start_agent(
        self,
        name: str,
        wait: bool = True,
        timeout: float = 30,
        scoped: bool = True,
        nkey_seed: bytes | None = None,
        argv_prefix: Sequence[str] = (),
    ) -> AgentProcess:
        """Start (or restart) a host's agent. `scoped=False`: an agent for the whole machine, as on a real
        host (no `fleet.netns`): its tasks are confined to the namespaces their scope names, or to the
        agent's own (the root namespace) when the scope names none. `nkey_seed` (auth="nkey" labs): log in
        with that seed instead of the host's own, e.g. one the server does not list. `argv_prefix`: what
        the agent is started under (e.g. setpriv with the systemd unit's capabilities)."""
        host = self.hosts[name]
        agent = self._agents.get(name)
        if agent is not None and agent.running():
            return agent
        config_path = self.workdir / f"agent-{name}.toml"
        config_path.write_text(self._agent_config(host, scoped, nkey_seed))
        agent = AgentProcess(
            name, config_path, self.workdir / f"agent-{name}.log", self.workdir / f"{name}.ready"
        )
        agent.ready_path.unlink(missing_ok=True)
        log = agent.log_path.open("ab")
        agent.process = subprocess.Popen(
            [
                *argv_prefix,
                PYTHON,
                "-m",
                "netsleuth",
                "agent",
                "--config",
                str(config_path),
                "--ready-file",
                str(agent.ready_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        log.close()
        self._agents[name] = agent
        if wait:
            since = time.time_ns()
            self.wait_registered([name], since_ns=since - 1, timeout=timeout)
        return agent

    def agent(self, name: str) -> AgentProcess:
        return self._agents[name]

    def kill_agent(self, name: str) -> None:
        """SIGKILL: the agent dies without any goodbye (its programs go with its fds)."""
        agent = self._agents[name]
        if agent.process is not None and agent.process.poll() is None:
            agent.process.kill()
            agent.process.wait(10)

    def stop_agent(self, name: str, timeout: float = 20) -> int | None:
        """SIGTERM and wait: returns the exit code."""
        agent = self._agents.get(name)
        if agent is None or agent.process is None:
            return None
        if agent.process.poll() is None:
            agent.process.terminate()
            try:
                agent.process.wait(timeout)
            except subprocess.TimeoutExpired:
                agent.process.kill()
                agent.process.wait(5)
        return agent.process.returncode

    # -- NATS as the controller or admin ---------------------------------------------------------------
    def _run(self, coroutine: Coroutine[Any, Any, _T], timeout: float = 30) -> _T:
        assert self._io is not None, "the lab is not started"
        return self._io.run(coroutine, timeout)

    async def _admin_client(self) -> Client:
        if self._admin is None or self._admin.is_closed:
            self._admin = await nats.connect(
                self.nats_urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2, **self.admin_credentials
            )
        return self._admin

    async def _create_bucket(self) -> None:
        from netsleuth.fleet.host_registry import ensure_hosts_bucket

        client = await self._admin_client()
        await ensure_hosts_bucket(client.jetstream(), self.replicas)

    async def _registry(self) -> dict[str, HostEntry]:
        client = await self._admin_client()
        kv = await client.jetstream().key_value(HOSTS_BUCKET)
        entries: dict[str, HostEntry] = {}
        try:
            keys = await kv.keys()
        except Exception as error:  # nats-py raises NoKeysError for an empty bucket
            if type(error).__name__ == "NoKeysError":
                return entries
            raise
        for key in keys:
            entry = await kv.get(key)
            if entry.value:
                entries[key] = HostEntry.from_json(decode(entry.value, "host entry"))
        return entries

    def registry(self) -> dict[str, HostEntry]:
        return self._run(self._registry())

    def registry_entry(self, host: str) -> HostEntry | None:
        """One host's entry, read by its key (listing the keys first can miss some: nats-py's keys() ends at
        its first empty-pending marker, which can come before messages already on their way)."""

        async def get() -> HostEntry | None:
            kv = await (await self._admin_client()).jetstream().key_value(HOSTS_BUCKET)
            try:
                entry = await kv.get(host)
            except Exception as error:  # KeyNotFoundError / KeyDeletedError: no entry
                if "Key" in type(error).__name__:
                    return None
                raise
            return HostEntry.from_json(decode(entry.value, "host entry")) if entry.value else None

        return self._run(get())

    def put_registry_entry(self, entry: HostEntry) -> None:
        """Write a host's entry as the admin (a test's recording of a host this machine cannot be)."""

        async def put() -> None:
            client = await self._admin_client()
            kv = await client.jetstream().key_value(HOSTS_BUCKET)
            await kv.put(entry.host, entry.encode())

        self._run(put())

    def delete_registry_entry(self, host: str) -> None:
        async def delete() -> None:
            client = await self._admin_client()
            kv = await client.jetstream().key_value(HOSTS_BUCKET)
            await kv.delete(host)

        self._run(delete())

    def wait_registered(
        self, names: Iterable[str], since_ns: int = 0, timeout: float = 20
    ) -> dict[str, HostEntry]:
        """Until every named host has an "up" entry with a heartbeat after `since_ns`."""
        wanted = list(names)
        found: dict[str, HostEntry] = {}

        def registered() -> bool:
            for name in wanted:
                agent = self._agents.get(name)
                if agent is not None and agent.process is not None and agent.process.poll() is not None:
                    raise RuntimeError(f"the agent of {name} exited: {agent.log_text()[-3000:]}")
            try:
                entries = self.registry()
            except Exception:
                return False  # NATS not back yet
            found.update(entries)
            return all(
                name in entries and entries[name].status == "up" and entries[name].heartbeat_ns > since_ns
                for name in wanted
            )

        wait_for(registered, timeout, f"hosts {', '.join(wanted)} to register")
        return found

    def nats_request(self, subject: str, data: bytes, timeout: float = 5, admin: bool = False) -> bytes:
        """One request/reply as the controller (or the admin): the reply's data."""

        async def request() -> bytes:
            creds = self.admin_credentials if admin else self.controller_credentials
            client = await nats.connect(self.nats_urls, **creds)
            try:
                reply = await client.request(subject, data, timeout=timeout)
                return bytes(reply.data)
            finally:
                await client.close()

        return self._run(request(), timeout + 10)

    def task(
        self,
        host: str,
        session: str,
        diagnostic: str = "drops",
        config: dict[str, Any] | None = None,
        deadline_s: float = 3.0,
        lifetime_s: float = 30.0,
        scope: Scope | None = None,
        budgets: Budgets | None = None,
        user: str = "lab",
        run_id: str | None = None,
    ) -> Task:
        """A task as the controller would make it: for the run of `host`'s agent now registered (the
        registry's run_id), unless `run_id` names another."""
        now = time.time()
        if run_id is None:
            if self._io is not None and threading.current_thread() is self._io.thread:
                raise RuntimeError(
                    "lab.task() reads the registry: call it outside the lab's loop, or pass run_id"
                )
            entry = self.registry_entry(host)
            run_id = entry.run_id if entry is not None else ""
        return Task(
            id=new_task_id(),
            session=session,
            host=host,
            diagnostic=diagnostic,
            config=config if config is not None else {},
            scope=scope if scope is not None else Scope(netns=(self.hosts[host].netns,)),
            issued_at=now,
            expires_at=now + lifetime_s,
            deadline_s=deadline_s,
            budgets=budgets or Budgets(),
            user=user,
            run_id=run_id,
        )

    def sign(self, task: Task) -> SignedTask:
        return SignedTask.sign(task, self.controller_key, self.key_id)


class DirectController:
    """The controller's side of the protocol, minimal and sync, speaking to NATS as the controller user:
    what the agent tests and the demo use to drive agents without the real controller (and to play one that
    misbehaves). Every status and record batch of the sessions it watches is kept, in arrival order."""

    def __init__(self, lab: FleetLab, credentials: dict[str, str] | None = None) -> None:
        self.lab = lab
        self._credentials = credentials or lab.controller_credentials
        self._client: Client | None = None
        self.statuses: dict[str, list[HostStatus]] = {}
        self.batches: dict[str, list[RecordBatch]] = {}
        self.audit: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> DirectController:
        async def connect() -> Client:
            return await nats.connect(
                self.lab.nats_urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2, **self._credentials
            )

        self._client = self.lab._run(connect())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self.lab._run(self._client.close(), 10)
            self._client = None

    @property
    def client(self) -> Client:
        assert self._client is not None, "use DirectController as a context manager"
        return self._client

    def watch(self, session: str) -> None:
        async def on_message(msg: Msg) -> None:
            with self._lock:
                if msg.subject.endswith((".status", ".progress")):
                    self.statuses.setdefault(session, []).append(
                        HostStatus.from_json(decode(msg.data, "status"))
                    )
                else:
                    self.batches.setdefault(session, []).append(
                        RecordBatch.from_json(decode(msg.data, "record batch"))
                    )

        async def subscribe() -> None:
            await self.client.subscribe(session_subjects(session), cb=on_message)
            await self.client.flush()

        self.lab._run(subscribe())

    def watch_audit(self) -> None:
        """Keep the agents' own refusal records (netsleuth.audit.agent.<host>) in `self.audit`."""

        async def on_message(msg: Msg) -> None:
            with self._lock:
                self.audit.append(json.loads(msg.data))

        async def subscribe() -> None:
            await self.client.subscribe("netsleuth.audit.agent.*", cb=on_message)
            await self.client.flush()

        self.lab._run(subscribe())

    def send(self, host: str, data: bytes, timeout: float = 5) -> TaskReply:
        async def request() -> bytes:
            reply = await self.client.request(task_subject(host), data, timeout=timeout)
            return bytes(reply.data)

        return TaskReply.from_json(decode(self.lab._run(request(), timeout + 5), "task reply"))

    def control(self, host: str, control: Control) -> None:
        async def publish() -> None:
            await self.client.publish(control_subject(host), control.encode())
            await self.client.flush()

        self.lab._run(publish())

    def states(self, session: str) -> dict[str, HostStatus]:
        """Each host's latest status."""
        with self._lock:
            return {status.host: status for status in self.statuses.get(session, [])}

    def history(self, session: str, host: str) -> list[str]:
        with self._lock:
            return [status.state for status in self.statuses.get(session, []) if status.host == host]

    def records(self, session: str, host: str) -> list[dict[str, Any]]:
        with self._lock:
            batches = sorted(
                (b for b in self.batches.get(session, []) if b.host == host), key=lambda b: b.seq
            )
        return [record for batch in batches for record in batch.records]

    def wait_states(self, session: str, wanted: dict[str, Iterable[str]], timeout: float = 30) -> None:
        """Until each host's latest state is one of its wanted states."""

        def reached() -> bool:
            states = self.states(session)
            return all(host in states and states[host].state in set(ok) for host, ok in wanted.items())

        wait_for(reached, timeout, f"session {session} to reach {wanted} (have {self.states(session)})")

    def run_session(self, session: str, hosts: Sequence[str], t0_delay_s: float = 0.3, **task: Any) -> int:
        """Prepare on every host, wait until all are ready, start them all at one T0; returns T0 (ns)."""
        self.watch(session)
        for host in hosts:
            reply = self.send(host, self.lab.sign(self.lab.task(host, session, **task)).encode())
            if not reply.accepted:
                raise RuntimeError(f"{host} refused the task: {reply.reason}")
        self.wait_states(session, {host: ("ready",) for host in hosts})
        t0_ns = time.time_ns() + int(t0_delay_s * 1e9)
        for host in hosts:
            self.control(host, Control(session, "start", t0_ns))
        return t0_ns


_LISTEN = (
    "import socket,sys\n"
    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind(('0.0.0.0',int(sys.argv[1])));s.listen(64);open(sys.argv[2],'w').close()\n"
    "while True: s.accept()[0].close()\n"
)
_CONNECT = (
    "import socket,sys\n"
    "s=socket.socket();s.settimeout(float(sys.argv[3]))\n"
    "try: s.connect((sys.argv[1],int(sys.argv[2]))); print('connected')\n"
    "except OSError as e: print(type(e).__name__)\n"
)


_ECHO = (
    "import socket,sys,threading\n"
    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind(('0.0.0.0',int(sys.argv[1])));s.listen(64);open(sys.argv[2],'w').close()\n"
    "def echo(c):\n"
    "  while (data:=c.recv(4096)): c.sendall(data)\n"
    "while True: threading.Thread(target=echo,args=(s.accept()[0],),daemon=True).start()\n"
)
# The seed-001 client: a long-lived connection through the VIP, proven up end to end by one echo; then the
# kernel's own next sequence numbers (TCP_REPAIR, read only: the socket leaves repair mode without a window
# probe) and one ACK of that connection sent 1 GiB ahead of them on a raw socket: out of any window, so the
# server's conntrack marks it INVALID. Prints what the application saw as JSON.
_INVALID_ACK = (
    "import json,socket,struct,sys\n"
    "vip,port,ahead,wait=sys.argv[1],int(sys.argv[2]),int(sys.argv[3]),float(sys.argv[4])\n"
    "s=socket.create_connection((vip,port),timeout=5);s.sendall(b'ping');assert s.recv(16)==b'ping'\n"
    "def seq(queue):\n"
    "  s.setsockopt(6,20,queue);return s.getsockopt(6,21)&0xffffffff\n"  # TCP_REPAIR_QUEUE, TCP_QUEUE_SEQ
    "s.setsockopt(6,19,1);snd,rcv=seq(2),seq(1);s.setsockopt(6,19,-1)\n"  # TCP_REPAIR on, off (no probe)
    "src,sport=s.getsockname()\n"
    "tcp=struct.pack('!HHIIBBHHH',sport,port,(snd+ahead)&0xffffffff,rcv,5<<4,0x10,502,0,0)\n"
    "words=socket.inet_aton(src)+socket.inet_aton(vip)+struct.pack('!BBH',0,6,len(tcp))+tcp\n"
    "total=sum(struct.unpack('!%dH'%(len(words)//2),words))\n"
    "while total>>16: total=(total&0xffff)+(total>>16)\n"
    "tcp=tcp[:16]+struct.pack('!H',~total&0xffff)+tcp[18:]\n"
    "raw=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_TCP);raw.sendto(tcp,(vip,0))\n"
    "s.settimeout(wait)\n"
    "try: seen='data' if s.recv(16) else 'closed'\n"
    "except OSError as e: seen=type(e).__name__\n"
    "print(json.dumps({'client':f'{src}:{sport}','snd_nxt':snd,'rcv_nxt':rcv,'ack_seq':(snd+ahead)&0xffffffff,"
    "'seen':seen}))\n"
)


def serve_story(lab: FleetLab) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """The seed-001 server: the application listening on APP_PORT and its sidecar (an echo) on
    SIDECAR_PORT, where the server's REDIRECT sends every connection to APP_PORT. Returns (app, sidecar)."""
    app = serve(lab, "server", APP_PORT)
    ready = lab.workdir / f"listen-server-{SIDECAR_PORT}"
    sidecar = lab.hosts["server"].ns.popen(["python3", "-c", _ECHO, str(SIDECAR_PORT), str(ready)])
    wait_for(ready.exists, 10, f"the sidecar on server:{SIDECAR_PORT}")
    return app, sidecar


def invalid_ack(lab: FleetLab, wait: float = 3.0, ahead: int = 1 << 30) -> dict[str, Any]:
    """The seed-001 story from the client: connect to VIP:STORY_VIP_PORT (lb DNATs it to the server's app
    port, the server REDIRECTs it to the sidecar), echo once, then send one ACK `ahead` bytes past the
    connection's sequence and wait up to `wait` s. {"client": "198.18.0.5:PORT", "snd_nxt", "rcv_nxt",
    "ack_seq", "seen": "ConnectionResetError" when the reset reached the application}."""
    argv = ("python3", "-c", _INVALID_ACK, VIP, str(STORY_VIP_PORT), str(ahead), str(wait))
    result: dict[str, Any] = json.loads(lab.hosts["client"].run(*argv).stdout)
    return result


def serve(lab: FleetLab, host: str, port: int) -> subprocess.Popen[bytes]:
    """A TCP listener in `host`'s namespace (killed with the namespace when the lab closes)."""
    ready = lab.workdir / f"listen-{host}-{port}"
    process = lab.hosts[host].ns.popen(["python3", "-c", _LISTEN, str(port), str(ready)])
    wait_for(ready.exists, 10, f"a listener on {host}:{port}")
    return process


def connect(lab: FleetLab, host: str, address: str, port: int, timeout: float = 1.0) -> str:
    """One TCP connect from `host`: "connected", "TimeoutError", "ConnectionRefusedError", ..."""
    return lab.hosts[host].run("python3", "-c", _CONNECT, address, str(port), str(timeout)).stdout.strip()


def session_fixture(lines: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A `netsleuth fleet run --json` stream turned back into what each host sent: the fixture the merge's
    unit tests replay (tests/fixtures/fleet/). Records as their hosts stamped them (`host_time`), each
    host's last clock offset and round trip, and its final state."""
    records: list[dict[str, Any]] = []
    offsets: dict[str, int] = {}
    states: dict[str, dict[str, Any]] = {}
    for line in lines:
        kind, host = line.get("type"), line.get("host")
        if kind == "status" and isinstance(host, str):
            if isinstance(line.get("offset_ns"), int):
                offsets[host] = line["offset_ns"]
            states[host] = {key: line.get(key) for key in ("state", "reason", "rtt_ns")}
        elif kind not in ("verdict", "end", "session", "conn_event") and isinstance(host, str):
            record = {
                k: v for k, v in line.items() if k not in ("host", "host_time", "flow", "claims_netns_of")
            }
            if "host_time" in line:
                record["time"] = line["host_time"]
            records.append({"host": host, "record": record})
    return {"offsets": offsets, "host_states": states, "records": records}


def _fleet_run(
    lab: FleetLab, controller: Any, diagnostic: str, duration: float, traffic: Callable[[], None], *extra: str
) -> str:
    """`netsleuth fleet run --hosts client,lb,server --proto tcp DIAGNOSTIC` as alice, with `traffic` once
    every host runs; its whole output."""
    argv = [PYTHON, "-m", "netsleuth", "fleet", "run", "--hosts", "client,lb,server", "--proto", "tcp"]
    argv += ["--duration", f"{duration:g}", diagnostic, *extra]
    run_log = lab.workdir / f"fleet-run-{diagnostic}.txt"
    with run_log.open("w") as out:
        fleet_run = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=controller.env("alice"))
        # (Preparing loads the diagnostic's BPF objects on every host; on a busy machine that takes a while.)
        running = '"running"' if "--json" in extra else ": running"
        try:
            wait_for(lambda: run_log.read_text().count(running) >= 3, 90, "all three hosts running")
        except TimeoutError:
            fleet_run.kill()
            print(run_log.read_text(), file=sys.stderr)
            raise
        traffic()
        fleet_run.wait(90)
    return run_log.read_text()


def _demo(lab: FleetLab, header: list[str]) -> int:
    """The seed-001 story on three hosts: the client's long-lived connection through the lb's DNAT to the
    server, whose REDIRECT sends it to a sidecar; one ACK out of window, which the server's conntrack marks
    INVALID, skips the REDIRECT, reaches the application's LISTEN socket and draws a RST that kills the
    connection. `netsleuth fleet run conn` watches all three; the merged verdict is printed first, then the
    lab, what the client's application saw and the whole run."""
    from tests.controller_lab import ControllerProcess

    serve_story(lab)
    seen: dict[str, Any] = {}
    with ControllerProcess(lab) as controller:
        output = _fleet_run(lab, controller, "conn", 5, lambda: seen.update(invalid_ack(lab)))
    lines = output.splitlines()
    verdict = [
        line
        for number, line in enumerate(lines)
        if line.startswith("VERDICT") or (line.startswith("  ") and _in_verdict(lines, number))
    ]
    print("\n".join(verdict) or "no merged verdict: see the run below")
    print()
    print("\n".join(header))
    print(
        f"client {seen.get('client')} -> {VIP}:{STORY_VIP_PORT} (lb: DNAT to :{APP_PORT}; server: REDIRECT "
        f"to the sidecar on :{SIDECAR_PORT}); one ACK 1 GiB ahead; the application saw: {seen.get('seen')}"
    )
    print(f"$ netsleuth fleet run --hosts client,lb,server --proto tcp --duration 5 conn\n{output}")
    return 0 if verdict else 1


def _in_verdict(lines: list[str], number: int) -> bool:
    """Is this indented line part of a VERDICT block (its hops and fixes)?"""
    while number > 0 and lines[number].startswith("  ") and not lines[number].startswith("VERDICT"):
        number -= 1
    return lines[number].startswith("VERDICT")


def _record(lab: FleetLab, path: Path) -> int:
    """`--record FILE`: one `conn` session over the three stories - the INVALID ACK (VIP:82), the firewall
    drop (VIP:80), the asymmetric reply (VIP:81) - written as the merge's unit-test fixture."""
    from tests.controller_lab import ControllerProcess

    serve_story(lab)
    serve(lab, "server", 8081)
    with ControllerProcess(lab) as controller:

        def stories() -> None:
            invalid_ack(lab)
            connect(lab, "client", VIP, 80, 1.5)
            connect(lab, "client", VIP, 81, 1.5)

        output = _fleet_run(lab, controller, "conn", 8, stories, "--json")
    fixture = session_fixture(json.loads(line) for line in output.splitlines() if line.startswith("{"))
    fixture["hostnames"] = {name: name for name in lab.hosts}
    path.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"{len(fixture['records'])} records from {len(fixture['host_states'])} hosts written to {path}")
    return 0


def _main() -> int:
    """`make fleet-demo` (--demo): the lab, a controller and one merged diagnosis; without --demo: bring the
    lab up, print it and keep it up until Enter (to poke at it by hand)."""
    if os.geteuid() != 0:
        print("the fleet lab needs root (namespaces, BPF): run `sudo make fleet-demo`", file=sys.stderr)
        return 1
    with FleetLab() as lab:
        header = [f"NATS {lab.nats_url} (config {lab.nats_config_path})"]
        for name, entry in sorted(lab.registry().items()):
            host = lab.hosts[name]
            header.append(
                f"  {name:<8} {host.address:<12} netns {host.netns:<14} agent pid {lab.agent(name).pid:<7} "
                f"kernel {entry.kernel}, {len(entry.diagnostics)} diagnostics, "
                f"clock offset {entry.offset_ns / 1e3:+.0f} us"
            )
        if "--demo" in sys.argv[1:]:
            return _demo(lab, header)
        print("\n".join(header))
        if "--record" in sys.argv[1:]:
            return _record(lab, Path(sys.argv[sys.argv.index("--record") + 1]))
        access = {"nats_url": lab.nats_url, **lab.controller_credentials, "key": lab.controller_key_text}
        print(json.dumps(access))
        if sys.stdin.isatty():
            with contextlib.suppress(KeyboardInterrupt):
                input("the lab is up; press Enter (or Ctrl-C) to tear it down\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
