"""One fleet session as a controller holds it: its hosts' views, the merged timeline, and the live events
its readers (SSE) follow. The controller that runs it and any controller that follows it for a reader hold
the same object (controller/sessions.py); only the one that runs it decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import heapq
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from netsleuth.fleet.merge import MergedTimeline
from netsleuth.fleet.protocol import Scope

__all__ = [
    "ACTIVE",
    "FINAL",
    "SUMMARY_HOSTS",
    "FleetSession",
    "HostView",
    "SessionSpec",
    "iso",
    "session_result",
]

FINAL = frozenset({"ended", "failed", "rejected"})
ACTIVE = frozenset({"preparing", "running"})
_SUBSCRIBER_QUEUE = 20_000
SUMMARY_HOSTS = 200  # a summary lists at most this many hosts (those not ended first); the rest are counted


def iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).isoformat(timespec="microseconds")


def session_result(state: str, partial: bool) -> str:
    """A finished session in one word: `partial` when it ended with some host not ended (failed, rejected),
    else its state (`ended`, `failed` when no host ended, `cancelled`)."""
    return "partial" if state == "ended" and partial else state


@dataclass(frozen=True)
class SessionSpec:
    """A validated, authorised request."""

    user: str
    diagnostic: str
    config: dict[str, Any]
    scope: Scope
    duration: float
    hosts: tuple[str, ...]


@dataclass
class HostView:
    state: str = "preparing"
    reason: str = ""
    offset_ns: int | None = None
    rtt_ns: int | None = None
    start_skew_ns: int | None = None
    totals: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    sampled: int = 0
    records: int = 0
    sent: int | None = None  # records the host says it sent (its last status): `records` should reach it
    batches_sent: int = 0  # record batches the host says it sent (its last status)
    refused: int = 0  # messages on this host's subjects that were refused (a body naming another host, ...)
    seqs: set[int] = field(default_factory=set, repr=False)  # the record batches received (each once)
    heard: bool = False  # a status of its own came (it has the task)
    missed_pings: int = 0
    unreachable_since: float | None = None  # monotonic: the first "no responders" of a run of them
    task_id: str = ""
    last_seen: float = 0.0  # monotonic: the last status, records or ping answer from this host

    @property
    def batch_gaps(self) -> int:
        """Record batches the host sent (or numbered past) that never arrived: their records are unknown."""
        expected = max(self.batches_sent, max(self.seqs) + 1 if self.seqs else 0)
        return expected - len(self.seqs)

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "offset_ns": self.offset_ns,
            "rtt_ns": self.rtt_ns,
            "start_skew_ns": self.start_skew_ns,
            "totals": self.totals,
            "lost": self.lost,
            "sampled": self.sampled,
            "records": self.records,
            "sent": self.sent,
            "batch_gaps": self.batch_gaps,
            "refused": self.refused,
        }


class FleetSession:
    def __init__(
        self,
        session_id: str,
        spec: SessionSpec,
        hostnames: dict[str, str],
        max_timeline: int,
        netns_owner: dict[str, str] | None = None,
        runs: dict[str, str] | None = None,
        created_ns: int | None = None,
        owned: bool = True,
    ) -> None:
        self.id = session_id
        self.spec = spec
        self.runs = runs or {}  # host -> the agent run its task is signed for (the registry's run_id)
        # True: this controller runs it (holds its lease); False: it follows another's, for its readers.
        self.owned = owned
        self.state = "preparing"
        self.created_ns = created_ns if created_ns is not None else time.time_ns()
        self.t0_ns: int | None = None
        self.ended_ns: int | None = None
        self.hosts = {host: HostView() for host in spec.hosts}
        self.open_hosts = set(spec.hosts)  # not final yet: what the end waits for, without a scan of all
        self.merged = MergedTimeline(hostnames, max_entries=max_timeline, netns_owner=netns_owner)
        self.verdicts: list[dict[str, Any]] = []
        self.cancel_requested = False
        self.taken_over = False  # another controller started it, and stopped or died
        self.refusals_recorded: set[tuple[str, str, str]] = set()  # (sender, kind, reason) logged and audited
        self.final_json: bytes | None = None  # the whole ended session, serialised once for every reader
        self.status_events = 0
        self._live_cache: tuple[tuple[int, int, str], bytes] | None = None
        self.changed = asyncio.Event()
        self.done = asyncio.Event()
        self._listeners: list[asyncio.Queue[tuple[str, dict[str, Any]] | None]] = []

    def request_cancel(self) -> None:
        """Every waiter wakes: the supervisor, or the wait for the hosts' ready."""
        self.cancel_requested = True
        self.changed.set()

    # -- host states ------------------------------------------------------------------------------------
    def set_host(self, host: str, state: str, reason: str) -> HostView:
        view = self.hosts[host]
        view.state, view.reason = state, reason
        if state in FINAL:
            self.open_hosts.discard(host)
        return view

    # -- events for SSE ---------------------------------------------------------------------------------
    def listen(self) -> asyncio.Queue[tuple[str, dict[str, Any]] | None]:
        queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue(_SUBSCRIBER_QUEUE)
        self._listeners.append(queue)
        return queue

    def unlisten(self, queue: asyncio.Queue[tuple[str, dict[str, Any]] | None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(queue)

    @property
    def listened(self) -> bool:
        return bool(self._listeners)

    def emit(self, event: str, data: dict[str, Any]) -> None:
        for queue in list(self._listeners):
            try:
                queue.put_nowait((event, data))
            except asyncio.QueueFull:
                # A client that reads slower than the session produces is cut off (it can fetch the
                # whole timeline afterwards) rather than letting the controller's memory grow.
                self._listeners.remove(queue)
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)
        if event != "record":
            self.status_events += 1
            self.changed.set()  # records change no host's state: the supervisor need not wake for each

    def close_listeners(self) -> None:
        for queue in self._listeners:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
        self._listeners.clear()

    # -- views ------------------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def partial(self) -> bool:
        return any(view.state != "ended" for view in self.hosts.values()) and not self.active

    def start_spread_ns(self) -> int | None:
        skews = [v.start_skew_ns for v in self.hosts.values() if v.start_skew_ns is not None]
        return max(skews) - min(skews) if skews else None

    def host_states(self) -> dict[str, dict[str, Any]]:
        return {host: view.to_json() for host, view in self.hosts.items()}

    def live_json(self) -> bytes:
        """The running session as JSON, serialised again only when a record or a status came in since."""
        version = (self.merged.records, self.status_events, self.state)
        if self._live_cache is None or self._live_cache[0] != version:
            self._live_cache = (version, orjson.dumps(self.snapshot(timeline=True)))
        return self._live_cache[1]

    def summary(self) -> dict[str, Any]:
        """The session as a listing shows it (session_store.summary_of's shape), without a view of every
        host first: what a client of a 10,000-host session polls, and the stored summary."""
        body = self.snapshot(timeline=False, hosts=False)
        body.pop("verdicts")
        body["verdicts_count"] = len(self.verdicts)
        body["hosts_total"] = len(self.hosts)
        if len(self.hosts) <= SUMMARY_HOSTS:
            body["hosts"] = self.host_states()
            return body
        by_state: dict[str, int] = {}
        not_ended: list[str] = []
        for host, view in self.hosts.items():
            by_state[view.state] = by_state.get(view.state, 0) + 1
            if view.state != "ended":
                not_ended.append(host)
        # The first 200 by name without sorting 10,000 names on every poll (a poller asks several times a
        # second; py-spy put summary() at 7 % of the controller's samples in a 10,000-host run).
        shown = heapq.nsmallest(SUMMARY_HOSTS, not_ended)
        if len(shown) < SUMMARY_HOSTS:
            ended = (host for host, view in self.hosts.items() if view.state == "ended")
            shown += heapq.nsmallest(SUMMARY_HOSTS - len(shown), ended)
        body["hosts"] = {host: self.hosts[host].to_json() for host in shown}
        body["hosts_by_state"] = by_state
        return body

    def snapshot(self, timeline: bool, hosts: bool = True) -> dict[str, Any]:
        spread = self.start_spread_ns()
        body: dict[str, Any] = {
            "id": self.id,
            "user": self.spec.user,
            "diagnostic": self.spec.diagnostic,
            "config": self.spec.config,
            "duration": self.spec.duration,
            "scope": self.spec.scope.to_json(),
            "state": self.state,
            "created": iso(self.created_ns),
            "t0": iso(self.t0_ns),
            "ended": iso(self.ended_ns),
            "start_spread_ms": None if spread is None else spread / 1e6,
            "hosts": self.host_states() if hosts else {},
            "partial": self.partial,
            "verdicts": self.verdicts,
            "timeline_length": sum(view.records for view in self.hosts.values()),
            "timeline_dropped": self.merged.dropped_entries,
        }
        if self.taken_over:
            body["taken_over"] = True
        if timeline:
            body["timeline"] = self.merged.timeline()
        return body
