"""The agent's configuration file (TOML, read with the standard library's tomllib) and its validation.

Every setting has a default, so an empty file (or none) is a working agent. A mistake is one sentence that
names the key (`sessions.max_duration must be a number from 1 to 86400 seconds (got -3)`) and exits 2,
before anything is attached. Unknown keys are errors too: a typo must not silently leave a limit at its
default.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netsleuth.config_file import ConfigTable, read_secret
from netsleuth.diagnostics.drops.exporter_config import DropsExporterConfig
from netsleuth.errors import UsageError
from netsleuth.packet import endpoint_text

if TYPE_CHECKING:
    from netsleuth.fleet.link_config import FleetConfig

__all__ = [
    "AgentConfig",
    "DropsExporterConfig",
    "ExporterConfig",
    "InterruptsExporterConfig",
    "ListenAddress",
    "NicExporterConfig",
    "SessionLimits",
    "load_config",
    "parse_config",
]

DEFAULT_LISTEN = "127.0.0.1:9478"
DEFAULT_SOCKET = "/run/netsleuth/agent.sock"


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return endpoint_text(self.host, self.port)


@dataclass(frozen=True)
class NicExporterConfig:
    enabled: bool = True
    max_devices: int = 256
    exclude_devices: str = ""  # a regular expression; matching interfaces are not exported


@dataclass(frozen=True)
class InterruptsExporterConfig:
    enabled: bool = True
    per_cpu: bool = False  # one series per IRQ and CPU: precise, but IRQs x CPUs series on big machines


@dataclass(frozen=True)
class DnsExporterConfig:
    # Off by default: its socket programs run for every packet of every socket on the host.
    enabled: bool = False
    server_series: int = 20  # DNS servers with their own series; the rest are summed as server="other"
    timeout: float = 5.0  # seconds without an answer before a query counts as a timeout


@dataclass(frozen=True)
class ExporterConfig:
    drops: DropsExporterConfig = field(default_factory=DropsExporterConfig)
    dns: DnsExporterConfig = field(default_factory=DnsExporterConfig)
    tcp: bool = True  # TCP/UDP counters of /proc/net/snmp and /proc/net/netstat
    nic: NicExporterConfig = field(default_factory=NicExporterConfig)
    softnet: bool = True
    interrupts: InterruptsExporterConfig = field(default_factory=InterruptsExporterConfig)
    conntrack: bool = True


@dataclass(frozen=True)
class SessionLimits:
    """What one session may use at most; a request may ask for less, never for more."""

    enabled: bool = True
    max_concurrent: int = 4
    default_duration: float = 30.0
    max_duration: float = 300.0
    max_events: int = 100_000
    max_bytes: int = 64 << 20
    cpu_budget_percent: float = 5.0  # of one CPU, spent by the session's BPF programs (bpf_stats)
    token_file: Path | None = None  # set: the session API is also served on `listen`, bearer token required


@dataclass(frozen=True)
class AgentConfig:
    listen: ListenAddress = field(default_factory=lambda: _parse_listen(DEFAULT_LISTEN, "agent.listen"))
    socket: Path | None = Path(DEFAULT_SOCKET)
    socket_mode: int = 0o660
    bpf_stats: bool = True
    exporter: ExporterConfig = field(default_factory=ExporterConfig)
    sessions: SessionLimits = field(default_factory=SessionLimits)
    fleet: FleetConfig | None = None  # [fleet]: dial out to NATS and take signed tasks (fleet/link_config.py)
    source: str = "defaults"

    def token(self) -> str | None:
        """The session API token, read at start (so a rotated file takes effect on restart)."""
        if self.sessions.token_file is None:
            return None
        return _read_token(self.sessions.token_file)


def _parse_listen(text: str, key: str, source: str = "defaults") -> ListenAddress:
    host, _, port_text = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    problem = f"config {source}: {key} must be HOST:PORT with an IP address and a port from 0 to 65535"
    if not host or not port_text.isdigit() or int(port_text) > 65535:
        raise UsageError(f"{problem} (got {text!r})")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"{problem} (got {text!r})") from None
    return ListenAddress(host, int(port_text))


def _read_token(path: Path) -> str:
    return read_secret(path, "sessions.token_file", min_length=16)


def _exporter(table: ConfigTable) -> ExporterConfig:
    drops_table = table.table("drops")
    drops = DropsExporterConfig(
        enabled=drops_table.boolean("enabled", True),
        netns_series=drops_table.integer("netns_series", 50, 1, 10_000),
        location_series=drops_table.integer("location_series", 100, 1, 10_000),
        retire_netns_after=drops_table.number("retire_netns_after", 300.0, 0, 86_400 * 7, "seconds"),
    )
    drops_table.finish()
    dns_table = table.table("dns")
    dns = DnsExporterConfig(
        enabled=dns_table.boolean("enabled", False),
        server_series=dns_table.integer("server_series", 20, 1, 10_000),
        timeout=dns_table.number("timeout", 5.0, 0.1, 3600, "seconds"),
    )
    dns_table.finish()
    nic_table = table.table("nic")
    exclude = nic_table.string("exclude_devices", "")
    try:
        re.compile(exclude)
    except re.error as error:
        raise nic_table.error(
            "exporter.nic.exclude_devices", f"is not a regular expression: {error}"
        ) from None
    nic = NicExporterConfig(
        enabled=nic_table.boolean("enabled", True),
        max_devices=nic_table.integer("max_devices", 256, 1, 100_000),
        exclude_devices=exclude,
    )
    nic_table.finish()
    interrupts_table = table.table("interrupts")
    interrupts = InterruptsExporterConfig(
        enabled=interrupts_table.boolean("enabled", True),
        per_cpu=interrupts_table.boolean("per_cpu", False),
    )
    interrupts_table.finish()
    simple = {}
    for name in ("tcp", "softnet", "conntrack"):
        section = table.table(name)
        simple[name] = section.boolean("enabled", True)
        section.finish()
    table.finish()
    return ExporterConfig(
        drops=drops,
        dns=dns,
        tcp=simple["tcp"],
        nic=nic,
        softnet=simple["softnet"],
        interrupts=interrupts,
        conntrack=simple["conntrack"],
    )


def _sessions(table: ConfigTable) -> SessionLimits:
    max_duration = table.number("max_duration", 300.0, 1, 86_400, "seconds")
    default_duration = table.number("default_duration", min(30.0, max_duration), 0.1, 86_400, "seconds")
    if default_duration > max_duration:
        raise table.error(
            "sessions.default_duration", f"must not exceed sessions.max_duration ({max_duration:g})"
        )
    token_file = table.string("token_file", "")
    limits = SessionLimits(
        enabled=table.boolean("enabled", True),
        max_concurrent=table.integer("max_concurrent", 4, 1, 64),
        default_duration=default_duration,
        max_duration=max_duration,
        max_events=table.integer("max_events", 100_000, 1, 100_000_000),
        max_bytes=table.integer("max_bytes", 64 << 20, 1024, 1 << 40, "bytes"),
        cpu_budget_percent=table.number("cpu_budget_percent", 5.0, 0.01, 100, "percent of one CPU"),
        token_file=Path(token_file) if token_file else None,
    )
    table.finish()
    return limits


def _fleet(table: ConfigTable) -> FleetConfig | None:
    """The [fleet] section; the fleet link (nats-py, cryptography) is in the `fleet` extra, and an agent
    without that section needs none of it."""
    if not table.names():
        table.finish()
        return None
    from netsleuth.extras import require_extra

    require_extra("fleet", "the agent's [fleet] section")
    from netsleuth.fleet.link_config import parse_fleet

    return parse_fleet(table)


def parse_config(raw: dict[str, Any], source: str = "defaults") -> AgentConfig:
    """A parsed TOML document -> AgentConfig, or a UsageError naming the first bad key."""
    root = ConfigTable(raw, "", source)
    agent = root.table("agent")
    listen = _parse_listen(agent.string("listen", DEFAULT_LISTEN), "agent.listen", source)
    socket_text = agent.string("socket", DEFAULT_SOCKET)
    mode_text = agent.string("socket_mode", "0660")
    if not re.fullmatch(r"0?[0-7]{3}", mode_text):
        raise agent.error("agent.socket_mode", 'must be an octal file mode such as "0660"', mode_text)
    bpf_stats = agent.boolean("bpf_stats", True)
    agent.finish()
    exporter = _exporter(root.table("exporter"))
    sessions = _sessions(root.table("sessions"))
    fleet = _fleet(root.table("fleet"))
    root.finish()
    config = AgentConfig(
        listen=listen,
        socket=Path(socket_text) if socket_text else None,
        socket_mode=int(mode_text, 8),
        bpf_stats=bpf_stats,
        exporter=exporter,
        sessions=sessions,
        fleet=fleet,
        source=source,
    )
    config.token()  # a token file that cannot serve is a config error now, not at the first session
    return config


def load_config(path: Path | None) -> AgentConfig:
    """Read and validate the file; None means every default."""
    if path is None:
        return parse_config({})
    try:
        text = path.read_text()
    except OSError as error:
        raise UsageError(f"cannot read config {path}: {error.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"config {path} is not valid TOML: {error}") from None
    return parse_config(raw, str(path))
