"""The agent's `[fleet]` section: where NATS is, who this agent is there, which controller it obeys.

    [fleet]
    url = "nats://nats.example:4222"        # or several, comma-separated
    host_id = "node-a"                      # [a-z0-9-], this host's NATS subject token and registry key
    user = "agent-node-a"                   # user/password, or ...
    password_file = "/etc/netsleuth/fleet.password"
    # creds_file = "/etc/netsleuth/node-a.creds"   # ... a NATS .creds file (JWT + nkey), or
    # nkey_seed_file = "/etc/netsleuth/node-a.nk"  # ... an nkey seed
    controller_key = "ed25519:BASE64..."    # the controller's Ed25519 public key: tasks must be signed by it
    controller_key_id = "controller-1"
    netns = ""                              # empty: the whole host; a name: this agent's world is that netns
    heartbeat_seconds = 5
    [fleet.labels]
    zone = "a"

No `[fleet]` section: the agent never dials out. Secrets are read from files (never inline) and a file other
users can read is refused, like sessions.token_file. An nkey seed file must hold a NATS user seed (`SU...`,
e.g. from `nk -gen user` or nsc); the server lists the user by its public key (`U...`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from netsleuth.config_file import ConfigTable, read_secret
from netsleuth.errors import UsageError
from netsleuth.fleet.protocol import ProtocolError, public_key_from_text, validate_host_id

__all__ = ["FleetConfig", "login_refused", "lone_reset", "nkey_public_key", "parse_fleet"]

_NKEYS_MISSING = "needs the Python package nkeys, from the 'fleet' extra (pip install 'netsleuth[fleet]')"
_NKEY_KINDS = {"A": "account", "O": "operator", "N": "server", "C": "cluster"}


def nkey_public_key(path: Path, key: str) -> str:
    """The public key (U...) of the NATS user nkey whose seed `path` holds, or a one-sentence UsageError
    naming `key`. The seed is a private key: read like the other secrets (owner-only, not empty)."""
    # nats-py signs the server's nonce with the `nkeys` package, an optional dependency of nats-py.
    if importlib.util.find_spec("nkeys") is None:
        raise UsageError(f"{key} {_NKEYS_MISSING}")
    import nkeys

    seed = read_secret(path, key)
    try:
        public = bytes(nkeys.from_seed(bytearray(seed.encode())).public_key).decode()
    except (nkeys.NkeysError, ValueError):
        raise UsageError(f"{key} {path} does not hold an nkey seed (SU..., from `nk -gen user`)") from None
    if not public.startswith("U"):
        kind = _NKEY_KINDS.get(public[:1], "non-user")
        raise UsageError(f"{key} {path} holds the seed of an nkey of kind {kind}, not of a user (SU...)")
    return public


def login_identity(
    section: str,
    user: str | None,
    creds_file: Path | str | None,
    nkey_seed_file: Path | str | None,
    password_file: Path | str | None = None,
) -> str:
    """Who an agent (`section` "fleet") or the controller ("nats") logs in to NATS as, in the words of its
    config and never a secret: what a refused login names. The config allows one login method at most."""
    if nkey_seed_file is not None:
        try:
            public = nkey_public_key(Path(nkey_seed_file), f"{section}.nkey_seed_file")
        except UsageError as error:  # checked at load: only a file changed since can fail here
            return f"the nkey of {section}.nkey_seed_file ({error})"
        return f"nkey {public} ({section}.nkey_seed_file {nkey_seed_file})"
    if creds_file is not None:
        return f"the credentials of {section}.creds_file {creds_file}"
    if password_file is not None:
        return f"user {user!r} ({section}.password_file)"
    return f"user {user!r}" if user else "an anonymous client"


def login_refused(error: BaseException) -> bool:
    """Whether a nats-py error is the server refusing our credentials. nats-py reports it as a plain
    Error("nats: 'Authorization Violation'") while it first connects, as AuthorizationError later."""
    return type(error).__name__ == "AuthorizationError" or "authorization violation" in str(error).lower()


def lone_reset(error: BaseException, previous: BaseException | None) -> bool:
    """A connection reset after anything but another reset: not worth a log line. A server refusing a login
    closes the connection with our PING unread, so the reset can reach us instead of its -ERR (or right after
    it); nats-py tries again within a second and that attempt says what it was. Two in a row are news."""
    return isinstance(error, ConnectionResetError) and not isinstance(previous, ConnectionResetError)


def check_creds_file(path: Path, key: str) -> None:
    """A NATS .creds file (the user's JWT and nkey seed, as `nsc generate creds` writes it) is a secret like
    the others: it must exist, be owner-only and hold the JWT block nats-py sends; else one sentence naming
    `key`. Checked when the config loads, so a typo is not found at the first connect."""
    if "-----BEGIN NATS USER JWT-----" not in read_secret(path, key):
        raise UsageError(f"{key} {path} is not a NATS .creds file (no NATS USER JWT block)")


@dataclass(frozen=True)
class FleetConfig:
    urls: tuple[str, ...]
    host_id: str
    controller_key: Ed25519PublicKey = field(repr=False)
    controller_key_id: str = "controller-1"
    user: str = ""
    password_file: Path | None = None
    creds_file: Path | None = None
    nkey_seed_file: Path | None = None
    netns: str = ""
    heartbeat_seconds: float = 5.0
    labels: tuple[tuple[str, str], ...] = ()
    max_task_lifetime: float = 300.0  # expires_at - issued_at; bounds the replay memory

    def password(self) -> str | None:
        if self.password_file is None:
            return None
        return read_secret(self.password_file, "fleet.password_file")


def parse_fleet(table: ConfigTable) -> FleetConfig | None:
    """The [fleet] table (empty = no fleet link) -> FleetConfig, or a UsageError naming the key."""
    if not table.names():
        table.finish()
        return None
    url_text = table.string("url", "")
    urls = tuple(part.strip() for part in url_text.split(",") if part.strip())
    if not urls or not all(url.startswith(("nats://", "tls://")) for url in urls):
        raise table.error("fleet.url", "must be one or more nats:// or tls:// URLs", url_text)
    host_text = table.string("host_id", "")
    try:
        host_id = validate_host_id(host_text)
    except ProtocolError:
        raise table.error("fleet.host_id", "must be 1-63 of a-z, 0-9 and '-'", host_text) from None
    key_text = table.string("controller_key", "")
    try:
        controller_key = public_key_from_text(key_text)
    except ProtocolError as error:
        raise table.error("fleet.controller_key", f"is not an Ed25519 public key ({error})") from None
    files = {}
    for name in ("password_file", "creds_file", "nkey_seed_file"):
        text = table.string(name, "")
        files[name] = Path(text) if text else None
    user = table.string("user", "")
    if files["password_file"] is not None and not user:
        raise table.error("fleet.user", "must be set with fleet.password_file")
    if sum(1 for path in files.values() if path is not None) > 1:
        raise table.error("fleet", "takes one of password_file, creds_file or nkey_seed_file")
    for name in ("creds_file", "nkey_seed_file"):
        if files[name] is not None and importlib.util.find_spec("nkeys") is None:
            raise table.error(f"fleet.{name}", _NKEYS_MISSING)
    labels_table = table.table("labels")
    labels = []
    for name in labels_table.names():
        labels.append((name, labels_table.string(name, "")))
    labels_table.finish()
    config = FleetConfig(
        urls=urls,
        host_id=host_id,
        controller_key=controller_key,
        controller_key_id=table.string("controller_key_id", "controller-1"),
        user=user,
        password_file=files["password_file"],
        creds_file=files["creds_file"],
        nkey_seed_file=files["nkey_seed_file"],
        netns=table.string("netns", ""),
        heartbeat_seconds=table.number("heartbeat_seconds", 5.0, 0.2, 3600, "seconds"),
        labels=tuple(labels),
        max_task_lifetime=table.number("max_task_lifetime", 300.0, 1, 3600, "seconds"),
    )
    table.finish()
    # An unreadable secret is a config error now, not at the first connect.
    config.password()
    if config.nkey_seed_file is not None:
        nkey_public_key(config.nkey_seed_file, "fleet.nkey_seed_file")
    if config.creds_file is not None:
        check_creds_file(config.creds_file, "fleet.creds_file")
    return config
