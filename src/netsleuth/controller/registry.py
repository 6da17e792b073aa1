"""The hosts the controller knows: a live copy of the agents' KV bucket, kept by one watcher.

Watching instead of listing keeps `GET /hosts` and session creation O(1) in NATS requests whatever the
number of hosts (1,000 agents must not mean 1,000 KV gets per request). An entry whose heartbeat is older
than `stale_after` is shown as `stale`; sessions can still be tried on it (the agent may just be slow), and
a dead one then fails with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from netsleuth.fleet.protocol import HOSTS_BUCKET

__all__ = ["HostRegistry"]

_log = logging.getLogger("netsleuth.controller")


class HostRegistry:
    def __init__(self, js: JetStreamContext, stale_after: float) -> None:
        self._js = js
        self._stale_after = stale_after
        self._hosts: dict[str, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._kv: KeyValue | None = None
        self.synced = asyncio.Event()

    async def start(self) -> None:
        self._kv = await self._js.key_value(HOSTS_BUCKET)
        self._task = asyncio.create_task(self._watch(), name="host-registry")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.synced.wait(), timeout=5)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        assert self._kv is not None
        while True:
            try:
                watcher = await self._kv.watchall()
                async for entry in watcher:
                    if entry is None:  # the initial values are all delivered
                        self.synced.set()
                        continue
                    self._apply(entry.key, entry.value, entry.operation)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # NATS restarting: watch again
                _log.warning("host registry watch: %s; watching again", error)
                await asyncio.sleep(1)

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

    def hostnames(self) -> dict[str, str]:
        return {host: str(entry.get("hostname") or host) for host, entry in self._hosts.items()}
