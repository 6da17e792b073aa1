"""The records an agent session adds around a diagnostic's own (netsleuth.agent.sessions): the first line,
what was asked and how it attached, and the last, why the session ended and what it cost."""

from __future__ import annotations

from typing import Any

from netsleuth.spec.records import Record

__all__ = ["SessionEnd", "SessionStart"]


class SessionStart(Record, frozen=True, kw_only=True, tag="session_start"):
    id: str
    diagnostic: str
    # The request's config as the client gave it (each diagnostic's own keys: docs/agent.md).
    config: dict[str, Any]
    duration: float
    max_events: int
    max_bytes: int
    cpu_budget_percent: float
    attach: str


class SessionEnd(Record, frozen=True, kw_only=True, tag="session_end"):
    id: str
    reason: str  # duration, max_events, max_bytes, cpu_budget, agent_stopping, client_gone, error
    detail: str
    seconds: float
    events: int
    bytes: int
    bpf_run_time_ns: int
    bpf_cpu_percent: float
    notes: list[str]
