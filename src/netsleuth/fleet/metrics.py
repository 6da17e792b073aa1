"""The fleet link's own metrics on the agent's /metrics: is it connected, registering, refusing tasks, how far
its clock is from the fleet's reference - what an operator alerts on before a diagnosis is needed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from netsleuth.fleet.outbox import OutboxCounts
from netsleuth.fleet.refusal_audit import RefusalAudit

__all__ = ["FleetCollector"]


class _LinkState(Protocol):
    @property
    def is_connected(self) -> bool: ...

    @property
    def registrations(self) -> int: ...

    @property
    def accepted(self) -> int: ...

    @property
    def refused(self) -> int: ...

    @property
    def active_sessions(self) -> int: ...

    @property
    def clock_offset_ns(self) -> int | None: ...

    @property
    def withheld(self) -> int: ...

    @property
    def audit(self) -> RefusalAudit: ...

    @property
    def outbox(self) -> OutboxCounts: ...


class FleetCollector:
    def __init__(self, link: _LinkState) -> None:
        self._link = link

    def collect(self) -> Iterable[Metric]:
        link = self._link
        connected = "1 while the fleet link is connected to NATS"
        yield GaugeMetricFamily("netsleuth_fleet_connected", connected, value=int(link.is_connected))
        registrations = "Registry entries written (heartbeats)"
        yield CounterMetricFamily("netsleuth_fleet_registrations", registrations, value=link.registrations)
        tasks = CounterMetricFamily("netsleuth_fleet_tasks", "Tasks, by decision", labels=["decision"])
        tasks.add_metric(["accepted"], link.accepted)
        tasks.add_metric(["refused"], link.refused)
        yield tasks
        withheld = "Records and entries of records held back as outside their task's scope (scope_filter.py)"
        yield CounterMetricFamily("netsleuth_fleet_records_withheld", withheld, value=link.withheld)
        audit = CounterMetricFamily(
            "netsleuth_fleet_audit_records",
            "This agent's refusal records: written, left out over the rate (counted in the next one "
            "written), or not stored by the audit stream",
            labels=["outcome"],
        )
        audit.add_metric(["written"], link.audit.written)
        audit.add_metric(["left_out"], link.audit.left_out)
        audit.add_metric(["unstored"], link.audit.unstored)
        yield audit
        outbox = link.outbox
        messages = CounterMetricFamily(
            "netsleuth_fleet_session_messages",
            "Session statuses and record batches sent for JetStream to store: stored (acknowledged), resent "
            "(no acknowledgement: sent again), dropped (no room, or not stored within a minute), refused by "
            "the stream",
            labels=["outcome"],
        )
        for outcome in ("stored", "resent", "dropped", "refused"):
            messages.add_metric([outcome], getattr(outbox, outcome))
        yield messages
        active = "Fleet sessions preparing or running"
        yield GaugeMetricFamily("netsleuth_fleet_sessions_active", active, value=link.active_sessions)
        offset = link.clock_offset_ns
        if offset is not None:
            yield GaugeMetricFamily(
                "netsleuth_fleet_clock_offset_seconds",
                "This host's wall clock minus the NATS server's (best of the last heartbeats)",
                value=offset / 1e9,
            )
