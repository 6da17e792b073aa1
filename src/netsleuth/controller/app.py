"""The controller's HTTP API (docs/fleet-api.md): FastAPI routes over the session manager, with
authentication and authorisation on every request and an audit record for every decision that matters.

Errors are always `{"error": "<one sentence>"}` with a 4xx code; anything a client sends must not produce a
500, so bodies are read by the session request's own validator (requests.py, netsleuth.spec.session_request:
msgspec, the diagnostics' typed configs) rather than by FastAPI's, whose 422 answers are lists of objects,
not sentences. A refused value also names its config field and the problem apart (`"field": "dport",
"problem": "99999 is not a port: ..."`): the sentence names the CLI's flag for the CLI, and a form marks its
own field and words it with its own label.

FastAPI serves the routes; the OpenAPI document (/openapi.json) carries every registered diagnostic's config
schema and the session request as one of them, chosen by `diagnostic` (diagnostic_schemas.py), and
GET /api/v1/diagnostics gives the web form the same schemas with its labels, groups and flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from nats.errors import Error as NatsError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from netsleuth.controller.alerts import AlertReceiver, StartRefused, alert_routes
from netsleuth.controller.audit import AuditLog, AuditQuery, AuditUnavailable
from netsleuth.controller.auth import Authenticator, AuthError, Principal
from netsleuth.controller.config import ControllerConfig
from netsleuth.controller.diagnostic_schemas import catalogue, openapi_components
from netsleuth.controller.leases import Leases, controller_instance, ensure_owners_bucket
from netsleuth.controller.metrics import ControllerMetrics
from netsleuth.controller.rbac import Denied, Rbac
from netsleuth.controller.registry import HostRegistry
from netsleuth.controller.requests import BadRequest, SessionRequest, parse_session_request, read_config
from netsleuth.controller.session_index import SessionIndex
from netsleuth.controller.session_store import SessionStore
from netsleuth.controller.sessions import FleetSession, SessionManager, SessionSpec
from netsleuth.controller.streams import connect_nats, ensure_streams
from netsleuth.diagnostics.registry import diagnostic_names
from netsleuth.fleet.host_support import SupportTable, diagnostic_needs
from netsleuth.fleet.protocol import Scope, private_key_from_text

__all__ = ["Services", "create_app"]

_log = logging.getLogger("netsleuth.controller")
_KEEPALIVE_S = 15.0


@dataclass
class Services:
    config: ControllerConfig
    auth: Authenticator
    rbac: Rbac
    audit: AuditLog
    registry: HostRegistry
    sessions: SessionManager
    alerts: AlertReceiver | None = None  # [alerts]: Alertmanager webhooks (docs/alerts.md)


class ApiError(Exception):
    """A refusal: its status and sentence; `field` and `problem` when one config field is to blame."""

    def __init__(
        self, status: int, message: str, field: str | None = None, problem: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.problem = problem


def _error(status: int, message: str, field: str | None = None, problem: str | None = None) -> JSONResponse:
    body = {"error": message}
    if field is not None:
        body.update(field=field, problem=problem or message)
    return JSONResponse(body, status_code=status)


def _remote(request: Request) -> str | None:
    return request.client.host if request.client else None


def _ui_dir() -> Path:
    return Path(str(resources.files("netsleuth.controller"))) / "ui"


def create_app(config: ControllerConfig) -> FastAPI:
    holder: dict[str, Services] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        key = private_key_from_text(config.signing_key_file.read_text())
        registry: HostRegistry | None = None
        manager: SessionManager | None = None

        def reconnected() -> None:
            # Back on NATS (maybe on another server of the cluster): watch the registry again, and read back
            # what the running sessions' hosts said meanwhile.
            if registry is not None:
                registry.renew()
            if manager is not None:
                manager.resync()

        nc = await connect_nats(config, on_reconnect=reconnected)
        js = nc.jetstream()
        await ensure_streams(js, config)
        audit = AuditLog(js)
        # What each diagnostic needs imports every diagnostic (a second, more on a busy machine): here, once,
        # rather than in the first GET /hosts a signed-in page waits for.
        support = SupportTable(await asyncio.to_thread(diagnostic_needs))
        await asyncio.to_thread(catalogue)  # the form's schemas, from the same specs
        registry = HostRegistry(
            js, config.sessions.stale_after, lambda host: {"support": _support(support, host)}
        )
        await registry.start()
        index = SessionIndex(js)
        await index.start()
        owners = await ensure_owners_bucket(js, config.sessions.lease_seconds, config.nats.replicas)
        manager = SessionManager(
            nc,
            js,
            config.sessions,
            key,
            config.key_id,
            audit,
            registry.hostnames,
            registry.netns_owners,
            run_ids=registry.run_ids,
            metrics=metrics,
            store=SessionStore(js),
            leases=Leases(owners, controller_instance()),
            index=index,
        )
        await manager.start_background()
        rbac = Rbac(config)
        alerts = None
        if config.alerts is not None:
            alerts = AlertReceiver(config, js, manager, registry, audit, rbac, start_for_alert)
            await alerts.start()
        holder["services"] = Services(config, Authenticator(config), rbac, audit, registry, manager, alerts)
        try:
            yield
        finally:
            if alerts is not None:
                await alerts.stop()
            await manager.stop()
            await index.stop()
            await registry.stop()
            with contextlib.suppress(Exception):
                await nc.drain()

    app = FastAPI(title="netsleuth controller", lifespan=lifespan, docs_url=None, redoc_url=None)
    metrics = ControllerMetrics()

    def openapi() -> dict[str, Any]:
        """FastAPI's document of the routes, with the session request and every diagnostic's config."""
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            document.setdefault("components", {}).setdefault("schemas", {}).update(openapi_components())
            create = document["paths"]["/api/v1/sessions"]["post"]
            create["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SessionRequest"}}},
            }
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    def services() -> Services:
        return holder["services"]

    # -- errors -----------------------------------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return _error(error.status, error.message, error.field, error.problem)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        message = error.detail if isinstance(error.detail, str) else "request refused"
        if error.status_code == 404:
            message = f"no such endpoint {request.url.path}."
        elif error.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}."
        return _error(error.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part not in ("query", "path"))
        return _error(400, f"bad parameter {where}: {first.get('msg', 'invalid')}.")

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> JSONResponse:
        _log.exception("%s %s", request.method, request.url.path)
        return _error(500, "internal error in the controller; its log has the details.")

    @app.exception_handler(AuditUnavailable)
    async def audit_down(request: Request, error: AuditUnavailable) -> JSONResponse:
        return _error(503, f"nothing was done: {error}.")

    @app.exception_handler(NatsError)
    async def nats_down(request: Request, error: NatsError) -> JSONResponse:
        # NATS (or its JetStream: a cluster without a quorum, a stream electing its leader) did not answer.
        _log.warning("%s %s: NATS: %s", request.method, request.url.path, error or type(error).__name__)
        return _error(503, f"NATS did not answer ({error or type(error).__name__}); try again shortly.")

    # -- authentication ---------------------------------------------------------------------------------
    async def principal(request: Request, allow_query_token: bool = False) -> Principal:
        header = request.headers.get("authorization")
        if header is None and allow_query_token and request.query_params.get("access_token"):
            header = "Bearer " + request.query_params["access_token"]
        try:
            return services().auth.authenticate(header)
        except AuthError as error:
            await services().audit.record(
                user=None,
                action="auth",
                decision="deny",
                reason=str(error),
                status=401,
                remote=_remote(request),
                extra={"path": request.url.path},
            )
            raise ApiError(401, str(error)) from None

    async def require_admin(request: Request, who: Principal, action: str) -> None:
        if not services().rbac.is_admin(who):
            reason = "only admins may read the audit trail."
            await services().audit.record(
                user=who.user,
                action=action,
                decision="deny",
                reason=reason,
                status=403,
                remote=_remote(request),
            )
            raise ApiError(403, reason)

    # -- routes -----------------------------------------------------------------------------------------
    @app.get("/api/v1/me")
    async def me(request: Request) -> dict[str, Any]:
        who = await principal(request)
        rbac = services().rbac
        limits = rbac.limits(who)
        return {
            "user": who.user,
            "roles": list(who.roles),
            "admin": rbac.is_admin(who),
            "via": who.via,
            "allowed": rbac.allowed(who),
            "limits": {
                "max_concurrent": limits.max_concurrent,
                "max_duration": limits.max_duration,
                "max_hosts": limits.max_hosts,
            },
        }

    @app.get("/api/v1/diagnostics")
    async def diagnostics(request: Request) -> JSONResponse:
        """Every registered diagnostic: its name, help and config schema, as the web form renders it."""
        await principal(request)
        return JSONResponse(list(await asyncio.to_thread(catalogue)))

    @app.get("/api/v1/auth")
    async def auth_methods() -> dict[str, Any]:
        """Unauthenticated: what a sign-in page may offer. OIDC here is token validation only (the
        controller is no OIDC client), so the page takes a pasted JWT."""
        oidc = config.oidc
        return {
            "token": True,
            "oidc": None if oidc is None else {"issuer": oidc.issuer, "audience": oidc.audience},
        }

    @app.get("/api/v1/hosts")
    async def hosts(request: Request) -> JSONResponse:
        who = await principal(request)
        # JSONResponse directly: FastAPI's generic encoder walks every value of 1,000 entries first.
        return JSONResponse(
            [host for host in services().registry.all() if services().rbac.may_see(who, host)]
        )

    @app.post("/api/v1/sessions", status_code=201)
    async def create_session(request: Request) -> Response:
        who = await principal(request)
        body = await _read_body(request)
        request_data: SessionRequest | None = None
        try:
            request_data = parse_session_request(body, diagnostic_names())
            session = await _authorise_and_start(_remote(request), who, request_data)
        except (BadRequest, ApiError) as error:
            status = error.status
            message = error.message if isinstance(error, ApiError) else str(error)
            field = error.field if isinstance(error, ApiError) else None
            problem = error.problem if isinstance(error, ApiError) else None
            await services().audit.record(
                user=who.user,
                action="session.create",
                decision="deny",
                reason=message,
                status=status,
                diagnostic=request_data.diagnostic if request_data else None,
                hosts=list(request_data.hosts or ()) if request_data else [],
                scope=_asked_scope(request_data).to_json() if request_data else {},
                remote=_remote(request),
                outcome="refused",
            )
            return _error(status, message, field, problem)
        # orjson: the answer for a 10,000-host session is megabytes of host views.
        return Response(
            orjson.dumps(session.snapshot(timeline=False)), status_code=201, media_type="application/json"
        )

    async def _read_body(request: Request) -> bytes:
        from netsleuth.controller.requests import MAX_BODY

        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                # Stop reading: a huge body must not be buffered just to be refused.
                return b"x" * (MAX_BODY + 1)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _resolve_hosts(who: Principal, data: SessionRequest) -> list[dict[str, Any]]:
        registry, rbac = services().registry, services().rbac
        if data.selector is not None:
            selector = data.selector
            chosen = [host for host in registry.all() if selector.matches(host) and rbac.may_see(who, host)]
            if not chosen:
                raise ApiError(404, "no registered host you may use matches the selector.")
            return chosen
        entries = []
        for host_id in data.hosts or ():
            entry = await registry.lookup(host_id)
            if entry is None:
                # An unknown host the user could not see anyway is a 403, so host names do not leak.
                if not rbac.may_see(who, {"host": host_id}):
                    raise ApiError(403, f"your roles do not allow host {host_id}.")
                raise ApiError(404, f"unknown host {host_id}: no agent has registered it.")
            entries.append(entry)
        return entries

    async def _authorise_and_start(
        remote: str | None, who: Principal, data: SessionRequest, origin: dict[str, Any] | None = None
    ) -> FleetSession:
        svc = services()
        chosen = await _resolve_hosts(who, data)
        try:
            svc.rbac.check_session(who, data.diagnostic, chosen, data.netns, data.k8s_namespace)
        except Denied as error:
            raise ApiError(403, str(error)) from None
        try:
            await asyncio.to_thread(read_config, data)  # as the agents will read it; its form only
        except BadRequest as error:
            raise ApiError(error.status, str(error), error.field, error.problem) from None
        scope = _asked_scope(data)
        if scope.k8s_namespaces:
            # An agent older than this kind of scope would read the task without it, and look wider.
            unable = [
                str(host["host"]) for host in chosen if "k8s_namespaces" not in (host.get("scopes") or ())
            ]
            if unable:
                raise ApiError(
                    422,
                    f"host {unable[0]}'s agent cannot hold a Kubernetes namespace scope (it is older than "
                    "this controller): upgrade it, or choose a network namespace.",
                )
        limits = svc.rbac.limits(who)
        if data.duration > limits.max_duration:
            above = f"{data.duration:g} s is above your maximum of {limits.max_duration:g} s"
            raise ApiError(422, f"duration {above}.", field="duration", problem=above)
        if len(chosen) > limits.max_hosts:
            raise ApiError(422, f"{len(chosen)} hosts is more than your maximum of {limits.max_hosts}.")
        running = svc.sessions.active_count(who.user)
        if running >= limits.max_concurrent:
            raise ApiError(429, f"you already run {running} session(s), the most your roles allow.")
        host_ids = tuple(str(host["host"]) for host in chosen)
        session_id = svc.sessions.new_id()
        # The allow decision is stored before anything is sent: if the audit stream cannot take it, the
        # AuditUnavailable propagates (503) and no host hears of this session.
        await svc.audit.record(
            user=who.user,
            action="session.create",
            decision="allow",
            status=201,
            session=session_id,
            diagnostic=data.diagnostic,
            hosts=list(host_ids),
            scope=scope.to_json(),
            remote=remote,
            outcome="dispatched",
            extra={
                "config": data.config,
                "duration": data.duration,
                **({"selector": data.selector.to_json()} if data.selector is not None else {}),
                **(origin or {}),
            },
        )
        spec = SessionSpec(who.user, data.diagnostic, data.config, scope, data.duration, host_ids)
        return await svc.sessions.start(session_id, spec)

    async def start_for_alert(
        who: Principal, data: SessionRequest, remote: str | None, origin: dict[str, Any]
    ) -> FleetSession:
        """A firing alert's diagnosis takes the same path as any session: the role, its limits, the audit."""
        try:
            return await _authorise_and_start(remote, who, data, origin)
        except ApiError as error:
            raise StartRefused(error.status, error.message) from None

    app.include_router(alert_routes(lambda: services().alerts, principal))

    @app.get("/api/v1/sessions")
    async def list_sessions(request: Request) -> JSONResponse:
        who = await principal(request)
        svc = services()
        return JSONResponse(await svc.sessions.listing(None if svc.rbac.is_admin(who) else who.user))

    async def _visible_session(request: Request, who: Principal, session_id: str) -> dict[str, Any]:
        if len(session_id) > 64:
            raise ApiError(404, "no such session.")
        body = await services().sessions.get(session_id)
        if body is None:
            raise ApiError(404, f"no session {session_id}.")
        if not services().rbac.is_owner_or_admin(who, str(body.get("user"))):
            raise ApiError(403, f"session {session_id} belongs to another user.")
        return body

    @app.get("/api/v1/sessions/{session_id}")
    async def get_session(
        request: Request, session_id: str, timeline: bool = True, summary: bool = False
    ) -> Response:
        """`summary=true`: what a listing shows of it (hosts capped, counted by state): what a client of a
        10,000-host session polls for its state."""
        who = await principal(request)
        sessions = services().sessions
        found = None
        if len(session_id) <= 64:
            found = await (
                sessions.get_summary(session_id) if summary else sessions.get_json(session_id, timeline)
            )
        if found is None:
            raise ApiError(404, f"no session {session_id[:64]}.")
        owner, data = found
        if not services().rbac.is_owner_or_admin(who, owner):
            raise ApiError(403, f"session {session_id} belongs to another user.")
        # Already JSON (an ended session is serialised once): no re-encoding of a large timeline per poll.
        return Response(data, media_type="application/json")

    @app.get("/api/v1/sessions/{session_id}/records")
    async def session_records(request: Request, session_id: str) -> Response:
        who = await principal(request)
        body = await _visible_session(request, who, session_id)
        entries = [*body.get("timeline", []), *body.get("verdicts", [])]
        return Response(
            b"".join(orjson.dumps(entry) + b"\n" for entry in entries), media_type="application/x-ndjson"
        )

    @app.post("/api/v1/sessions/{session_id}/cancel")
    async def cancel_session(request: Request, session_id: str) -> dict[str, Any]:
        who = await principal(request)
        body = await _visible_session(request, who, session_id)
        live = services().sessions.get_live(session_id)
        if live is None or not live.active:
            raise ApiError(409, f"session {session_id} already ended.")
        await services().audit.record(
            user=who.user,
            action="session.cancel",
            decision="allow",
            status=200,
            session=session_id,
            diagnostic=str(body.get("diagnostic")),
            hosts=list(live.hosts),
            remote=_remote(request),
        )
        await services().sessions.cancel(live)
        return live.snapshot(timeline=False)

    @app.get("/api/v1/sessions/{session_id}/events")
    async def session_events(request: Request, session_id: str) -> StreamingResponse:
        who = await principal(request, allow_query_token=True)
        body = await _visible_session(request, who, session_id)
        live = services().sessions.get_live(session_id)
        return StreamingResponse(
            _sse(live, body), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    async def _sse(live: FleetSession | None, body: dict[str, Any]) -> AsyncIterator[bytes]:
        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        if live is None or not live.active:
            snapshot = live.snapshot(timeline=True) if live is not None else body
            yield event("session", snapshot)
            for verdict in snapshot.get("verdicts", []):
                yield event("verdict", verdict)
            yield event(
                "end", {k: snapshot.get(k) for k in ("id", "state", "partial", "hosts", "start_spread_ms")}
            )
            return
        # listen() and the snapshot with no await between them: no event is lost or sent twice.
        queue = live.listen()
        try:
            yield event("session", live.snapshot(timeline=True))
            while True:
                try:
                    items = [await asyncio.wait_for(queue.get(), timeout=_KEEPALIVE_S)]
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                # Whatever else is already queued goes out in the same write: at thousands of records a
                # second, one send per event would cost more than the events.
                while len(items) < 1000 and not queue.empty():
                    items.append(queue.get_nowait())
                chunk = []
                for item in items:
                    if item is None:
                        if not live.done.is_set():
                            chunk.append(
                                event(
                                    "end", {"id": live.id, "state": "lagging", "partial": True, "hosts": {}}
                                )
                            )
                        yield b"".join(chunk)
                        return
                    name, data = item
                    chunk.append(event(name, data))
                    if name == "end":
                        yield b"".join(chunk)
                        return
                yield b"".join(chunk)
        finally:
            live.unlisten(queue)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        # Counts only, no host or user names: no token needed (controller/metrics.py).
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/audit")
    async def audit(
        request: Request,
        user: str | None = None,
        decision: str | None = None,
        since: str | None = None,
        limit: int = 200,
    ) -> list[dict[str, Any]]:
        who = await principal(request)
        await require_admin(request, who, "audit.read")
        if decision not in (None, "allow", "deny"):
            raise ApiError(400, "decision must be allow or deny.")
        if not 1 <= limit <= 5000:
            raise ApiError(400, "limit must be from 1 to 5000.")
        return await services().audit.query(
            AuditQuery(user=user, decision=decision, since=_parse_since(since), limit=limit)
        )

    # -- the web UI -------------------------------------------------------------------------------------
    ui = _ui_dir()
    if (ui / "index.html").is_file():
        app.mount("/ui", StaticFiles(directory=ui), name="ui")

        @app.get("/", include_in_schema=False)
        async def index() -> FileResponse:
            return FileResponse(ui / "index.html")

    return app


def _support(table: SupportTable, host: dict[str, Any]) -> list[dict[str, Any]]:
    """Which of its diagnostics the host can run, and why not the others (netsleuth.fleet.host_support)."""
    features = host.get("features")
    offered = host.get("diagnostics")
    return table.of(
        features if isinstance(features, dict) else {},
        [name for name in offered if isinstance(name, str)] if isinstance(offered, list) else [],
    )


def _asked_scope(data: SessionRequest) -> Scope:
    """Where the request looks, as its task's scope: the namespace it names, or the Kubernetes namespace
    whose pods it chooses (the agent resolves them on its host), or neither (the host's own namespace)."""
    k8s_namespace = data.k8s_namespace
    if k8s_namespace is not None:
        return Scope(k8s_namespaces=(k8s_namespace,))
    return Scope(netns=(data.netns,) if data.netns else ())


def _parse_since(text: str | None) -> datetime.datetime | None:
    if text is None or text == "":
        return None
    try:
        if text.replace(".", "", 1).isdigit():
            return datetime.datetime.fromtimestamp(float(text), datetime.UTC)
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise ApiError(400, f"since {text[:40]!r} is neither an ISO time nor unix seconds.") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)
