"""The controller's own metrics, served on /metrics for Prometheus: what an operator alerts on before anyone
reads the audit trail.

No series names a host or a user: the page needs no token, and host names are not shown to those who may
not use the hosts (the log and the audit trail name them).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

__all__ = ["REFUSAL_REASONS", "ControllerMetrics"]

# Why a message from an agent was refused (controller/sessions.py).
REFUSAL_REASONS = (
    "other_host",  # its body names a host other than its subject's
    "other_session",  # its body names a session other than its subject's
    "not_in_session",  # its subject's host is not one of the session's
    "malformed",  # not a valid status or record batch
    "unknown_kind",  # neither a status nor records
)
_KINDS = ("status", "records", "other")


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.refused_messages = Counter(
            "netsleuth_controller_refused_messages",
            "Messages from agents on a session's subjects that were refused, by kind and reason (a body "
            "naming another host or session than its subject, a malformed one, ...)",
            ["kind", "reason"],
            registry=self.registry,
        )
        for kind in _KINDS:  # every series from the start: an alert on rate() needs its zero
            for reason in REFUSAL_REASONS:
                self.refused_messages.labels(kind, reason)
        self.taken_over = Counter(
            "netsleuth_controller_sessions_taken_over",
            "Running sessions this controller took over from another whose lease ran out (it stopped, died)",
            registry=self.registry,
        )

    def refused(self, kind: str, reason: str) -> None:
        self.refused_messages.labels(kind if kind in _KINDS else "other", reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
