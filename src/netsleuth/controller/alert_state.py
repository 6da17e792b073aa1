"""What alerts have already started, kept in JetStream KV so every controller counts the same (issue 23).

One key (`state` in the bucket `netsleuth_alerts`) holds the whole ledger: the fingerprints that started a
diagnosis within `dedup_window` (with the session) and the starts within `window` (alert rule, host). It
stays small by construction - only started diagnoses are written, and at most `max_sessions` start per
window - so one document updated with compare-and-set (the entry's last revision) makes the dedup and every
count one atomic decision, also with two controllers deciding at once: the loser of a race re-reads and
decides again. Alerts that start nothing write nothing, so a storm of them costs reads, not writes.

Beside it, one key per started diagnosis whose verdict is not sent yet (`report.<session>`, the alert's
brief): whichever controller sees the session end first deletes it at its revision and sends the verdict,
so a diagnosis whose controller died is reported by the one that took it over, and only once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    BadRequestError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from netsleuth.controller.config import AlertsConfig
from netsleuth.fleet.protocol import ALERTS_BUCKET

__all__ = ["AlertLedger", "LedgerState", "LedgerUnavailable"]

_KEY = "state"
_REPORT = "report."  # + the session id: a started diagnosis whose verdict nobody has sent yet
_RETRIES = 20
_CACHE_S = 1.0  # a storm's alerts are decided on one read; a stale copy can only lose a compare-and-set


class LedgerUnavailable(Exception):
    """The KV bucket could not be read or written: no diagnosis starts without its dedup state."""


@dataclass
class LedgerState:
    """The ledger's document and the decisions made on it (no I/O: unit-tested on its own)."""

    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    starts: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, raw: bytes | None) -> LedgerState:
        if not raw:
            return cls()
        data = json.loads(raw)
        fingerprints = data.get("fingerprints") if isinstance(data, dict) else None
        starts = data.get("starts") if isinstance(data, dict) else None
        return cls(
            fingerprints=dict(fingerprints) if isinstance(fingerprints, dict) else {},
            starts=list(starts) if isinstance(starts, list) else [],
        )

    def to_json(self) -> bytes:
        return json.dumps({"fingerprints": self.fingerprints, "starts": self.starts}).encode()

    def prune(self, now: float, config: AlertsConfig) -> None:
        self.fingerprints = {
            fp: entry
            for fp, entry in self.fingerprints.items()
            if now - float(entry.get("t", 0)) < config.dedup_window
        }
        self.starts = [start for start in self.starts if now - float(start.get("t", 0)) < config.window]

    def refusal(
        self, fingerprint: str, alertname: str, host: str, config: AlertsConfig
    ) -> tuple[str, str] | None:
        """(outcome, sentence) when this alert may start nothing now; None when it may. Pruned first."""
        seen = self.fingerprints.get(fingerprint)
        if seen is not None:
            return "duplicate", (
                f"it already started session {seen.get('session') or '(starting)'} within the last "
                f"{config.dedup_window:g} s (dedup_window)."
            )
        if len(self.starts) >= config.max_sessions:
            return "capped", (
                f"alerts already started {len(self.starts)} diagnoses in the last {config.window:g} s, "
                f"the most allowed (max_sessions)."
            )
        per_alert = sum(1 for start in self.starts if start.get("alert") == alertname)
        if per_alert >= config.max_per_alert:
            return "rate_limited_alert", (
                f"alert {alertname} already started {per_alert} diagnoses in the last {config.window:g} s "
                "(max_per_alert)."
            )
        per_host = sum(1 for start in self.starts if host in (start.get("hosts") or []))
        if per_host >= config.max_per_host:
            return "rate_limited_host", (
                f"host {host} already had {per_host} alert diagnoses in the last {config.window:g} s "
                "(max_per_host)."
            )
        return None

    def claim(self, fingerprint: str, alertname: str, host: str, now: float) -> None:
        self.fingerprints[fingerprint] = {"t": now, "alert": alertname, "hosts": [host], "session": None}
        self.starts.append({"t": now, "alert": alertname, "hosts": [host], "fingerprint": fingerprint})

    def release(self, fingerprint: str, now: float) -> None:
        """A claim whose session did not start (refused, audit down): it counts for nothing."""
        entry = self.fingerprints.get(fingerprint)
        if entry is None or entry.get("session"):
            return
        del self.fingerprints[fingerprint]
        self.starts = [
            s for s in self.starts if not (s.get("fingerprint") == fingerprint and s.get("t") == entry["t"])
        ]

    def attach(self, fingerprint: str, session: str) -> None:
        entry = self.fingerprints.get(fingerprint)
        if entry is not None:
            entry["session"] = session


class AlertLedger:
    def __init__(
        self,
        js: JetStreamContext,
        config: AlertsConfig,
        replicas: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._js = js
        self._config = config
        self._replicas = replicas  # nats.replicas: the ledger survives a lost server like every stream
        self._clock = clock
        self._kv: KeyValue | None = None
        self._lock = asyncio.Lock()  # one decision at a time here; compare-and-set against other controllers
        self._cached: tuple[bytes, int | None, float] | None = None  # (document, revision, when read)

    async def start(self) -> None:
        try:
            self._kv = await self._js.key_value(ALERTS_BUCKET)
        except (NotFoundError, BadRequestError):
            self._kv = await self._js.create_key_value(
                KeyValueConfig(
                    bucket=ALERTS_BUCKET, history=1, storage=StorageType.FILE, replicas=self._replicas
                )
            )

    async def _load(self, fresh: bool = True) -> tuple[LedgerState, int | None]:
        assert self._kv is not None, "AlertLedger.start() first"
        if not fresh and self._cached is not None and time.monotonic() - self._cached[2] < _CACHE_S:
            return LedgerState.from_json(self._cached[0]), self._cached[1]
        try:
            entry = await self._kv.get(_KEY)
            document, revision = entry.value or b"", entry.revision
        except KeyNotFoundError:
            document, revision = b"", None
        except Exception as error:
            raise LedgerUnavailable(
                f"the alert ledger (KV {ALERTS_BUCKET}) could not be read: {error}"
            ) from error
        self._cached = (document, revision, time.monotonic())
        return LedgerState.from_json(document), revision

    async def _store(self, state: LedgerState, revision: int | None) -> int | None:
        """The new revision, or None when another controller wrote first."""
        assert self._kv is not None
        try:
            if revision is None:
                return int(await self._kv.create(_KEY, state.to_json()))
            return int(await self._kv.update(_KEY, state.to_json(), last=revision))
        except KeyWrongLastSequenceError:
            return None
        except BadRequestError as error:  # create() of a key another controller just created
            if "wrong last sequence" in str(error).lower():
                return None
            raise LedgerUnavailable(
                f"the alert ledger (KV {ALERTS_BUCKET}) refused a write: {error}"
            ) from error
        except Exception as error:
            raise LedgerUnavailable(
                f"the alert ledger (KV {ALERTS_BUCKET}) could not be written: {error}"
            ) from error

    async def _change(self, change: Callable[[LedgerState, float], Any]) -> Any:
        """Read, change, compare-and-set; again from a fresh read when another controller got there first."""
        fresh = False
        for _ in range(_RETRIES):
            state, revision = await self._load(fresh)
            now = self._clock()
            state.prune(now, self._config)
            outcome = change(state, now)
            if outcome is _UNCHANGED:
                return None
            stored = await self._store(state, revision)
            if stored is not None:
                self._cached = (state.to_json(), stored, time.monotonic())
                return outcome
            fresh = True
        raise LedgerUnavailable(f"the alert ledger (KV {ALERTS_BUCKET}) kept changing under this controller")

    async def claim(self, fingerprint: str, alertname: str, host: str) -> tuple[str, str] | None:
        """None: claimed (the caller starts the session, then attach()es it or release()s the claim);
        else (outcome, sentence) saying why this alert starts nothing."""
        refused: list[tuple[str, str]] = []

        def decide(state: LedgerState, now: float) -> Any:
            found = state.refusal(fingerprint, alertname, host, self._config)
            if found is not None:
                refused.append(found)
                return _UNCHANGED
            state.claim(fingerprint, alertname, host, now)
            return True

        async with self._lock:
            await self._change(decide)
        return refused[-1] if refused else None

    async def release(self, fingerprint: str) -> None:
        async with self._lock:
            with contextlib.suppress(LedgerUnavailable):
                await self._change(lambda state, now: state.release(fingerprint, now))

    async def attach(self, fingerprint: str, session: str) -> None:
        async with self._lock:
            await self._change(lambda state, now: state.attach(fingerprint, session))

    async def pending_report(self, session: str, alert: dict[str, Any]) -> None:
        """The diagnosis `session` started for `alert` (its brief): its verdict is to be sent once it ends."""
        assert self._kv is not None
        try:
            await self._kv.put(_REPORT + session, json.dumps(alert).encode())
        except Exception as error:
            raise LedgerUnavailable(
                f"the alert ledger (KV {ALERTS_BUCKET}) could not be written: {error}"
            ) from error

    async def unreported(self) -> list[str]:
        """The sessions whose verdict no controller has taken to send yet."""
        assert self._kv is not None
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return []
        return [key[len(_REPORT) :] for key in keys if key.startswith(_REPORT)]

    async def take_report(self, session: str) -> dict[str, Any] | None:
        """The alert's brief if this controller is the one to send the session's verdict (the key deleted at
        the revision read: compare-and-set against the other controllers), else None."""
        assert self._kv is not None
        try:
            entry = await self._kv.get(_REPORT + session)
            await self._kv.delete(_REPORT + session, last=entry.revision)
        except (KeyNotFoundError, KeyWrongLastSequenceError):
            return None  # another controller took it
        except BadRequestError as error:
            if "wrong last sequence" in str(error).lower():
                return None
            raise
        brief = json.loads(entry.value or b"{}")
        return brief if isinstance(brief, dict) else None

    async def session_of(self, fingerprint: str) -> str | None:
        state, _ = await self._load()
        entry = state.fingerprints.get(fingerprint)
        session = entry.get("session") if entry is not None else None
        return session if isinstance(session, str) else None


_UNCHANGED = object()
