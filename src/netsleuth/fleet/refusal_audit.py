"""The agent's own audit records: one for every message it refuses to act on (a task it will not run, a
control message it will not obey), on `netsleuth.audit.agent.<host>`, whoever sent it - and bounded, so that
a storm of bad messages never makes an honest agent flood the audit.

- Size: a record is at most AGENT_AUDIT_MAX_RECORD bytes, the most the agents' audit stream stores: a long
  reason or scope (a task may list 1,024 namespaces) is cut, and the record says how much was left out.
- Rate: a token bucket (10 records a second, bursts of 50). Refusals beyond it are counted, not written one by
  one; the next record written - or a summary once the storm is over - says how many were left out, so the
  trail stays exact in number.

The server bounds each agent's subject as well (controller/streams.py: records per host, record size, the
stream's bytes), whatever the agent does: this is what keeps an honest agent inside those bounds, so that
its records are never the ones discarded.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable
from typing import Any

from netsleuth.fleet.protocol import AGENT_AUDIT_MAX_RECORD

__all__ = ["RefusalAudit", "audit_time"]

_RATE = 10.0  # records a second, on average
_BURST = 50
_MAX_REASON = 2_000  # characters of a refusal's reason kept (the sentences are far shorter)


def audit_time() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


def _encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


def _bounded(record: dict[str, Any]) -> bytes:
    """The record as JSON, cut to fit the stream's record size."""
    data = _encode(record)
    if len(data) <= AGENT_AUDIT_MAX_RECORD:
        return data
    cut = dict(record)
    reason = str(cut.get("reason", ""))
    if len(reason) > _MAX_REASON:
        cut["reason"] = reason[:_MAX_REASON] + f"... ({len(reason) - _MAX_REASON} characters cut)"
    scope = cut.get("scope")
    if isinstance(scope, dict):
        listed = sum(len(value) for value in scope.values() if isinstance(value, list))
        # What the scope asked for, in numbers: the names are in the controller's own record of the session.
        cut["scope"] = {"omitted": f"{listed} entries, too long to record here"}
    data = _encode(cut)
    if len(data) <= AGENT_AUDIT_MAX_RECORD:
        return data
    kept: dict[str, Any] = {
        key: cut[key] for key in ("time", "host", "action", "decision", "task_id", "session") if key in cut
    }
    kept["reason"] = str(cut.get("reason", ""))[:_MAX_REASON]
    kept["omitted"] = f"a {len(data)}-byte record, over the audit's {AGENT_AUDIT_MAX_RECORD} bytes"
    return _encode(kept)


class RefusalAudit:
    """Which refusal records to write now; counts what it holds back (`written`, `left_out`, `unstored` are
    the agent's netsleuth_fleet_audit_records_total)."""

    def __init__(
        self, host: str, rate: float = _RATE, burst: int = _BURST, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.host = host
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._refilled = clock()
        self._pending = 0  # left out since the last record written
        self.written = 0
        self.left_out = 0
        self.unstored = 0  # written, but the stream did not acknowledge it

    def _take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def admit(self, record: dict[str, Any]) -> bytes | None:
        """The encoded record to write now, or None when over the rate (counted; `summary` is due then)."""
        if not self._take():
            self._pending += 1
            self.left_out += 1
            return None
        if self._pending:
            record = {**record, "left_out_before": self._pending}
            self._pending = 0
        self.written += 1
        return _bounded(record)

    @property
    def pending(self) -> int:
        return self._pending

    def summary(self) -> bytes | None:
        """A record of the refusals left out since the last record, once the rate allows one; None if none."""
        if not self._pending or not self._take():
            return None
        count, self._pending = self._pending, 0
        self.written += 1
        return _bounded(
            {
                "time": audit_time(),
                "host": self.host,
                "action": "refusals.left_out",
                "decision": "deny",
                "reason": f"{count} more refusal(s) not recorded one by one (over {self._rate:g} a second)",
                "count": count,
            }
        )
