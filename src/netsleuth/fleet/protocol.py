"""The fleet wire protocol: NATS subjects, the messages agents and the controller exchange, and the Ed25519
signature that lets an agent trust a task whoever delivered it.

Every message is JSON. `from_json` validates and raises `ProtocolError` (a UsageError: one sentence naming
the field) on anything malformed, so a bad message is refused with a reason, never a traceback. The
signature covers the canonical JSON of the task object exactly as received (sorted keys, no spaces:
`canonical_json`; docs/fleet.md, "Wire protocol"), so verification does not depend on how either side
normalises numbers.

Subjects (`<host>` and `<session>` are single NATS tokens, see HOST_ID_PATTERN):
    netsleuth.host.<host>.task                 controller -> agent, request/reply: SignedTask -> TaskReply
    netsleuth.host.<host>.control              controller -> agent: Control (start at T0, cancel)
    netsleuth.host.<host>.ping                 controller -> agent, request/reply: {} -> PingReply
    netsleuth.session.<session>.<host>.status  agent -> controller: HostStatus
    netsleuth.session.<session>.<host>.records agent -> controller: RecordBatch
    netsleuth.session.<session>.<host>.progress agent -> controller: HostStatus preparing/running (not stored)
    netsleuth.audit.agent.<host>               agent -> stream NETSLEUTH_AUDIT_AGENTS: its refusals
    netsleuth.audit.controller.<decision>      controller -> stream NETSLEUTH_AUDIT: its decisions
    KV bucket netsleuth_hosts, key <host>      agent: HostEntry (heartbeat)

Whatever an agent sends belongs to the host its subject names (the only host its NATS login may publish
as): a `host` or `session` inside a body is checked against the subject, never believed instead of it.
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from netsleuth.errors import UsageError

__all__ = [
    "AGENT_AUDIT_MAX_RECORD",
    "AGENT_AUDIT_STREAM",
    "AGENT_AUDIT_SUBJECTS",
    "ALERTS_BUCKET",
    "AUDIT_STREAM",
    "AUDIT_SUBJECTS",
    "ENFORCED_SCOPES",
    "HOSTS_BUCKET",
    "HOST_ID_PATTERN",
    "HOST_STATES",
    "OWNERS_BUCKET",
    "PROTOCOL_VERSION",
    "RECORDS_STREAM",
    "RECORDS_SUBJECTS",
    "SESSIONS_STREAM",
    "SESSIONS_SUBJECTS",
    "STATUS_STREAM",
    "STATUS_SUBJECTS",
    "Budgets",
    "Control",
    "HostEntry",
    "HostStatus",
    "PingReply",
    "ProtocolError",
    "RecordBatch",
    "Scope",
    "SignedTask",
    "Task",
    "TaskReply",
    "agent_audit_subject",
    "canonical_json",
    "control_subject",
    "decode",
    "generate_private_key",
    "host_subjects",
    "new_run_id",
    "new_task_id",
    "parse_session_subject",
    "ping_subject",
    "private_key_from_text",
    "private_key_to_text",
    "progress_subject",
    "public_key_from_text",
    "public_key_to_text",
    "records_subject",
    "session_subjects",
    "status_subject",
    "task_subject",
    "validate_host_id",
    "validate_session_id",
]

PROTOCOL_VERSION: Final = 1
PREFIX: Final = "netsleuth"
HOSTS_BUCKET: Final = "netsleuth_hosts"
ALERTS_BUCKET: Final = "netsleuth_alerts"  # the controllers' alert ledger (controller/alert_state.py)
# The controller's decisions and the agents' refusals are two streams: each agent's subject is bounded (how
# many records, how big) and may discard its own oldest records; the controller's never (controller/streams).
AUDIT_STREAM: Final = "NETSLEUTH_AUDIT"
AUDIT_SUBJECTS: Final = "netsleuth.audit.controller.>"
AGENT_AUDIT_STREAM: Final = "NETSLEUTH_AUDIT_AGENTS"
AGENT_AUDIT_SUBJECTS: Final = "netsleuth.audit.agent.*"
AGENT_AUDIT_MAX_RECORD: Final = 16 << 10  # bytes: the stream refuses more; an agent's own records are ~1 KiB
SESSIONS_STREAM: Final = "NETSLEUTH_SESSIONS"
SESSIONS_SUBJECTS: Final = "netsleuth.history.>"
# Every host's last status of every session, kept by the server: a controller that restarts mid-session reads
# back the end each agent reported while it was down.
STATUS_STREAM: Final = "NETSLEUTH_STATUS"
STATUS_SUBJECTS: Final = "netsleuth.session.*.*.status"
# Every record batch of every session, kept by the server: what a controller that missed some (its server
# died, it took the session over from another controller) merges from.
RECORDS_STREAM: Final = "NETSLEUTH_RECORDS"
RECORDS_SUBJECTS: Final = "netsleuth.session.*.*.records"
# Which controller runs each session: a lease per session, in a KV bucket whose max age expires it
# (controller/leases.py).
OWNERS_BUCKET: Final = "netsleuth_session_owners"
# One NATS subject token that is also a KV key and a DNS-label-like name: no dots, wildcards or spaces.
HOST_ID_PATTERN: Final = r"[a-z0-9][a-z0-9-]{0,62}"
_HOST_ID = re.compile(HOST_ID_PATTERN)
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
HOST_STATES: Final = ("preparing", "ready", "running", "ended", "failed", "rejected")
HostState = Literal["preparing", "ready", "running", "ended", "failed", "rejected"]
_MAX_LIST = 1024  # list entries: a bound, so one message cannot make us allocate without end


class ProtocolError(UsageError):
    """A fleet message that is malformed, unsigned, forged, expired or otherwise not acceptable."""


# -- subjects ----------------------------------------------------------------------------------------------
def validate_host_id(host: object) -> str:
    if not isinstance(host, str) or not _HOST_ID.fullmatch(host):
        raise ProtocolError(
            f"a host id must be 1-63 lower-case letters, digits or '-', starting with a letter or digit "
            f"(got {host!r})"
        )
    return host


def validate_session_id(session: object) -> str:
    if not isinstance(session, str) or not _SESSION_ID.fullmatch(session):
        raise ProtocolError(
            f"a session id must be 1-64 letters, digits, '_' or '-', starting with a letter or digit "
            f"(got {session!r})"
        )
    return session


def task_subject(host: str) -> str:
    return f"{PREFIX}.host.{validate_host_id(host)}.task"


def control_subject(host: str) -> str:
    return f"{PREFIX}.host.{validate_host_id(host)}.control"


def ping_subject(host: str) -> str:
    return f"{PREFIX}.host.{validate_host_id(host)}.ping"


def agent_audit_subject(host: str) -> str:
    """Where an agent records its own refusals (captured by the controller's audit stream)."""
    return f"{PREFIX}.audit.agent.{validate_host_id(host)}"


def host_subjects(host: str) -> str:
    """Everything addressed to one agent (its subscribe permission)."""
    return f"{PREFIX}.host.{validate_host_id(host)}.>"


def status_subject(session: str, host: str) -> str:
    return f"{PREFIX}.session.{validate_session_id(session)}.{validate_host_id(host)}.status"


def records_subject(session: str, host: str) -> str:
    return f"{PREFIX}.session.{validate_session_id(session)}.{validate_host_id(host)}.records"


def progress_subject(session: str, host: str) -> str:
    """A status on its way (preparing, running): for the controller's live view, stored by no stream - each
    is superseded by the next, and the stored `ready` and `ended` say what a controller taking over needs."""
    return f"{PREFIX}.session.{validate_session_id(session)}.{validate_host_id(host)}.progress"


def session_subjects(session: str) -> str:
    """Every host's status and records of one session (what the controller subscribes to)."""
    return f"{PREFIX}.session.{validate_session_id(session)}.>"


def parse_session_subject(subject: str) -> tuple[str, str, str] | None:
    """(session, host, kind) of `netsleuth.session.<session>.<host>.<kind>`, or None for any other subject.
    The host is the sender: an agent's NATS login may publish only under its own host token."""
    parts = subject.split(".")
    if len(parts) != 5 or parts[0] != PREFIX or parts[1] != "session":
        return None
    return parts[2], parts[3], parts[4]


# -- validation helpers ------------------------------------------------------------------------------------
class _Fields:
    """One JSON object being read: typed getters that raise a sentence naming `where.key`."""

    def __init__(self, raw: object, where: str) -> None:
        if not isinstance(raw, dict):
            raise ProtocolError(f"{where} must be a JSON object (got {type(raw).__name__})")
        self.raw: dict[str, Any] = raw
        self.where = where

    def _bad(self, key: str, what: str) -> ProtocolError:
        value = self.raw.get(key)
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        return ProtocolError(f"{self.where}.{key} must be {what} (got {shown})")

    def has(self, key: str) -> bool:
        return key in self.raw

    def string(self, key: str, default: str | None = None, max_len: int = 4096) -> str:
        if key not in self.raw and default is not None:
            return default
        value = self.raw.get(key)
        if not isinstance(value, str) or len(value) > max_len:
            raise self._bad(key, f"a string of at most {max_len} characters")
        return value

    def optional_string(self, key: str) -> str | None:
        value = self.raw.get(key)
        return None if value is None else self.string(key)

    def integer(self, key: str, default: int | None = None, minimum: int = 0) -> int:
        if key not in self.raw and default is not None:
            return default
        value = self.raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._bad(key, f"an integer of at least {minimum}")
        return value

    def signed_integer(self, key: str, default: int | None = None) -> int:
        if key not in self.raw and default is not None:
            return default
        value = self.raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "an integer")
        return value

    def number(self, key: str, default: float | None = None, minimum: float = 0.0) -> float:
        if key not in self.raw and default is not None:
            return default
        value = self.raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= minimum:
            raise self._bad(key, f"a number of at least {minimum:g}")
        return float(value)

    def boolean(self, key: str, default: bool | None = None) -> bool:
        if key not in self.raw and default is not None:
            return default
        value = self.raw.get(key)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def obj(self, key: str, default: dict[str, Any] | None = None) -> dict[str, Any]:
        if key not in self.raw and default is not None:
            return default
        value = self.raw.get(key)
        if not isinstance(value, dict):
            raise self._bad(key, "a JSON object")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.raw.get(key, [])
        if (
            not isinstance(value, list)
            or len(value) > _MAX_LIST
            or not all(isinstance(item, str) and 0 < len(item) <= 256 for item in value)
        ):
            raise self._bad(key, f"a list of at most {_MAX_LIST} non-empty strings")
        return tuple(value)

    def objects(self, key: str) -> list[dict[str, Any]]:
        value = self.raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise self._bad(key, "a list of JSON objects")
        return value


def decode(data: bytes | str, what: str) -> object:
    """Bytes off the wire -> a JSON value, or one sentence saying it is not JSON."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise ProtocolError(f"the {what} is not valid JSON: {error}") from None


def canonical_json(value: object) -> bytes:
    """The bytes that are signed: sorted keys, no whitespace (docs/fleet.md; the agent checks these bytes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _dump(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def new_task_id() -> str:
    return uuid.uuid4().hex


def new_run_id() -> str:
    """One run of an agent process: in its registry entry, and in every task the controller signs for it."""
    return uuid.uuid4().hex


# -- keys --------------------------------------------------------------------------------------------------
# Keys travel as text in config files: base64 of the 32 raw bytes (RFC 8032 encoding), optionally prefixed
# "ed25519:" so a key pasted into the wrong setting is recognisable.
def _key_bytes(text: str, what: str) -> bytes:
    body = text.strip().removeprefix("ed25519:")
    try:
        raw = base64.b64decode(body, validate=True)
    except ValueError:
        raise ProtocolError(f"the {what} is not base64 (expected 32 bytes, 44 characters)") from None
    if len(raw) != 32:
        raise ProtocolError(f"the {what} must be 32 bytes of base64 (got {len(raw)} bytes)")
    return raw


def public_key_from_text(text: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(_key_bytes(text, "controller public key"))


def private_key_from_text(text: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(_key_bytes(text, "controller private key"))


def public_key_to_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + base64.b64encode(raw).decode()


def private_key_to_text(key: Ed25519PrivateKey) -> str:
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return "ed25519:" + base64.b64encode(raw).decode()


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


# -- the task ----------------------------------------------------------------------------------------------
# The kinds of scope this version's agents hold (fleet/admission.py), as their registry entry tells the
# controller (HostEntry.scopes): "k8s_namespaces" is sent only to an agent that lists it.
ENFORCED_SCOPES = ("netns", "addresses", "k8s_namespaces")


@dataclass(frozen=True)
class Scope:
    """Where a task may look, as the controller's roles granted it: `netns` names (or "*": every namespace
    of the host), `k8s_namespaces` Kubernetes namespaces whose pods on the host it may see, `addresses`
    CIDRs. The agent resolves it on its host, once (fleet/admission.py: spec.scope.Scope) and refuses more
    than its host. `k8s_namespaces` is left out of the JSON when empty, so a task without one signs the same
    bytes as before it existed."""

    netns: tuple[str, ...] = ()
    cgroups: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()  # CIDRs
    k8s_namespaces: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "netns": list(self.netns),
            "cgroups": list(self.cgroups),
            "addresses": list(self.addresses),
        }
        if self.k8s_namespaces:
            body["k8s_namespaces"] = list(self.k8s_namespaces)
        return body

    @classmethod
    def from_json(cls, raw: object, where: str = "task.scope") -> Scope:
        fields = _Fields(raw, where)
        return cls(
            fields.strings("netns"),
            fields.strings("cgroups"),
            fields.strings("addresses"),
            fields.strings("k8s_namespaces"),
        )


@dataclass(frozen=True)
class Budgets:
    """What the session may spend on the host; the agent also caps them with its own [sessions] limits."""

    max_events: int = 100_000
    max_bytes: int = 64 << 20
    cpu_percent: float = 5.0  # of one CPU, by the session's BPF programs (bpf_stats)

    def to_json(self) -> dict[str, Any]:
        return {"max_events": self.max_events, "max_bytes": self.max_bytes, "cpu_percent": self.cpu_percent}

    @classmethod
    def from_json(cls, raw: object, where: str = "task.budgets") -> Budgets:
        fields = _Fields(raw, where)
        budgets = cls(
            max_events=fields.integer("max_events", minimum=1),
            max_bytes=fields.integer("max_bytes", minimum=1),
            cpu_percent=fields.number("cpu_percent", minimum=0.01),
        )
        if budgets.cpu_percent > 100:
            raise ProtocolError(f"{where}.cpu_percent must be at most 100 (got {budgets.cpu_percent:g})")
        return budgets


@dataclass(frozen=True)
class Task:
    id: str
    session: str
    host: str
    diagnostic: str
    config: dict[str, Any]
    scope: Scope
    issued_at: float  # unix seconds
    expires_at: float  # unix seconds: the agent refuses it after this, and forgets its id then
    deadline_s: float  # how long the session runs once started (the agent ends it at T0 + deadline_s)
    budgets: Budgets
    user: str
    v: int = PROTOCOL_VERSION
    # The run of the agent this task is for (its registry entry's run_id): a task captured before the agent
    # restarted names a run that no longer exists, and is refused as a replay (admission.py).
    run_id: str = ""
    # The controller's streams store this session's statuses and records: send each as a JetStream publish and
    # keep it until it is acknowledged (fleet/outbox.py). False (a controller without those streams): publish.
    stored: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "run_id": self.run_id,
            "id": self.id,
            "session": self.session,
            "host": self.host,
            "diagnostic": self.diagnostic,
            "config": self.config,
            "scope": self.scope.to_json(),
            "issued_at": self.issued_at,
            "expires_at": self.expires_at,
            "deadline_s": self.deadline_s,
            "budgets": self.budgets.to_json(),
            "user": self.user,
            "stored": self.stored,
        }

    @classmethod
    def from_json(cls, raw: object) -> Task:
        fields = _Fields(raw, "task")
        task_id = fields.string("id", max_len=64)
        if not re.fullmatch(r"[A-Za-z0-9_-]{8,64}", task_id):
            raise ProtocolError(f"task.id must be 8-64 letters, digits, '_' or '-' (got {task_id!r})")
        version = fields.integer("v", default=PROTOCOL_VERSION, minimum=1)
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"task.v {version} is not supported: this agent speaks version 1")
        task = cls(
            id=task_id,
            session=validate_session_id(fields.raw.get("session")),
            host=validate_host_id(fields.raw.get("host")),
            diagnostic=fields.string("diagnostic", max_len=64),
            config=fields.obj("config"),
            scope=Scope.from_json(fields.obj("scope")),
            issued_at=fields.number("issued_at"),
            expires_at=fields.number("expires_at"),
            deadline_s=fields.number("deadline_s", minimum=0.001),
            budgets=Budgets.from_json(fields.obj("budgets")),
            user=fields.string("user", max_len=256),
            v=version,
            run_id=fields.string("run_id", "", max_len=64),
            stored=fields.boolean("stored", False),
        )
        if task.expires_at < task.issued_at:
            raise ProtocolError("task.expires_at is before task.issued_at")
        return task


@dataclass(frozen=True)
class SignedTask:
    """A task, its Ed25519 signature over canonical_json(task) and the id of the signing key."""

    task: Task
    signature: str  # base64
    key_id: str
    raw_task: dict[str, Any] = field(compare=False, repr=False, default_factory=dict)

    @classmethod
    def sign(cls, task: Task, key: Ed25519PrivateKey, key_id: str) -> SignedTask:
        body = task.to_json()
        signature = base64.b64encode(key.sign(canonical_json(body))).decode()
        return cls(task, signature, key_id, body)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.raw_task or self.task.to_json(),
            "signature": self.signature,
            "key_id": self.key_id,
        }

    def encode(self) -> bytes:
        return _dump(self.to_json())

    @classmethod
    def from_json(cls, raw: object) -> SignedTask:
        fields = _Fields(raw, "signed task")
        raw_task = fields.obj("task")
        signature = fields.string("signature", max_len=128)
        key_id = fields.string("key_id", max_len=128)
        return cls(Task.from_json(raw_task), signature, key_id, raw_task)

    def verify(self, key: Ed25519PublicKey) -> None:
        """Raise ProtocolError unless `signature` is `key`'s over the task exactly as received."""
        try:
            signature = base64.b64decode(self.signature, validate=True)
        except ValueError:
            raise ProtocolError("the task's signature is not base64") from None
        try:
            key.verify(signature, canonical_json(self.raw_task or self.task.to_json()))
        except InvalidSignature:
            raise ProtocolError(
                f"the task's signature does not verify with the controller key this agent trusts "
                f"(key id {self.key_id!r})"
            ) from None


@dataclass(frozen=True)
class TaskReply:
    accepted: bool
    reason: str = ""
    offset_ns: int = 0  # this agent's wall clock minus the controller's, as last measured (0 if unknown)

    def to_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "reason": self.reason, "offset_ns": self.offset_ns}

    def encode(self) -> bytes:
        return _dump(self.to_json())

    @classmethod
    def from_json(cls, raw: object) -> TaskReply:
        fields = _Fields(raw, "task reply")
        accepted = fields.boolean("accepted")
        return cls(accepted, fields.string("reason", ""), fields.signed_integer("offset_ns", 0))


@dataclass(frozen=True)
class Control:
    """start: begin streaming at the wall-clock instant t0_ns (records before it are discarded);
    cancel: end the session now (reason "cancelled")."""

    session: str
    action: Literal["start", "cancel"]
    t0_ns: int = 0

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"session": self.session, "action": self.action}
        if self.action == "start":
            body["t0_ns"] = self.t0_ns
        return body

    def encode(self) -> bytes:
        return _dump(self.to_json())

    @classmethod
    def from_json(cls, raw: object) -> Control:
        fields = _Fields(raw, "control")
        action = fields.string("action", max_len=16)
        if action not in ("start", "cancel"):
            raise ProtocolError(f"control.action must be 'start' or 'cancel' (got {action!r})")
        session = validate_session_id(fields.raw.get("session"))
        if action == "start":
            return cls(session, "start", fields.integer("t0_ns", minimum=1))
        return cls(session, "cancel")


@dataclass(frozen=True)
class PingReply:
    """The agent's wall clock when it answered; offset = wall_ns - (sent + received) / 2 (NTP-style)."""

    wall_ns: int

    def to_json(self) -> dict[str, Any]:
        return {"wall_ns": self.wall_ns}

    def encode(self) -> bytes:
        return _dump(self.to_json())

    @classmethod
    def from_json(cls, raw: object) -> PingReply:
        return cls(_Fields(raw, "ping reply").integer("wall_ns", minimum=1))


def _now_iso() -> str:
    now_ns = time.time_ns()  # one reading: seconds and milliseconds from the same instant
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now_ns // 1_000_000_000)) + (
        f".{now_ns // 1_000_000 % 1000:03d}Z"
    )


@dataclass(frozen=True)
class HostStatus:
    """One host's state in one session. `totals` is EventTotals.to_json() once the programs are attached;
    `lost` and `sampled` repeat its two fields at top level because a consumer must always show them."""

    host: str
    session: str
    state: HostState
    reason: str = ""
    offset_ns: int = 0
    start_skew_ns: int | None = None  # measured start - T0 on this host's wall clock, once running
    totals: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    sampled: int = 0
    events: int = 0  # records sent
    sent_bytes: int = 0  # bytes of records sent (JSON key "bytes")
    time: str = field(default_factory=_now_iso)
    notes: tuple[str, ...] = ()  # what the host could not do in full (a firewall unreadable, entries cut)
    # Records and entries of records the agent held back as outside the task's scope (fleet/scope_filter.py);
    # also in `totals` as "withheld", which consumers copy whole.
    withheld: int = 0
    # Record batches sent so far (seq 0 .. batches - 1): with the `ended` status, the controller knows which
    # it still lacks, even a last one no later batch showed missing.
    batches: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "session": self.session,
            "state": self.state,
            "reason": self.reason,
            "offset_ns": self.offset_ns,
            "start_skew_ns": self.start_skew_ns,
            "totals": self.totals,
            "lost": self.lost,
            "sampled": self.sampled,
            "events": self.events,
            "bytes": self.sent_bytes,
            "time": self.time,
            "notes": list(self.notes),
            "withheld": self.withheld,
            "batches": self.batches,
        }

    def encode(self) -> bytes:
        return _dump(self.to_json())

    @classmethod
    def from_json(cls, raw: object) -> HostStatus:
        fields = _Fields(raw, "status")
        state = fields.string("state", max_len=16)
        if state not in HOST_STATES:
            raise ProtocolError(f"status.state must be one of {', '.join(HOST_STATES)} (got {state!r})")
        totals = fields.obj("totals", {})
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in totals.values()):
            raise ProtocolError("status.totals must map names to integers")
        skew = fields.raw.get("start_skew_ns")
        return cls(
            host=validate_host_id(fields.raw.get("host")),
            session=validate_session_id(fields.raw.get("session")),
            state=cast(HostState, state),
            reason=fields.string("reason", ""),
            offset_ns=fields.signed_integer("offset_ns", 0),
            start_skew_ns=None if skew is None else fields.signed_integer("start_skew_ns"),
            totals=totals,
            lost=fields.integer("lost", 0),
            sampled=fields.integer("sampled", 0),
            events=fields.integer("events", 0),
            sent_bytes=fields.integer("bytes", 0),
            time=fields.string("time", _now_iso(), max_len=64),
            notes=fields.strings("notes"),
            withheld=fields.integer("withheld", 0),
            batches=fields.integer("batches", 0),
        )


@dataclass(frozen=True)
class RecordBatch:
    """Records of one host in one session; `seq` counts batches from 0 so a gap is visible."""

    host: str
    session: str
    seq: int
    records: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "session": self.session, "seq": self.seq, "records": self.records}

    @staticmethod
    def encode_lines(host: str, session: str, seq: int, lines: list[bytes]) -> bytes:
        """The same message from records already encoded as JSON (the agent encodes each record once, to
        count its bytes against the session's cap, and does not encode it again for the batch)."""
        head = json.dumps({"host": host, "session": session, "seq": seq}, separators=(",", ":")).encode()
        return head[:-1] + b',"records":[' + b",".join(lines) + b"]}"

    def encode(self) -> bytes:
        return _dump(self.to_json())

    @classmethod
    def from_json(cls, raw: object) -> RecordBatch:
        fields = _Fields(raw, "record batch")
        records = fields.objects("records")
        for index, record in enumerate(records):
            if not isinstance(record.get("type"), str):
                raise ProtocolError(f"record batch.records[{index}] has no string 'type'")
        return cls(
            host=validate_host_id(fields.raw.get("host")),
            session=validate_session_id(fields.raw.get("session")),
            seq=fields.integer("seq", 0),
            records=records,
        )


@dataclass(frozen=True)
class HostEntry:
    """The registry entry an agent keeps fresh in the KV bucket (key = host id)."""

    host: str
    hostname: str
    kernel: str
    features: dict[str, Any]
    version: str
    labels: dict[str, str]
    namespaces: list[dict[str, Any]]  # [{"name", "inode"}]: the namespaces this host's scope covers
    containers: list[dict[str, Any]]
    heartbeat: str  # ISO 8601 UTC
    heartbeat_ns: int  # the same instant as unix ns, so "stale" needs no date parsing
    last_error: str | None = None
    status: Literal["up", "stopping"] = "up"
    diagnostics: tuple[str, ...] = ()  # the catalogue this agent will run
    key_id: str = ""  # which controller key it trusts (diagnosing a key mismatch starts here)
    offset_ns: int = 0  # this host's wall clock minus the NATS server's (fleet/clock.py)
    run_id: str = ""  # this run of the agent process: tasks must name it (a restart makes a new one)
    # The Kubernetes pods whose namespaces this host's scope covers (from its container runtime, CRI):
    # [{"namespace", "name", "uid", "netns", "labels"}]; empty where the host runs none.
    pods: list[dict[str, Any]] = field(default_factory=list)
    # The kinds of task scope this agent holds (ENFORCED_SCOPES): a controller sends a scope only
    # to an agent that lists its kind - an older agent would read the task without it, and look wider.
    scopes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "hostname": self.hostname,
            "kernel": self.kernel,
            "features": self.features,
            "version": self.version,
            "labels": self.labels,
            "namespaces": self.namespaces,
            "containers": self.containers,
            "heartbeat": self.heartbeat,
            "heartbeat_ns": self.heartbeat_ns,
            "last_error": self.last_error,
            "status": self.status,
            "diagnostics": list(self.diagnostics),
            "key_id": self.key_id,
            "offset_ns": self.offset_ns,
            "run_id": self.run_id,
            "pods": self.pods,
            "scopes": list(self.scopes),
        }

    def encode(self) -> bytes:
        return _dump(self.to_json())

    @classmethod
    def from_json(cls, raw: object) -> HostEntry:
        fields = _Fields(raw, "host entry")
        labels = fields.obj("labels", {})
        if not all(isinstance(v, str) for v in labels.values()):
            raise ProtocolError("host entry.labels must map names to strings")
        status = fields.string("status", "up")
        if status not in ("up", "stopping"):
            raise ProtocolError(f"host entry.status must be 'up' or 'stopping' (got {status!r})")
        return cls(
            host=validate_host_id(fields.raw.get("host")),
            hostname=fields.string("hostname", max_len=256),
            kernel=fields.string("kernel", max_len=256),
            features=fields.obj("features", {}),
            version=fields.string("version", max_len=64),
            labels=cast(dict[str, str], labels),
            namespaces=fields.objects("namespaces"),
            containers=fields.objects("containers"),
            heartbeat=fields.string("heartbeat", max_len=64),
            heartbeat_ns=fields.integer("heartbeat_ns", 0),
            last_error=fields.optional_string("last_error"),
            status=cast(Literal["up", "stopping"], status),
            diagnostics=fields.strings("diagnostics"),
            key_id=fields.string("key_id", "", max_len=128),
            offset_ns=fields.signed_integer("offset_ns", 0),
            run_id=fields.string("run_id", "", max_len=64),
            pods=fields.objects("pods"),
            scopes=fields.strings("scopes"),
        )
