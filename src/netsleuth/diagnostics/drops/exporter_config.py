"""The `[exporter.drops]` settings of the agent's file: kept beside drops' collector, which reads them, so the
collector needs nothing from the agent package above it (agent/config.py reads the file into this)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DropsExporterConfig"]


@dataclass(frozen=True)
class DropsExporterConfig:
    enabled: bool = True
    netns_series: int = 50  # namespaces with their own series; the rest are summed as netns="other"
    location_series: int = 100  # (reason, kernel function) pairs with their own series
    retire_netns_after: float = 300.0  # seconds a vanished namespace keeps its series
