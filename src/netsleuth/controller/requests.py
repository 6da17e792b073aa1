"""Reading a session request body: the session request every server reads (netsleuth.spec.session_request:
diagnostic, config, duration, budgets) plus where to run it - `hosts` or a label `selector` - each mistake
one sentence and a status code.

Two steps, the role check between them (app.py): `parse_session_request` reads the shape, sizes and
types; `read_config` then reads the config with the diagnostic's typed config, its form only (what a
filter names exists or not on each host: the agent checks that, and refuses the task with its own
sentence, the host showing `rejected`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from netsleuth.fleet.protocol import ProtocolError, validate_host_id
from netsleuth.spec.configs import Speaker
from netsleuth.spec.session_request import (
    MAX_BODY,
    RequestError,
    decode_session_request,
    read_request_config,
)
from netsleuth.spec.session_request import (
    SessionRequest as SharedRequest,
)

__all__ = [
    "MAX_BODY",
    "BadRequest",
    "FleetRequestBody",
    "SessionRequest",
    "parse_session_request",
    "read_config",
]

_MAX_LIST = 64
_MAX_STRING = 256
_MAX_HOSTS = 1024

BadRequest = RequestError  # a refused request: its status, its sentence, the config field to blame


class FleetRequestBody(SharedRequest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/sessions: the session request and the hosts it runs on (exactly one of the two)."""

    hosts: list[Any] | None = None  # host ids
    selector: dict[str, Any] | None = None  # label: value, every pair must match


@dataclass(frozen=True)
class SessionRequest:
    hosts: tuple[str, ...] | None
    selector: dict[str, str] | None
    diagnostic: str
    config: dict[str, Any]
    duration: float

    @property
    def netns(self) -> str | None:
        value = self.config.get("netns")
        return str(value) if value is not None else None

    @property
    def k8s_namespace(self) -> str | None:
        """The Kubernetes namespace the config chooses pods by (`k8s_namespace`, or a `pod`'s)."""
        value = self.config.get("k8s_namespace")
        if isinstance(value, str):
            return value
        pod = self.config.get("pod")
        return pod.partition("/")[0] if isinstance(pod, str) and "/" in pod else None


def _targets(body: FleetRequestBody) -> tuple[tuple[str, ...] | None, dict[str, str] | None]:
    if (body.hosts is None) == (body.selector is None):
        raise BadRequest(400, "give exactly one of 'hosts' (a list of host ids) or 'selector' (labels).")
    if body.hosts is not None:
        if not body.hosts:
            raise BadRequest(400, "field 'hosts' must be a non-empty list of host ids.")
        if len(body.hosts) > _MAX_HOSTS:
            raise BadRequest(413, f"'hosts' names {len(body.hosts)} hosts; at most {_MAX_HOSTS} are allowed.")
        try:
            return tuple(dict.fromkeys(validate_host_id(host) for host in body.hosts)), None
        except ProtocolError as error:
            raise BadRequest(400, f"{error}.") from None
    selector = body.selector or {}
    if (
        not selector
        or len(selector) > _MAX_LIST
        or not all(isinstance(v, str) and len(v) <= _MAX_STRING for v in selector.values())
    ):
        raise BadRequest(400, "field 'selector' must be a non-empty object of label: value strings.")
    return None, {str(k): v for k, v in selector.items()}


def parse_session_request(body: bytes, known_diagnostics: tuple[str, ...]) -> SessionRequest:
    request, config = decode_session_request(body, FleetRequestBody, known_diagnostics)
    hosts, selector = _targets(request)
    netns = config.get("netns")
    if netns is not None and not (isinstance(netns, str) and netns):
        raise BadRequest(400, "config.netns must be one namespace name.")
    if request.duration is None:
        raise BadRequest(400, "field 'duration' must be a number of seconds above 0.")
    for budget in ("max_events", "max_bytes", "cpu_budget_percent"):
        if getattr(request, budget) is not None:
            # Not yet carried into the signed task (each agent caps its tasks with its own [sessions]):
            # refused rather than accepted and ignored.
            raise BadRequest(
                400, f"{budget} is not taken by the controller yet: each agent's [sessions] limits apply."
            )
    return SessionRequest(hosts, selector, request.diagnostic, config, request.duration)


def read_config(request: SessionRequest) -> Any:
    """The request's config read by its diagnostic's typed config, as the agents will read it (None: what
    only they can check); BadRequest (422) with the diagnostic's sentence - naming the CLI's flag, for
    `netsleuth fleet run` - and the field to blame. The session's duration is the config's too where the
    diagnostic has one (diagnose's window), so its own limit on it holds."""
    from netsleuth.diagnostics.registry import get_diagnostic

    config = dict(request.config)
    if "duration" in get_diagnostic(request.diagnostic).keys:
        config.setdefault("duration", request.duration)
    return read_request_config(request.diagnostic, config, speaker=Speaker.CLI, elsewhere=True)
