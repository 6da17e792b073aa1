"""From a Prometheus alert to a bounded diagnosis on the alerting host, and its verdict back to people.

Alertmanager POSTs its webhook (version 4) to `/api/v1/alerts` with the bearer token of the controller's
alert principal (`[alerts] principal`, a user with its own role). For each firing alert: the diagnosis it
asks for (alert_webhook.py), its host and namespace from its labels (alert_targets.py), the principal's role
(the same check as any session), then the ledger in JetStream KV (alert_state.py: one diagnosis per alert
fingerprint per `dedup_window`, at most `max_per_alert`, `max_per_host` and `max_sessions` per `window`
over every controller), and the session starts through the same path as `POST /api/v1/sessions` - audited
before anything is sent. A resolved alert cancels its diagnosis if it still runs, whichever controller runs
it. When a diagnosis ends, its first verdict line goes to the history (`netsleuth.history.<session>.alert`),
the outgoing webhook and the controller's /metrics (alert_report.py), sent once by whichever controller sees
it end first - the one that started it, or the one that took it over when that one died.

A refused alert (a namespace its host did not report, a role that does not allow it) is audited once per
`dedup_window`: Alertmanager repeats it every `repeat_interval`, and the repeats are counted in the next
record rather than written each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from nats.js import JetStreamContext

from netsleuth.controller.alert_report import AlertMetrics, Notifier, diagnosis_report
from netsleuth.controller.alert_state import AlertLedger, LedgerUnavailable
from netsleuth.controller.alert_targets import choose_host, choose_netns
from netsleuth.controller.alert_webhook import (
    MAX_ALERT_BODY,
    Alert,
    AlertRefused,
    parse_notification,
    plan_for,
)
from netsleuth.controller.audit import AuditLog, AuditUnavailable
from netsleuth.controller.auth import Principal
from netsleuth.controller.config import AlertsConfig, ControllerConfig
from netsleuth.controller.rbac import Denied, Rbac
from netsleuth.controller.registry import HostRegistry
from netsleuth.controller.requests import BadRequest, SessionRequest, parse_session_request
from netsleuth.controller.sessions import FleetSession, SessionManager
from netsleuth.controller.streams import read_stream
from netsleuth.diagnostics.registry import diagnostic_names
from netsleuth.fleet.protocol import SESSIONS_STREAM

__all__ = ["AlertReceiver", "StartRefused", "Starter", "alert_routes"]

_log = logging.getLogger("netsleuth.controller")
_ANSWERED = 200  # alerts shown one by one in the webhook's answer (the counts cover them all)
_SWEEP_S = 3.0  # how often each controller looks for ended diagnoses nobody has reported (another's)
_REFUSALS_KEPT = 4096  # refusals remembered for their audit's dedup; beyond, the oldest are forgotten


class StartRefused(Exception):
    """The session path refused the diagnosis (role, limits, config): its status and sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# The controller's own session start (app.py): authorise with the role, audit, dispatch. `extra` goes into the
# allow record. Raises StartRefused, or AuditUnavailable when nothing could be recorded.
Starter = Callable[[Principal, SessionRequest, str | None, dict[str, Any]], Awaitable[FleetSession]]


@dataclass(frozen=True)
class _Outcome:
    alert: Alert
    outcome: str
    reason: str = ""
    session: str | None = None
    host: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"alert": self.alert.name, "fingerprint": self.alert.fingerprint,
                                "status": self.alert.status, "outcome": self.outcome}  # fmt: skip
        if self.reason:
            body["reason"] = self.reason
        if self.session:
            body["session"] = self.session
        if self.host:
            body["host"] = self.host
        return body


def _link(config: ControllerConfig, session: str) -> str:
    base = config.alerts.public_url if config.alerts and config.alerts.public_url else None
    return f"{base or f'http://{config.http.host}:{config.http.port}'}/#/session/{session}"


class AlertReceiver:
    def __init__(
        self,
        config: ControllerConfig,
        js: JetStreamContext,
        sessions: SessionManager,
        registry: HostRegistry,
        audit: AuditLog,
        rbac: Rbac,
        start_session: Starter,
    ) -> None:
        assert config.alerts is not None
        self._config = config
        self._alerts: AlertsConfig = config.alerts
        self._js = js
        self._sessions = sessions
        self._registry = registry
        self._audit = audit
        self._rbac = rbac
        self._start_session = start_session
        self.metrics = AlertMetrics(sessions.metrics.registry)
        self._ledger = AlertLedger(js, self._alerts, config.nats.replicas)
        self._notifier = Notifier(self._alerts.notify_url, self._alerts.notify_token, self.metrics)
        self._watchers: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        # (fingerprint, sentence) -> [when last audited, repeats since]: the refusal audit's dedup.
        self._refusals: dict[tuple[str, str], list[float]] = {}

    @property
    def principal(self) -> str:
        return self._alerts.principal

    async def start(self) -> None:
        await self._ledger.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="alert-reports")

    async def stop(self) -> None:
        for task in [*self._watchers, *([self._sweeper] if self._sweeper else [])]:
            task.cancel()
        for task in [*self._watchers, *([self._sweeper] if self._sweeper else [])]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._notifier.close()

    # -- the webhook ------------------------------------------------------------------------------------
    async def receive(self, who: Principal, body: bytes, remote: str | None) -> tuple[int, dict[str, Any]]:
        """(HTTP status, answer). Every refusal of the whole notification is audited with its sentence."""
        if who.user != self._alerts.principal:
            return await self._refuse(
                who, remote, 403, f"only the alert principal ({self._alerts.principal}) may post alerts."
            )
        try:
            notification = parse_notification(body)
        except BadRequest as error:
            return await self._refuse(who, remote, error.status, str(error))
        outcomes: list[_Outcome] = []
        try:
            for alert in notification.alerts:
                if alert.status == "firing":
                    outcomes.append(await self._on_firing(who, alert, remote))
                else:
                    outcomes.append(await self._on_resolved(who, alert, remote))
        except LedgerUnavailable as error:
            self.metrics.webhooks.labels("unavailable").inc()
            return 503, {"error": f"nothing more was started: {error}."}
        counts: dict[str, int] = {}
        for outcome in outcomes:
            counts[outcome.outcome] = counts.get(outcome.outcome, 0) + 1
            self.metrics.alerts.labels(outcome.alert.status, outcome.outcome).inc()
        started = [outcome.session for outcome in outcomes if outcome.outcome == "started"]
        with contextlib.suppress(AuditUnavailable):
            await self._audit.record(
                user=who.user, action="alert.webhook", decision="allow", status=200,
                outcome=", ".join(f"{name} {count}" for name, count in sorted(counts.items())),
                remote=remote,
                extra={"group_key": notification.group_key, "alerts": len(outcomes),
                       "truncated_alerts": notification.truncated, "started": started},
            )  # fmt: skip
        self.metrics.webhooks.labels("accepted").inc()
        return 200, {
            "received": len(outcomes),
            "outcomes": counts,
            "started": started,
            "alerts": [outcome.to_json() for outcome in outcomes[:_ANSWERED]],
        }

    async def _refuse(
        self, who: Principal, remote: str | None, status: int, message: str
    ) -> tuple[int, dict[str, Any]]:
        self.metrics.webhooks.labels("refused").inc()
        await self._audit.record(
            user=who.user, action="alert.webhook", decision="deny", reason=message, status=status,
            remote=remote, outcome="refused",
        )  # fmt: skip
        return status, {"error": message}

    async def _on_firing(self, who: Principal, alert: Alert, remote: str | None) -> _Outcome:
        host_id: str | None = None
        try:
            plan = plan_for(alert, self._alerts)
            host = choose_host(alert.labels, self._registry.all())
            host_id = str(host["host"])
            netns = choose_netns(plan.scope, alert.labels, host)
            config = {**plan.config, **({"netns": netns} if netns else {})}
            body = {
                "hosts": [host_id],
                "diagnostic": plan.diagnostic,
                "config": config,
                "duration": plan.duration,
            }
            request = parse_session_request(json.dumps(body).encode(), diagnostic_names())
            # The role first (cheap, and a storm of alerts the role refuses must not use up the ledger).
            self._rbac.check_session(who, request.diagnostic, [host], request.netns)
        except (AlertRefused, BadRequest, Denied) as error:
            return await self._refused(who, alert, str(error), host_id, remote)
        refusal = await self._ledger.claim(alert.fingerprint, alert.name, host_id)
        if refusal is not None:
            return _Outcome(alert, refusal[0], refusal[1], host=host_id)
        extra = {"alert": alert.brief(), "started_by": f"alert {alert.name}"}
        try:
            session = await self._start_session(who, request, remote, extra)
        except StartRefused as error:
            await self._ledger.release(alert.fingerprint)
            return await self._refused(who, alert, error.message, host_id, remote, error.status)
        except AuditUnavailable:
            await self._ledger.release(alert.fingerprint)
            raise
        with contextlib.suppress(LedgerUnavailable):
            await self._ledger.attach(alert.fingerprint, session.id)
        try:
            await self._ledger.pending_report(session.id, alert.brief())
        except LedgerUnavailable as error:  # the watcher below still reports it, unless this controller dies
            _log.warning("session %s: its verdict is not in the ledger to send: %s", session.id, error)
        await self._save_origin(session.id, session.snapshot(timeline=False), alert.brief(), None)
        self.metrics.running.inc()
        watcher = asyncio.create_task(self._watch(session, alert), name=f"alert-{session.id}")
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        _log.info(
            "alert %s (%s) started session %s on %s", alert.name, alert.fingerprint, session.id, host_id
        )
        return _Outcome(alert, "started", session=session.id, host=host_id)

    async def _refused(
        self,
        who: Principal,
        alert: Alert,
        reason: str,
        host: str | None,
        remote: str | None,
        status: int = 422,
    ) -> _Outcome:
        sentence = f"alert {alert.name}: {reason}"
        repeats = self._refusal_repeats(alert.fingerprint, sentence)
        if repeats is None:
            return _Outcome(alert, "refused", sentence, host=host)  # audited within dedup_window
        with contextlib.suppress(AuditUnavailable):
            await self._audit.record(
                user=who.user, action="session.create", decision="deny", reason=sentence, status=status,
                hosts=[host] if host else [], remote=remote, outcome="refused",
                extra={"alert": alert.brief(), "started_by": f"alert {alert.name}",
                       **({"repeats": repeats} if repeats else {})},
            )  # fmt: skip
        return _Outcome(alert, "refused", sentence, host=host)

    def _refusal_repeats(self, fingerprint: str, sentence: str) -> int | None:
        """None: this refusal was audited within `dedup_window` (counted, not written again); else how many
        were counted since the last record (0 the first time)."""
        now = time.monotonic()
        key = (fingerprint, sentence)
        seen = self._refusals.get(key)
        if seen is not None and now - seen[0] < self._alerts.dedup_window:
            seen[1] += 1
            return None
        self._refusals.pop(key, None)
        self._refusals[key] = [now, 0]
        if len(self._refusals) > _REFUSALS_KEPT:
            self._refusals = {
                k: v for k, v in self._refusals.items() if now - v[0] < self._alerts.dedup_window
            }
            while len(self._refusals) > _REFUSALS_KEPT:  # a storm of different refusals: forget the oldest
                del self._refusals[next(iter(self._refusals))]
        return int(seen[1]) if seen is not None else 0

    async def _on_resolved(self, who: Principal, alert: Alert, remote: str | None) -> _Outcome:
        session_id = await self._ledger.session_of(alert.fingerprint)
        # Held here, or run by another controller (followed: the cancel reaches it through the store).
        live = await self._sessions.running(session_id) if session_id else None
        if live is None:
            return _Outcome(alert, "resolved", session=session_id)
        await self._audit.record(
            user=who.user, action="session.cancel", decision="allow", status=200, session=live.id,
            diagnostic=live.spec.diagnostic, hosts=list(live.spec.hosts), remote=remote,
            reason=f"alert {alert.name} resolved", extra={"alert": alert.brief()},
        )  # fmt: skip
        await self._sessions.cancel(live)
        return _Outcome(alert, "cancelled", f"alert {alert.name} resolved", session=live.id)

    # -- after the diagnosis ------------------------------------------------------------------------------
    async def _watch(self, session: FleetSession, alert: Alert) -> None:
        try:
            await session.done.wait()
        finally:
            self.metrics.running.dec()
        await self._report(session.id)

    async def _sweep(self) -> None:
        """The diagnoses another controller started and could not report (it died; this one, or a third,
        took the session over and ended it): reported here once they end."""
        while True:
            await asyncio.sleep(_SWEEP_S)
            try:
                for session_id in await self._ledger.unreported():
                    if self._sessions.has_ended(session_id):
                        await self._report(session_id)
            except Exception as error:  # NATS away: the next sweep tries again
                _log.warning("alert verdicts not swept: %s", error)

    async def _report(self, session_id: str) -> None:
        """The ended session's verdict to the history, the metrics and the outgoing webhook, if this
        controller is the first to take it (the ledger's compare-and-set)."""
        try:
            alert = await self._ledger.take_report(session_id)
        except Exception as error:
            _log.warning("session %s: its alert verdict was not taken to send: %s", session_id, error)
            return
        if alert is None:
            return  # another controller sends it
        snapshot = await self._sessions.get(session_id)
        if snapshot is None:
            _log.warning("session %s: ended, but its result is gone: no alert verdict sent", session_id)
            return
        report = diagnosis_report(alert, snapshot, _link(self._config, session_id))
        self.metrics.finished(
            str(alert.get("name")), session_id, str(snapshot.get("state")), report["cause"], time.time()
        )
        await self._save_origin(session_id, snapshot, alert, report)
        await self._notifier.send(report)

    async def _save_origin(
        self, session_id: str, snapshot: dict[str, Any], alert: dict[str, Any], report: dict[str, Any] | None
    ) -> None:
        """Beside the session's own history (same stream, same retention): which alert started it (`alert`,
        its brief), and once it ended, the verdict's first line. The UI's history marks the session with
        it."""
        record = {
            "session": session_id,
            "alert": alert,
            "started_by": f"alert {alert.get('name')}",
            "user": snapshot.get("user"),
            "hosts": list(snapshot.get("hosts") or {}),
            "created": snapshot.get("created"),
            "state": report["state"] if report else snapshot.get("state"),
            "verdict": report["verdict"] if report else None,
            "cause": report["cause"] if report else None,
            "url": _link(self._config, session_id),
        }
        try:
            await self._js.publish(f"netsleuth.history.{session_id}.alert", json.dumps(record).encode())
        except Exception as error:  # history is best effort, like the session's own
            _log.warning("session %s: alert origin not saved: %s", session_id, error)

    async def diagnoses(self, who: Principal) -> list[dict[str, Any]]:
        """Alert-started diagnoses this principal may see (its own; admins: all), newest first."""
        if not self._rbac.is_owner_or_admin(who, self._alerts.principal):
            return []
        found: list[dict[str, Any]] = []
        with contextlib.suppress(Exception):
            for message in await read_stream(
                self._js, SESSIONS_STREAM, "netsleuth.history.*.alert", last_per_subject=True
            ):
                body = json.loads(message.data)
                if isinstance(body, dict):
                    found.append(body)
        found.sort(key=lambda record: str(record.get("created") or ""), reverse=True)
        return found


def alert_routes(
    receiver: Callable[[], AlertReceiver | None], principal: Callable[[Request], Awaitable[Principal]]
) -> APIRouter:
    """`POST /api/v1/alerts` (Alertmanager's webhook) and `GET /api/v1/alerts` (the alert-started diagnoses);
    their metrics are on the controller's /metrics. `principal` is the app's authentication, which audits a
    refused token (401)."""
    router = APIRouter()

    def configured() -> AlertReceiver:
        found = receiver()
        if found is None:
            from starlette.exceptions import HTTPException

            raise HTTPException(404, "alerts are not configured on this controller ([alerts] table).")
        return found

    @router.post("/api/v1/alerts")
    async def alerts_webhook(request: Request) -> JSONResponse:
        who = await principal(request)
        alerts = configured()
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ALERT_BODY:
                break  # refused by its size: not read further
        remote = request.client.host if request.client else None
        status, answer = await alerts.receive(who, b"".join(chunks), remote)
        return JSONResponse(answer, status_code=status)

    @router.get("/api/v1/alerts")
    async def alert_diagnoses(request: Request) -> JSONResponse:
        who = await principal(request)
        return JSONResponse(await configured().diagnoses(who))

    return router
