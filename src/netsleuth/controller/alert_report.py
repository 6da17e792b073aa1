"""What an alert's diagnosis found, said back to people: its first line, the outgoing webhook, the metrics.

The first line is the worst verdict the hosts' `diagnose` gave (severity, then each host's own rank), else
the first merged per-flow verdict, else what the session saw without a verdict - always one line, naming the
host. The outgoing webhook gets it with the hosts and a link to the session; its `text` field is what chat
webhooks (Slack-compatible) show as is.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["AlertMetrics", "Notifier", "diagnosis_report", "first_line"]

_log = logging.getLogger("netsleuth.controller")
_SEVERITY = {"critical": 0, "warning": 1, "info": 2}
_ATTEMPTS = 3


def _host_verdicts(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    entries = [
        entry
        for entry in snapshot.get("timeline") or []
        if entry.get("type") == "verdict" and isinstance(entry.get("cause"), str)
    ]
    return sorted(
        entries,
        key=lambda entry: (_SEVERITY.get(str(entry.get("severity")), 3), int(entry.get("rank") or 99)),
    )


def first_line(snapshot: dict[str, Any]) -> tuple[str, str]:
    """(the verdict's first line, its cause category or outcome: "" when nothing was found)."""
    verdicts = _host_verdicts(snapshot)
    if verdicts:
        best = verdicts[0]
        return f"{best.get('host')}: {best['cause']}", str(best.get("category") or "")
    flows = snapshot.get("verdicts") or []
    if flows:
        return str(flows[0].get("text") or ""), str(flows[0].get("outcome") or "")
    hosts = snapshot.get("hosts") or {}
    problems = [f"{host} {view.get('state')}: {view.get('reason')}" for host, view in hosts.items()
                if view.get("state") != "ended"]  # fmt: skip
    if problems:
        return f"no verdict: {'; '.join(problems)}", ""
    events = sum(int((view.get("totals") or {}).get("total", 0)) for view in hosts.values())
    return (
        f"no cause found: {snapshot.get('diagnostic')} saw {events} event(s) on {', '.join(hosts)} "
        f"in {float(snapshot.get('duration') or 0):g} s",
        "",
    )


def diagnosis_report(alert: dict[str, Any], snapshot: dict[str, Any], link: str) -> dict[str, Any]:
    """The outgoing webhook's body (and the history's record of the outcome); `alert`: its brief (what the
    ledger keeps of it for whichever controller sends the verdict)."""
    line, cause = first_line(snapshot)
    hosts = list(snapshot.get("hosts") or {})
    details = [f"{entry.get('host')}: {entry['cause']}" for entry in _host_verdicts(snapshot)[:5]]
    details += [str(verdict.get("text")) for verdict in (snapshot.get("verdicts") or [])[:5]]
    return {
        "text": f"{alert.get('name')} on {', '.join(hosts)}: {line} ({link})",
        "alert": alert,
        "session": snapshot.get("id"),
        "url": link,
        "state": snapshot.get("state"),
        "partial": bool(snapshot.get("partial")),
        "diagnostic": snapshot.get("diagnostic"),
        "hosts": hosts,
        "scope": snapshot.get("scope"),
        "verdict": line,
        "cause": cause,
        "verdicts": details,
    }


class AlertMetrics:
    """On the controller's /metrics (its one registry: controller/metrics.py): what alerts asked for and what
    their diagnoses found. Labels stay few (outcome, alert rule, cause category): verdict text, hosts and
    addresses go to authenticated readers only."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.webhooks = Counter(
            "netsleuth_alert_webhooks", "Alertmanager notifications received, by result",
            ["result"], registry=self.registry,
        )  # fmt: skip
        self.alerts = Counter(
            "netsleuth_alert_alerts",
            "Alerts received, by status and what the controller did (started, duplicate, capped, "
            "rate_limited_alert, rate_limited_host, refused, cancelled, resolved)",
            ["status", "outcome"], registry=self.registry,
        )  # fmt: skip
        self.running = Gauge(
            "netsleuth_alert_diagnoses_running", "Alert-started diagnoses this controller runs now",
            registry=self.registry,
        )  # fmt: skip
        self.diagnoses = Counter(
            "netsleuth_alert_diagnoses", "Alert-started diagnoses that finished, by alert rule and state",
            ["alertname", "state"], registry=self.registry,
        )  # fmt: skip
        self.last = Gauge(
            "netsleuth_alert_diagnosis_info",
            "The last diagnosis an alert rule started (value: when it finished, unix seconds), with the "
            "session and the cause category of its first verdict",
            ["alertname", "session", "state", "cause"], registry=self.registry,
        )  # fmt: skip
        self.notifications = Counter(
            "netsleuth_alert_notifications", "Verdicts POSTed to alerts.notify_url, by result",
            ["result"], registry=self.registry,
        )  # fmt: skip
        self._last_labels: dict[str, tuple[str, str, str, str]] = {}

    def finished(self, alertname: str, session: str, state: str, cause: str, when: float) -> None:
        self.diagnoses.labels(alertname, state).inc()
        previous = self._last_labels.pop(alertname, None)
        if previous is not None:
            self.last.remove(*previous)
        labels = (alertname, session, state, cause)
        self.last.labels(*labels).set(when)
        self._last_labels[alertname] = labels


class Notifier:
    """POSTs each verdict to the configured URL: a few attempts, then counted as failed (never blocking a
    diagnosis or another alert)."""

    def __init__(self, url: str | None, token: str | None, metrics: AlertMetrics) -> None:
        self._url = url
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._metrics = metrics
        self._client = httpx.AsyncClient(timeout=5.0) if url else None

    async def send(self, report: dict[str, Any]) -> None:
        if self._client is None or self._url is None:
            return
        error: Exception | str = ""
        for attempt in range(_ATTEMPTS):
            try:
                response = await self._client.post(self._url, json=report, headers=self._headers)
                if response.status_code < 300:
                    self._metrics.notifications.labels("sent").inc()
                    return
                error = f"HTTP {response.status_code}"
            except httpx.HTTPError as failure:
                error = failure
            await asyncio.sleep(0.5 * (attempt + 1))
        self._metrics.notifications.labels("failed").inc()
        _log.warning("alerts: the verdict of session %s was not delivered to %s: %s",
                     report.get("session"), self._url, error)  # fmt: skip

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
