"""What the agent's exporter can serve: `ExporterCollector`s, each declared where its code is (node_exporter's
`registerCollector`) - the host's counters in a module of netsleuth.agent.collectors (its `COLLECTORS`), a
diagnostic's on its spec (`DiagnosticSpec.collectors`, e.g. dns's per-server counters). The agent iterates
them (netsleuth.agent.collectors.registered); no collector is named anywhere else.

A collector with BPF programs behind it has a `source`: the agent starts it before it takes sessions (a
failure to attach stops the agent from starting), lists its programs as the exporter's, and closes it when it
stops; its `collector` reads that source at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from netsleuth.agent.config import ExporterConfig
    from netsleuth.kernel.reasons import DropReasons

__all__ = ["CollectorInputs", "ExporterCollector", "ExporterSource"]


class CollectorInputs(msgspec.Struct, frozen=True):
    """What the agent gives every collector: its `[exporter]` settings, the root /proc and /sys are read under
    (a recorded tree in unit tests), and this kernel's drop reason names (read once)."""

    exporter: ExporterConfig
    root: Path
    reasons: DropReasons


class ExporterSource(Protocol):
    """The BPF attachment behind a collector: started before the agent is ready, closed when it stops."""

    @property
    def attach_kind(self) -> str: ...

    def start(self) -> None: ...

    def program_fds(self) -> dict[str, int]: ...

    def close(self) -> None: ...


class ExporterCollector(msgspec.Struct, frozen=True):
    """One collector. `name` labels its scrape timings (netsleuth_scrape_collector_success{collector=...});
    `enabled(exporter)` reads its switch in the `[exporter]` settings; `source(inputs)`, if it has BPF
    programs, makes their (not yet started) attachment; `collector(source, inputs)` the prometheus_client
    collector (`source` is None for one without)."""

    name: str
    enabled: Callable[[ExporterConfig], bool]
    collector: Callable[[Any, CollectorInputs], Collector]
    source: Callable[[CollectorInputs], ExporterSource] | None = None
