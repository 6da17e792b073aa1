"""The agent exporter's drop counters (drops offers them on its spec: `collectors`), read from the drops
program's BPF maps at scrape time. The exporter runs it summary-only (`ExporterDropsSession`): the kernel
counts and groups, no event is sent.

The kernel counts every drop exactly by reason x code location x netns (`drop_groups`); each scrape reads
those running totals, so there is no double counting and nothing to lose between scrapes. Three views:

- `netsleuth_drops_total{reason, netns}` and `netsleuth_dropped_bytes_total` — per namespace, the largest
  `netns_series` namespaces by inode (names, containers and Kubernetes pods come from
  `netsleuth_netns_info`, one series per admitted namespace, so pods add no series of their own), the rest
  summed as netns="other" (see cardinality.py).
- `netsleuth_drops_by_location_total{reason, location}` — the kernel function that freed the packet, the
  largest `location_series` pairs, the rest as location="other".
- `netsleuth_drops_unattributed_total` — drops counted while the group map was full: with it, the sum over
  every series is the kernel's exact total.

A namespace that has vanished for `retire_netns_after` seconds is retired: its groups leave the kernel map
(freeing room) and its counts move into "other", so sums never go down.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from netsleuth._generated.drops_abi import DROPS_MAX_GROUPS
from netsleuth.diagnostics.drops.decode import RawDropGroup
from netsleuth.diagnostics.drops.exporter_config import DropsExporterConfig
from netsleuth.diagnostics.drops.program import DropsProgramConfig, DropsSession, DropTotals
from netsleuth.kernel.function_names import FunctionNames
from netsleuth.kernel.netns import NetnsNames
from netsleuth.kernel.pods import PodIndex
from netsleuth.kernel.process import container_of
from netsleuth.kernel.reasons import DropReasons
from netsleuth.spec.cardinality import OTHER, SeriesGuard
from netsleuth.spec.collectors import CollectorInputs

__all__ = ["DropCounts", "DropsCollector", "ExporterDropsSession", "open_collector", "open_source"]

# The kernel gives netns 0 when a dropped packet had neither a device nor a socket to tell.
_UNKNOWN_NETNS = "unknown"


class DropCounts(Protocol):
    """What the collector reads: the exporter's `ExporterDropsSession`, or a fake in unit tests."""

    def groups(self) -> Iterator[RawDropGroup]: ...

    def totals(self) -> DropTotals: ...

    def forget_group(self, reason: int, location: int, netns: int) -> tuple[int, int] | None: ...


@dataclass
class _Count:
    drops: int = 0
    bytes: int = 0

    def add(self, drops: int, size: int) -> None:
        self.drops += drops
        self.bytes += size


class DropsCollector:
    def __init__(
        self,
        source: DropCounts,
        reasons: DropReasons,
        function_names: FunctionNames,
        config: DropsExporterConfig,
        netns_names: NetnsNames | None = None,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
        container_lookup: Callable[[int, str], str | None] = container_of,
        pods: PodIndex | None = None,
    ) -> None:
        self._source = source
        self._reasons = reasons
        self._function_names = function_names
        self._config = config
        self._netns_names = netns_names or NetnsNames(proc_root)
        self._proc_root = proc_root
        self._clock = clock
        self._container_lookup = container_lookup
        self._pods = pods if pods is not None else PodIndex(proc_root=proc_root)
        self._netns_guard: SeriesGuard[int] = SeriesGuard(config.netns_series)
        self._location_guard: SeriesGuard[tuple[str, str]] = SeriesGuard(config.location_series)
        # Counts of retired namespaces' groups, by (reason, location address): they stay in every sum.
        self._retired: dict[tuple[int, int], _Count] = defaultdict(_Count)
        self._missing_since: dict[int, float] = {}
        self._containers: dict[int, str | None] = {}
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        with self._lock:  # concurrent scrapes would race on retirement and the guards' state
            return self._collect()

    # -- reading ---------------------------------------------------------------------------------------
    def _host_netns(self) -> int | None:
        """PID 1's namespace; where that is hidden (a sandbox), the agent's own: it runs on the host's."""
        for pid in ("1", "self"):
            try:
                return os.stat(os.path.join(self._proc_root, pid, "ns", "net")).st_ino
            except OSError:
                continue
        return None

    def _alive(self, netns: int) -> bool:
        return bool(self._netns_names.pids_of(netns)) or self._netns_names.name_of(netns) is not None

    def _retire_vanished(self, groups: list[RawDropGroup]) -> list[RawDropGroup]:
        """Forget the groups of namespaces gone for long enough; returns the groups still live."""
        now = self._clock()
        retiring: set[int] = set()
        for netns in {group.netns for group in groups if group.netns}:
            if self._alive(netns):
                self._missing_since.pop(netns, None)
                continue
            since = self._missing_since.setdefault(netns, now)
            if now - since >= self._config.retire_netns_after:
                retiring.add(netns)
        if not retiring:
            return groups
        live = []
        for group in groups:
            if group.netns not in retiring:
                live.append(group)
                continue
            final = self._source.forget_group(group.reason, group.location, group.netns)
            if final is None:  # already gone (another scrape), or the map refused: keep the last reading
                final = (group.count, group.bytes)
            self._retired[(group.reason, group.location)].add(*final)
        for netns in retiring:
            self._missing_since.pop(netns, None)
            self._containers.pop(netns, None)
        return live

    def _netns_label(self, netns: int) -> str:
        return str(netns) if netns else _UNKNOWN_NETNS

    def _netns_info(self, admitted: Iterable[int]) -> GaugeMetricFamily:
        info = GaugeMetricFamily(
            "netsleuth_netns_info",
            'A network namespace with its own drop series: its `ip netns` name ("host" for the host one), '
            "container, and the Kubernetes namespace and name of the pod it belongs to, to join on the netns "
            "label",
            labels=["netns", "name", "container", "k8s_namespace", "pod"],
        )
        host = self._host_netns()
        for netns in sorted(admitted):
            if not netns:
                continue
            name = self._netns_names.name_of(netns) or ("host" if netns == host else "")
            if netns not in self._containers:
                pids = self._netns_names.pids_of(netns)
                self._containers[netns] = self._container_lookup(pids[0], self._proc_root) if pids else None
            pod = self._pods.pod_of_netns(netns)
            k8s = [pod.namespace, pod.name] if pod is not None else ["", ""]
            info.add_metric([str(netns), name, self._containers[netns] or "", *k8s], 1)
        return info

    # -- exporting -------------------------------------------------------------------------------------
    def _collect(self) -> list[Metric]:
        totals = self._source.totals()
        # A fresh scan each scrape: the name cache only rescans for unknown inodes, never for vanished ones.
        self._netns_names.refresh()
        groups = self._retire_vanished(list(self._source.groups()))
        by_netns: dict[int, int] = defaultdict(int)
        for group in groups:
            by_netns[group.netns] += group.count
        admitted_netns = self._netns_guard.admit(by_netns)

        functions = self._function_names.names(
            [group.location for group in groups] + [address for _, address in self._retired]
        )
        per_netns: dict[tuple[str, str], _Count] = defaultdict(_Count)
        per_location: dict[tuple[str, str], _Count] = defaultdict(_Count)
        for group in groups:
            reason = self._reasons.name(group.reason)
            netns = self._netns_label(group.netns) if group.netns in admitted_netns else OTHER
            per_netns[(reason, netns)].add(group.count, group.bytes)
            per_location[(reason, functions[group.location])].add(group.count, group.bytes)
        for (reason_value, address), count in self._retired.items():
            reason = self._reasons.name(reason_value)
            per_netns[(reason, OTHER)].add(count.drops, count.bytes)
            per_location[(reason, functions[address])].add(count.drops, count.bytes)

        admitted_locations = self._location_guard.admit(
            {key: count.drops for key, count in per_location.items()}
        )
        location_series: dict[tuple[str, str], int] = defaultdict(int)
        for (reason, function), count in per_location.items():
            label = function if (reason, function) in admitted_locations else OTHER
            location_series[(reason, label)] += count.drops

        drops = CounterMetricFamily(
            "netsleuth_drops",
            "Packets the kernel dropped (skb:kfree_skb with a drop reason), by reason and network namespace "
            'inode; netns="other" sums namespaces past the series limit or retired',
            labels=["reason", "netns"],
        )
        dropped_bytes = CounterMetricFamily(
            "netsleuth_dropped_bytes",
            "Bytes (skb->len) of the packets the kernel dropped, by reason and network namespace inode",
            labels=["reason", "netns"],
        )
        for (reason, netns), count in sorted(per_netns.items()):
            drops.add_metric([reason, netns], count.drops)
            dropped_bytes.add_metric([reason, netns], count.bytes)
        by_location = CounterMetricFamily(
            "netsleuth_drops_by_location",
            "Packets the kernel dropped, by reason and the kernel function that freed them; "
            'location="other" sums the pairs past the series limit',
            labels=["reason", "location"],
        )
        for (reason, function), count_drops in sorted(location_series.items()):
            by_location.add_metric([reason, function], count_drops)
        unattributed = CounterMetricFamily(
            "netsleuth_drops_unattributed",
            "Drops counted while the kernel's group map was full, so without reason or namespace; "
            "sum(netsleuth_drops_total) plus this is every drop",
            value=totals.ungrouped,
        )
        groups_in_use = GaugeMetricFamily(
            "netsleuth_drop_groups",
            "Entries (reason x location x netns) in the kernel's drop group map",
            value=len(groups),
        )
        groups_limit = GaugeMetricFamily(
            "netsleuth_drop_groups_limit", "Capacity of the kernel's drop group map", value=DROPS_MAX_GROUPS
        )
        folded = GaugeMetricFamily(
            "netsleuth_drop_series_folded",
            'Label sets summed into an "other" series by the cardinality guard: namespaces (netns) or '
            "reason x function pairs (location); raise the limit in the config if this grows",
            labels=["series"],
        )
        folded.add_metric(["netns"], self._netns_guard.folded)
        folded.add_metric(["location"], self._location_guard.folded)
        return [
            drops,
            dropped_bytes,
            by_location,
            unattributed,
            groups_in_use,
            groups_limit,
            folded,
            self._netns_info(admitted_netns),
        ]


class ExporterDropsSession(DropsSession):
    """The drops program as the exporter runs it, always on: counted and grouped in the kernel, no events."""

    def __init__(self, reasons: DropReasons) -> None:
        super().__init__(DropsProgramConfig(summary_only=True), reasons)


def open_source(inputs: CollectorInputs) -> ExporterDropsSession:
    return ExporterDropsSession(inputs.reasons)


def open_collector(source: ExporterDropsSession, inputs: CollectorInputs) -> DropsCollector:
    return DropsCollector(source, inputs.reasons, FunctionNames(), inputs.exporter.drops)
