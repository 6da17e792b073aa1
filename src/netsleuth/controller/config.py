"""The controller's configuration file (TOML) and its validation.

A mistake is one sentence naming the key (`roles.web.max_duration must be a number above 0 (got -3)`) and
exits 2 before anything listens. Unknown keys are errors: a typo must not silently widen or narrow a role.
Tokens are never in the file, only their hashes (`netsleuth controller hash-token`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netsleuth.diagnostics.registry import diagnostic_names
from netsleuth.errors import UsageError
from netsleuth.fleet.link_config import check_creds_file, nkey_public_key

__all__ = [
    "AlertsConfig",
    "AuditConfig",
    "ControllerConfig",
    "HttpConfig",
    "NatsConfig",
    "OidcConfig",
    "RoleConfig",
    "SessionsConfig",
    "UserConfig",
    "load_controller_config",
    "parse_controller_config",
]

_HASH = re.compile(r"^(sha256:[0-9a-f]{64}|scrypt:[0-9a-f]{32}:[0-9a-f]{64})$")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


@dataclass(frozen=True)
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = 8477


@dataclass(frozen=True)
class NatsConfig:
    url: str = "nats://127.0.0.1:4222"  # as written: one URL, or a cluster's, comma-separated
    urls: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    # Copies of each stream and bucket the controller creates: 3 on a three-server cluster (a server and its
    # disk can be lost), 1 on a single server.
    replicas: int = 1
    user: str | None = None
    password: str | None = None
    creds_file: str | None = None
    nkey_seed_file: str | None = None  # a NATS user nkey seed (SU...): the server lists its public key


@dataclass(frozen=True)
class OidcConfig:
    jwks_file: Path
    issuer: str
    audience: str
    user_claim: str = "sub"
    roles_claim: str = "roles"


@dataclass(frozen=True)
class RoleConfig:
    name: str
    diagnostics: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()  # host-id globs or label:key=value
    netns: tuple[str, ...] = ()  # namespace names/globs; "*" = any, including the host's own
    # Kubernetes namespaces (names/globs) whose pods on each host the role may see: the agent resolves them
    # to those pods' network namespaces at task time and holds the task there.
    k8s_namespaces: tuple[str, ...] = ()
    admin: bool = False
    max_concurrent: int = 1
    max_duration: float = 60.0
    max_hosts: int = 10


@dataclass(frozen=True)
class UserConfig:
    name: str
    token_hash: str
    roles: tuple[str, ...]


@dataclass(frozen=True)
class SessionsConfig:
    prepare_timeout: float = 15.0  # seconds for every host to load + attach (BTF, CO-RE) and answer
    start_margin: float = 0.5  # T0 = now + margin: every agent has the start message well before T0
    stale_after: float = 15.0  # a heartbeat older than this: the host is "stale"
    host_silence: float = 10.0  # a host that answers no ping for this long is failed (a dead one: at once)
    end_grace: float = 15.0  # after the deadline, how long a live host may take to drain and report its end
    history_max_age: float = 7 * 86400.0
    max_timeline: int = 100_000  # merged records kept per session; more are counted, not kept
    # Every session's record batches kept by the server (NETSLEUTH_RECORDS, the oldest go first): what a
    # controller merges from when it missed some, or took the session over. Reserved in nats-server's store.
    records_max_bytes: int = 1 << 30
    # A running session's lease: renewed every quarter of it by the controller that runs it; a controller
    # that stops renewing (it died) has its sessions taken over by another this long after.
    lease_seconds: float = 10.0


@dataclass(frozen=True)
class AuditConfig:
    """The bounds of the agents' audit stream (controller/streams.py); the controller's records have none."""

    agent_records_per_host: int = 1000  # each agent's subject keeps its newest this many records
    agent_max_bytes: int = 256 << 20  # every agent's records together: reserved in nats-server's store


@dataclass(frozen=True)
class AlertsConfig:
    """Alertmanager webhooks (docs/alerts.md): who may post them, what a firing alert may start, and where
    the verdict goes. The limits are counted in JetStream KV, so they hold over every controller."""

    principal: str  # the [[users]] name whose token Alertmanager sends; its roles bound every diagnosis
    diagnostic: str = "diagnose"  # run when an alert has no netsleuth_diagnostic annotation
    duration: float = 30.0  # seconds, when the annotation gives none
    dedup_window: float = 3600.0  # one alert (fingerprint) starts at most one diagnosis in this long
    window: float = 600.0  # the period the three counts below are over
    max_sessions: int = 5  # diagnoses alerts may start per window, all alerts and hosts together
    max_per_alert: int = 2  # per alert rule (alertname) per window
    max_per_host: int = 1  # per host per window
    notify_url: str | None = None  # the verdict is POSTed here as JSON (with a Slack-style "text")
    notify_token: str | None = field(default=None, repr=False)  # its bearer token (notify_token_file)
    public_url: str | None = None  # the UI's address in links to sessions (default: http://<listen>)


@dataclass(frozen=True)
class ControllerConfig:
    source: str
    signing_key_file: Path
    key_id: str
    http: HttpConfig = field(default_factory=HttpConfig)
    nats: NatsConfig = field(default_factory=NatsConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    users: tuple[UserConfig, ...] = ()
    roles: dict[str, RoleConfig] = field(default_factory=dict)
    oidc: OidcConfig | None = None
    alerts: AlertsConfig | None = None


def _table(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise UsageError(f"{where} must be a table")
    return data


def _check_keys(data: dict[str, Any], where: str, allowed: set[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        raise UsageError(f"unknown setting {prefix}{unknown[0]} (known: {', '.join(sorted(allowed))})")


def _string(data: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or not value:
        raise UsageError(f"{where}.{key} must be a non-empty string")
    return value


def _optional_string(data: dict[str, Any], key: str, where: str) -> str | None:
    return _string(data, key, where) if key in data else None


def _number(data: dict[str, Any], key: str, where: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise UsageError(f"{where}.{key} must be a number above 0 (got {value!r})")
    return float(value)


def _count(data: dict[str, Any], key: str, where: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{where}.{key} must be a whole number of at least 1 (got {value!r})")
    return value


def _strings(data: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise UsageError(f"{where}.{key} must be a list of non-empty strings")
    return tuple(value)


def _secret_file(data: dict[str, Any], key: str, where: str, base: Path) -> str | None:
    """The secret a `..._file` setting names (relative to the config's folder), stripped; None when unset."""
    name = _optional_string(data, key, where)
    if name is None:
        return None
    path = base / name
    try:
        return path.read_text().strip()
    except OSError as error:
        raise UsageError(f"{where}.{key} {path}: {error.strerror}") from error


def _http(data: dict[str, Any]) -> HttpConfig:
    _check_keys(data, "http", {"listen"})
    listen = _string(data, "listen", "http", "127.0.0.1:8477")
    host, colon, port = listen.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise UsageError(f"http.listen must be HOST:PORT (got {listen!r})")
    return HttpConfig(host=host.strip("[]"), port=int(port))


def _nats(data: dict[str, Any], base: Path) -> NatsConfig:
    allowed = {"url", "user", "password", "password_file", "creds_file", "nkey_seed_file", "replicas"}
    _check_keys(data, "nats", allowed)
    raw_url = data.get("url", "nats://127.0.0.1:4222")
    if isinstance(raw_url, list) and all(isinstance(item, str) for item in raw_url):
        raw_url = ",".join(raw_url)
    url = _string({"url": raw_url}, "url", "nats")
    urls = tuple(part.strip() for part in url.split(",") if part.strip())
    if not urls or not all(part.startswith(("nats://", "tls://")) for part in urls):
        raise UsageError(
            f"nats.url must be one or more nats:// or tls:// URLs, comma-separated or a list (got {url!r})"
        )
    replicas = data.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 5:
        raise UsageError(f"nats.replicas must be a whole number from 1 to 5 (got {replicas!r})")
    # One way to log in (or none, for a server without authorization): given two, which one counts would be
    # the server's choice; a user name beside a key file is a leftover that silently does nothing.
    logins = [key for key in ("password", "password_file", "creds_file", "nkey_seed_file") if key in data]
    if len(logins) > 1:
        raise UsageError(
            "nats takes one of password, password_file, creds_file or nkey_seed_file "
            f"(got {' and '.join(logins)})"
        )
    if "user" in data and logins and logins[0] in ("creds_file", "nkey_seed_file"):
        raise UsageError(f"nats.user goes with a password, not with nats.{logins[0]}: remove it")
    password = _secret_file(data, "password_file", "nats", base) or _optional_string(data, "password", "nats")
    creds = _optional_string(data, "creds_file", "nats")
    creds_path = base / creds if creds is not None else None
    if creds_path is not None:
        check_creds_file(creds_path, "nats.creds_file")
    seed = _optional_string(data, "nkey_seed_file", "nats")
    seed_path = base / seed if seed is not None else None
    if seed_path is not None:
        nkey_public_key(seed_path, "nats.nkey_seed_file")  # missing, unreadable or not a seed: say so now
    return NatsConfig(
        url=url,
        urls=urls,
        replicas=replicas,
        user=_optional_string(data, "user", "nats"),
        password=password,
        creds_file=str(creds_path) if creds_path is not None else None,
        nkey_seed_file=str(seed_path) if seed_path is not None else None,
    )


def _sessions(data: dict[str, Any]) -> SessionsConfig:
    allowed = {
        "prepare_timeout",
        "start_margin",
        "stale_after",
        "host_silence",
        "end_grace",
        "history_max_age",
        "max_timeline",
        "records_max_bytes",
        "lease_seconds",
    }
    _check_keys(data, "sessions", allowed)
    defaults = SessionsConfig()
    return SessionsConfig(
        prepare_timeout=_number(data, "prepare_timeout", "sessions", defaults.prepare_timeout),
        start_margin=_number(data, "start_margin", "sessions", defaults.start_margin),
        stale_after=_number(data, "stale_after", "sessions", defaults.stale_after),
        host_silence=_number(data, "host_silence", "sessions", defaults.host_silence),
        end_grace=_number(data, "end_grace", "sessions", defaults.end_grace),
        history_max_age=_number(data, "history_max_age", "sessions", defaults.history_max_age),
        max_timeline=_count(data, "max_timeline", "sessions", defaults.max_timeline),
        records_max_bytes=_count(data, "records_max_bytes", "sessions", defaults.records_max_bytes),
        lease_seconds=_number(data, "lease_seconds", "sessions", defaults.lease_seconds),
    )


def _audit(data: dict[str, Any]) -> AuditConfig:
    _check_keys(data, "audit", {"agent_records_per_host", "agent_max_bytes"})
    defaults = AuditConfig()
    return AuditConfig(
        agent_records_per_host=_count(
            data, "agent_records_per_host", "audit", defaults.agent_records_per_host
        ),
        agent_max_bytes=_count(data, "agent_max_bytes", "audit", defaults.agent_max_bytes),
    )


def _role(name: str, data: dict[str, Any]) -> RoleConfig:
    where = f"roles.{name}"
    allowed = {
        "diagnostics",
        "hosts",
        "netns",
        "k8s_namespaces",
        "admin",
        "max_concurrent",
        "max_duration",
        "max_hosts",
    }
    _check_keys(data, where, allowed)
    admin = data.get("admin", False)
    if not isinstance(admin, bool):
        raise UsageError(f"{where}.admin must be true or false")
    for selector in _strings(data, "hosts", where):
        if selector.startswith("label:") and "=" not in selector:
            raise UsageError(f"{where}.hosts: {selector!r} must be label:KEY=VALUE")
    defaults = RoleConfig(name=name)
    return RoleConfig(
        name=name,
        diagnostics=_strings(data, "diagnostics", where),
        hosts=_strings(data, "hosts", where),
        netns=_strings(data, "netns", where),
        k8s_namespaces=_strings(data, "k8s_namespaces", where),
        admin=admin,
        max_concurrent=_count(data, "max_concurrent", where, defaults.max_concurrent),
        max_duration=_number(data, "max_duration", where, defaults.max_duration),
        max_hosts=_count(data, "max_hosts", where, defaults.max_hosts),
    )


def _user(index: int, data: dict[str, Any], roles: dict[str, RoleConfig]) -> UserConfig:
    where = f"users[{index}]"
    _check_keys(data, where, {"name", "token_hash", "roles"})
    name = _string(data, "name", where)
    if not _NAME.match(name):
        raise UsageError(f"{where}.name {name!r} may hold only letters, digits and _.@-")
    token_hash = _string(data, "token_hash", where)
    if not _HASH.match(token_hash):
        raise UsageError(
            f"{where}.token_hash must be the output of `netsleuth controller hash-token` "
            "(sha256:... or scrypt:...)"
        )
    user_roles = _strings(data, "roles", where)
    for role in user_roles:
        if role not in roles:
            raise UsageError(f"{where}.roles names role {role!r}, which no [roles.{role}] table defines")
    return UserConfig(name=name, token_hash=token_hash, roles=user_roles)


def _oidc(data: dict[str, Any], base: Path) -> OidcConfig:
    _check_keys(data, "oidc", {"jwks_file", "issuer", "audience", "user_claim", "roles_claim"})
    jwks = base / _string(data, "jwks_file", "oidc")
    if not jwks.is_file():
        raise UsageError(f"oidc.jwks_file {jwks} does not exist")
    return OidcConfig(
        jwks_file=jwks,
        issuer=_string(data, "issuer", "oidc"),
        audience=_string(data, "audience", "oidc"),
        user_claim=_string(data, "user_claim", "oidc", "sub"),
        roles_claim=_string(data, "roles_claim", "oidc", "roles"),
    )


def _url(data: dict[str, Any], key: str, where: str) -> str | None:
    value = _optional_string(data, key, where)
    if value is not None and not value.startswith(("http://", "https://")):
        raise UsageError(f"{where}.{key} must be an http:// or https:// URL (got {value!r})")
    return value.rstrip("/") if value is not None else None


def _alerts(data: dict[str, Any], base: Path, users: tuple[UserConfig, ...]) -> AlertsConfig:
    allowed = {
        "principal", "diagnostic", "duration", "dedup_window", "window", "max_sessions", "max_per_alert",
        "max_per_host", "notify_url", "notify_token_file", "public_url",
    }  # fmt: skip
    _check_keys(data, "alerts", allowed)
    principal = _string(data, "principal", "alerts")
    if principal not in {user.name for user in users}:
        raise UsageError(
            f"alerts.principal names user {principal!r}, which no [[users]] entry defines "
            "(give Alertmanager its own user and role)"
        )
    defaults = AlertsConfig(principal=principal)
    diagnostic = _string(data, "diagnostic", "alerts", defaults.diagnostic)
    if diagnostic not in diagnostic_names():
        raise UsageError(
            f"alerts.diagnostic {diagnostic!r} is not a diagnostic ({', '.join(diagnostic_names())})"
        )
    token = _secret_file(data, "notify_token_file", "alerts", base)
    notify_url = _url(data, "notify_url", "alerts")
    if token is not None and notify_url is None:
        raise UsageError("alerts.notify_token_file is set but alerts.notify_url is not")
    return AlertsConfig(
        principal=principal,
        diagnostic=diagnostic,
        duration=_number(data, "duration", "alerts", defaults.duration),
        dedup_window=_number(data, "dedup_window", "alerts", defaults.dedup_window),
        window=_number(data, "window", "alerts", defaults.window),
        max_sessions=_count(data, "max_sessions", "alerts", defaults.max_sessions),
        max_per_alert=_count(data, "max_per_alert", "alerts", defaults.max_per_alert),
        max_per_host=_count(data, "max_per_host", "alerts", defaults.max_per_host),
        notify_url=notify_url,
        notify_token=token,
        public_url=_url(data, "public_url", "alerts"),
    )


def parse_controller_config(data: dict[str, Any], source: str, base: Path) -> ControllerConfig:
    """`base`: where relative file names in the config are resolved (the config file's directory)."""
    sections = {"http", "nats", "signing", "sessions", "audit", "users", "roles", "oidc", "alerts"}
    _check_keys(data, "", sections)
    signing = _table(data.get("signing"), "signing") if "signing" in data else None
    if signing is None:
        raise UsageError(
            "the [signing] table with key_file (the controller's Ed25519 private key) is missing"
        )
    _check_keys(signing, "signing", {"key_file", "key_id"})
    key_file = base / _string(signing, "key_file", "signing")
    if not key_file.is_file():
        raise UsageError(
            f"signing.key_file {key_file} does not exist (create it: netsleuth controller new-key)"
        )
    roles = {
        name: _role(name, _table(table, f"roles.{name}"))
        for name, table in _table(data.get("roles", {}), "roles").items()
    }
    users_data = data.get("users", [])
    if not isinstance(users_data, list):
        raise UsageError("users must be an array of tables ([[users]])")
    users = tuple(_user(i, _table(entry, f"users[{i}]"), roles) for i, entry in enumerate(users_data))
    names = [user.name for user in users]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        raise UsageError(f"user {duplicate!r} is defined twice")
    oidc = _oidc(_table(data["oidc"], "oidc"), base) if "oidc" in data else None
    if not users and oidc is None:
        raise UsageError("no [[users]] and no [oidc]: nobody could ever log in")
    return ControllerConfig(
        source=source,
        signing_key_file=key_file,
        key_id=_string(signing, "key_id", "signing", "controller-1"),
        http=_http(_table(data.get("http", {}), "http")),
        nats=_nats(_table(data.get("nats", {}), "nats"), base),
        sessions=_sessions(_table(data.get("sessions", {}), "sessions")),
        audit=_audit(_table(data.get("audit", {}), "audit")),
        users=users,
        roles=roles,
        oidc=oidc,
        alerts=_alerts(_table(data["alerts"], "alerts"), base, users) if "alerts" in data else None,
    )


def load_controller_config(path: Path) -> ControllerConfig:
    try:
        text = path.read_text()
    except OSError as error:
        raise UsageError(f"cannot read the controller config {path}: {error.strerror}") from error
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{path} is not valid TOML: {error}") from error
    return parse_controller_config(data, str(path), path.resolve().parent)
