"""Alertmanager's webhook body (version 4) and the diagnosis a firing alert asks for.

The body is what Alertmanager's webhook receiver POSTs (`receiver`, `status`, `alerts[]` each with `status`,
`labels`, `annotations`, `startsAt`, `endsAt`, `generatorURL`, `fingerprint`, then `groupLabels`,
`commonLabels`, `commonAnnotations`, `externalURL`, `version: "4"`, `groupKey`, `truncatedAlerts`). Every
mistake is one sentence and a 4xx (BadRequest), like the rest of the API. A rule says what to run in its
`netsleuth_diagnostic` annotation (JSON, packaging/prometheus/netsleuth-alerts.yml); without one the
controller's default diagnostic runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, cast

from netsleuth.controller.config import AlertsConfig
from netsleuth.controller.requests import BadRequest, json_object

__all__ = [
    "ANNOTATION",
    "MAX_ALERT_BODY",
    "SCOPES",
    "Alert",
    "AlertRefused",
    "DiagnosticPlan",
    "Notification",
    "parse_notification",
    "plan_for",
]

ANNOTATION = "netsleuth_diagnostic"
MAX_ALERT_BODY = 4 << 20  # Alertmanager sends a whole group at once: 1,000 alerts are ~0.7 MiB
_MAX_ALERTS = 5000
_MAX_LABELS = 64
_MAX_VALUE = 1024
_MAX_ANNOTATION = 8192
_FINGERPRINT = re.compile(r"^[0-9A-Za-z]{1,64}$")
# Where a diagnosis looks, from the alert's labels (alert_targets.py): the namespace the alert names, the
# host's own namespace, the whole host; pod and Kubernetes namespace scopes are read but refused until the
# registry knows pods.
SCOPES = ("netns", "host", "*", "pod", "k8s_namespace")
Scope = Literal["netns", "host", "*", "pod", "k8s_namespace"]


class AlertRefused(Exception):
    """This alert starts nothing: the sentence is what the audit, the metrics and the answer say."""


@dataclass(frozen=True)
class Alert:
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str]
    fingerprint: str
    starts_at: str
    generator_url: str

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    def brief(self) -> dict[str, Any]:
        """What the audit, the history and the outgoing webhook keep of the alert."""
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "status": self.status,
            "labels": self.labels,
            "summary": self.annotations.get("summary", ""),
            "starts_at": self.starts_at,
            "generator_url": self.generator_url,
        }


@dataclass(frozen=True)
class Notification:
    receiver: str
    status: str
    group_key: str
    external_url: str
    truncated: int
    alerts: tuple[Alert, ...]


def _strings(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise BadRequest(400, f"{where} must be an object of strings.")
    if len(value) > _MAX_LABELS:
        raise BadRequest(413, f"{where} has {len(value)} entries; at most {_MAX_LABELS} are allowed.")
    for key, item in value.items():
        if not isinstance(item, str):
            raise BadRequest(400, f"{where}.{str(key)[:40]} must be a string.")
        limit = _MAX_ANNOTATION if where.endswith("annotations") else _MAX_VALUE
        if len(key) > _MAX_VALUE or len(item) > limit:
            raise BadRequest(413, f"{where}.{str(key)[:40]} is longer than {limit} characters.")
    return cast(dict[str, str], value)


def _text(
    data: dict[str, Any], key: str, where: str, default: str | None = None, limit: int = _MAX_VALUE
) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or len(value) > limit:
        raise BadRequest(400, f"{where}{key} must be a string of at most {limit} characters.")
    return value


def _alert(index: int, raw: object) -> Alert:
    where = f"alerts[{index}]."
    if not isinstance(raw, dict):
        raise BadRequest(400, f"alerts[{index}] must be an object.")
    status = raw.get("status")
    if status not in ("firing", "resolved"):
        raise BadRequest(400, f"{where}status must be 'firing' or 'resolved' (got {str(status)[:40]!r}).")
    labels = _strings(raw.get("labels"), f"{where}labels")
    if not labels.get("alertname"):
        raise BadRequest(400, f"{where}labels has no alertname.")
    fingerprint = raw.get("fingerprint")
    if not isinstance(fingerprint, str) or not _FINGERPRINT.match(fingerprint):
        raise BadRequest(
            400, f"{where}fingerprint must be Alertmanager's alert fingerprint (1-64 letters/digits)."
        )
    return Alert(
        status=cast(Literal["firing", "resolved"], status),
        labels=labels,
        annotations=_strings(raw.get("annotations", {}), f"{where}annotations"),
        fingerprint=fingerprint,
        starts_at=_text(raw, "startsAt", where, ""),
        # The rule's whole expression, URL-encoded: as long as an annotation may be.
        generator_url=_text(raw, "generatorURL", where, "", _MAX_ANNOTATION),
    )


def parse_notification(body: bytes) -> Notification:
    """Raises BadRequest (status and one sentence) for anything that is not Alertmanager's webhook body."""
    data = json_object(body, MAX_ALERT_BODY, "the notification")
    version = data.get("version")
    if version != "4":
        raise BadRequest(
            400, f'this endpoint reads Alertmanager\'s webhook version "4" (got {str(version)[:20]!r}).'
        )
    alerts = data.get("alerts")
    if not isinstance(alerts, list) or not alerts:
        raise BadRequest(400, "alerts must be a non-empty list.")
    if len(alerts) > _MAX_ALERTS:
        raise BadRequest(413, f"the notification holds {len(alerts)} alerts; at most {_MAX_ALERTS} are read.")
    truncated = data.get("truncatedAlerts", 0)
    if isinstance(truncated, bool) or not isinstance(truncated, int) or truncated < 0:
        raise BadRequest(400, "truncatedAlerts must be a whole number.")
    return Notification(
        receiver=_text(data, "receiver", "", ""),
        status=_text(data, "status", "", ""),
        group_key=_text(data, "groupKey", "", ""),
        external_url=_text(data, "externalURL", "", ""),
        truncated=truncated,
        alerts=tuple(_alert(index, raw) for index, raw in enumerate(alerts)),
    )


@dataclass(frozen=True)
class DiagnosticPlan:
    """What one firing alert asks for, before hosts, scope and the role are applied."""

    diagnostic: str
    config: dict[str, Any]
    scope: Scope | None  # None: the namespace the labels name if they name one, else the host's own
    duration: float


def plan_for(alert: Alert, defaults: AlertsConfig) -> DiagnosticPlan:
    """The rule's `netsleuth_diagnostic` annotation, or the controller's default diagnosis. What the
    config means is checked later by the diagnostic's own reader, as for any session."""
    text = alert.annotations.get(ANNOTATION)
    if text is None:
        return DiagnosticPlan(defaults.diagnostic, {}, None, defaults.duration)
    try:
        data = json.loads(text)
    except ValueError as error:
        raise AlertRefused(f"its {ANNOTATION} annotation is not JSON ({error}).") from None
    if not isinstance(data, dict):
        raise AlertRefused(f"its {ANNOTATION} annotation must be a JSON object.")
    unknown = sorted(set(data) - {"diagnostic", "config", "scope", "duration"})
    if unknown:
        raise AlertRefused(
            f"its {ANNOTATION} annotation has unknown key {unknown[0]!r} (known: config, diagnostic, "
            "duration, scope)."
        )
    diagnostic = data.get("diagnostic", defaults.diagnostic)
    if not isinstance(diagnostic, str) or not diagnostic:
        raise AlertRefused(f"{ANNOTATION}.diagnostic must be a diagnostic's name.")
    config = data.get("config", {})
    if not isinstance(config, dict):
        raise AlertRefused(f"{ANNOTATION}.config must be an object of filters.")
    scope = data.get("scope")
    if scope is not None and scope not in SCOPES:
        raise AlertRefused(
            f"{ANNOTATION}.scope must be one of {', '.join(SCOPES)} (got {str(scope)[:40]!r})."
        )
    duration = data.get("duration", defaults.duration)
    if isinstance(duration, bool) or not isinstance(duration, int | float) or not duration > 0:
        raise AlertRefused(f"{ANNOTATION}.duration must be a number of seconds above 0.")
    if "netns" in config:
        raise AlertRefused(
            f"{ANNOTATION}.config may not name a netns: the scope comes from the alert's labels."
        )
    return DiagnosticPlan(diagnostic, dict(config), cast(Scope | None, scope), float(duration))
