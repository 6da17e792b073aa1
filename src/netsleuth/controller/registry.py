"""The hosts the controller knows: a live copy of the agents' KV bucket, kept by one watcher.

Watching instead of listing keeps `GET /hosts` and session creation O(1) in NATS requests whatever the
number of hosts (1,000 agents must not mean 1,000 KV gets per request). An entry whose heartbeat is older
than `stale_after` is shown as `stale`; sessions can still be tried on it (the agent may just be slow), and
a dead one then fails with its reason.

After NATS comes back (`renew`, from the connection's reconnect callback) the watch starts again at once: a
restarted server has lost the watch's consumer, which nats-py would notice only after two missed 5 s
heartbeats - 7-12 s during which the host list showed the entries from before the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from netsleuth.controller.streams import RenewableWatch
from netsleuth.fleet.protocol import HOSTS_BUCKET

__all__ = ["HostRegistry"]

_log = logging.getLogger("netsleuth.controller")


class HostRegistry(RenewableWatch):
    """`describe(entry)` gives what the controller adds to an entry from the entry alone (which diagnostics
    the host can run): worked out once per heartbeat, not once per listing."""

    def __init__(
        self,
        js: JetStreamContext,
        stale_after: float,
        describe: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self._js = js
        self._stale_after = stale_after
        self._describe = describe
        self._hosts: dict[str, dict[str, Any]] = {}
        self._kv: KeyValue | None = None

    what = "host registry watch"

    async def start(self, timeout: float = 5.0) -> None:
        self._kv = await self._js.key_value(HOSTS_BUCKET)
        await super().start(timeout)

    async def _follow(self) -> None:
        assert self._kv is not None
        watcher = await self._kv.watchall()
        try:
            async for entry in watcher:
                if entry is None:  # the initial values are all delivered
                    self.synced.set()
                    continue
                self._apply(entry.key, entry.value, entry.operation)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(watcher.stop(), timeout=2)  # type: ignore[no-untyped-call]

    def _apply(self, key: str, value: bytes | None, operation: str | None) -> None:
        if operation in ("DEL", "PURGE") or not value:
            self._hosts.pop(key, None)
            return
        try:
            entry = json.loads(value)
        except ValueError:
            return
        if isinstance(entry, dict):
            entry["host"] = key  # the key is what the subject permissions tie to the agent: it wins
            if self._describe is not None:
                entry.update(self._describe(entry))
            self._hosts[key] = entry

    async def lookup(self, host: str) -> dict[str, Any] | None:
        """The entry, asking the bucket directly when the watcher has not seen it (yet)."""
        entry = self._hosts.get(host)
        if entry is None and self._kv is not None:
            with contextlib.suppress(Exception):
                found = await self._kv.get(host)
                self._apply(host, found.value, found.operation)
                entry = self._hosts.get(host)
        return self._with_state(entry) if entry is not None else None

    def _with_state(self, entry: dict[str, Any]) -> dict[str, Any]:
        heartbeat_ns = entry.get("heartbeat_ns")
        fresh = isinstance(heartbeat_ns, int) and time.time_ns() - heartbeat_ns < self._stale_after * 1e9
        return {**entry, "state": "up" if fresh and entry.get("status", "up") == "up" else "stale"}

    def all(self) -> list[dict[str, Any]]:
        return [self._with_state(entry) for _, entry in sorted(self._hosts.items())]

    def netns_owners(self, hosts: Iterable[str]) -> dict[str, str]:
        """Namespace name (and inode as text) -> host id, for the given hosts (a session's)."""
        owners: dict[str, str] = {}
        for host in hosts:
            for namespace in (self._hosts.get(host) or {}).get("namespaces") or []:
                if isinstance(namespace, dict):
                    for key in ("name", "inode"):
                        if namespace.get(key) not in (None, ""):
                            owners.setdefault(str(namespace[key]), host)
        return owners

    def run_ids(self, hosts: Iterable[str]) -> dict[str, str]:
        """Host id -> the run of its agent now registered (what a task for it must name)."""
        return {host: str((self._hosts.get(host) or {}).get("run_id") or "") for host in hosts}

    def hostnames(self) -> dict[str, str]:
        return {host: str(entry.get("hostname") or host) for host, entry in self._hosts.items()}
