"""The parts several record declarations share (the run's clock, the exact totals, a record's owner), declared
once here for netsleuth.diagnostics.record_schemas and the per-diagnostic *_json modules it imports (which
cannot import it back). Schemas and docs/records.md name them without a leading underscore."""

from __future__ import annotations

from typing import NotRequired, TypedDict

__all__ = ["Clock", "Owner", "PodRef", "Totals"]


class Clock(TypedDict):
    monotonic_ns: int
    wall_ns: int
    offset_ns: int


class Totals(TypedDict):
    seen: int
    total: int  # every event that matched the filters: exact
    emitted: int
    sampled: int
    lost: int
    ungrouped: int


class Owner(TypedDict):
    pid: int | None
    comm: str
    owner: str  # "task" | "socket" | "kernel"
    container: str | None
    container_name: NotRequired[str]  # the container runtime's name for `container` (CRI)


class PodRef(TypedDict):
    """The Kubernetes pod whose sandbox holds the record's network namespace (from the container runtime's
    CRI API, netsleuth.kernel.pods); the key is absent where the namespace is no pod's."""

    namespace: str
    name: str
    uid: str
