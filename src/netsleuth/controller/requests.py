"""Reading a session request body: the session request every server reads (netsleuth.spec.session_request:
diagnostic, config, duration, budgets) plus where to run it - `hosts` or a `selector` - each mistake one
sentence and a status code.

A session names its hosts one by one (`hosts`, at most 1,024 and within the 64 KiB body) or by a
`selector` - every registered host, hosts by labels, hosts holding a network namespace, a pod or pods of a
Kubernetes namespace (their registry entries say which) - which is how a fleet-sized session is asked for.
The selector is a typed part of the request (a msgspec Struct, in the controller's OpenAPI), read by the
same validator as the rest.

Two steps, the role check between them (app.py): `parse_session_request` reads the shape, sizes and
types; `read_config` then reads the config with the diagnostic's typed config, its form only (what a
filter names exists or not on each host: the agent checks that, and refuses the task with its own
sentence, the host showing `rejected`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

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
    "Selector",
    "SessionRequest",
    "json_object",
    "parse_session_request",
    "read_config",
]

_MAX_LIST = 64
_MAX_STRING = 256
_MAX_HOSTS = 1024
MANY_HOSTS = (
    'a session on many hosts is asked for with a selector: {"selector": {"all": true}}, '
    '{"selector": {"labels": {"zone": "a"}}}, {"selector": {"netns": "web"}} or '
    '{"selector": {"pod": "team-b/db-0"}}'
)

BadRequest = RequestError  # a refused request: its status, its sentence, the config field to blame

Name = Annotated[str, Meta(min_length=1, max_length=_MAX_STRING)]
LabelKey = Annotated[str, Meta(min_length=1, max_length=_MAX_STRING)]
LabelValue = Annotated[str, Meta(max_length=_MAX_STRING)]


class Selector(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which registered hosts a session runs on (those the user may use): every criterion given must hold;
    `all` alone selects every one."""

    all: Annotated[
        Literal[True] | None,
        Meta(description="every registered host you may use", extra={"words": "true"}),
    ] = None
    labels: Annotated[
        Annotated[dict[LabelKey, LabelValue], Meta(max_length=_MAX_LIST)] | None,
        Meta(
            description="label: value, every pair must match the host's labels",
            extra={"words": f"an object of label: value strings (at most {_MAX_LIST})"},
        ),
    ] = None
    netns: Annotated[Name | None, Meta(description="a network namespace the host holds, by name")] = None
    pod: Annotated[
        Annotated[str, Meta(pattern=r"^[^/]{1,253}/[^/]{1,253}$")] | None,
        Meta(description="a pod the host holds", extra={"words": "NAMESPACE/NAME"}),
    ] = None
    k8s_namespace: Annotated[
        Name | None, Meta(description="a Kubernetes namespace some pod of the host is in")
    ] = None

    def empty(self) -> bool:
        return self.all is None and not self.labels and not any((self.netns, self.pod, self.k8s_namespace))

    def matches(self, host: dict[str, Any]) -> bool:
        """`host`: its registry entry (HostEntry's JSON)."""
        labels = host.get("labels") or {}
        if any(labels.get(key) != value for key, value in (self.labels or {}).items()):
            return False
        if self.netns is not None and not any(
            isinstance(ns, dict) and ns.get("name") == self.netns for ns in host.get("namespaces") or []
        ):
            return False
        pods = [pod for pod in host.get("pods") or [] if isinstance(pod, dict)]
        if self.pod is not None and not any(
            f"{pod.get('namespace')}/{pod.get('name')}" == self.pod for pod in pods
        ):
            return False
        return self.k8s_namespace is None or any(pod.get("namespace") == self.k8s_namespace for pod in pods)

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in msgspec.structs.asdict(self).items() if value is not None}


class FleetRequestBody(SharedRequest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/sessions: the session request and the hosts it runs on (exactly one of the two)."""

    hosts: Annotated[
        list[Any] | None, Meta(description=f"host ids, at most {_MAX_HOSTS}; more: a selector")
    ] = None
    selector: Selector | None = None


@dataclass(frozen=True)
class SessionRequest:
    hosts: tuple[str, ...] | None
    selector: Selector | None
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


def _targets(body: FleetRequestBody) -> tuple[tuple[str, ...] | None, Selector | None]:
    if (body.hosts is None) == (body.selector is None):
        raise BadRequest(
            400, "give exactly one of 'hosts' (a list of host ids) or 'selector'; " + MANY_HOSTS + "."
        )
    if body.selector is not None:
        if body.selector.empty():
            raise BadRequest(400, "field 'selector' names nothing to select by: " + MANY_HOSTS + ".")
        return None, body.selector
    assert body.hosts is not None
    if not body.hosts:
        raise BadRequest(400, "field 'hosts' must be a non-empty list of host ids.")
    if len(body.hosts) > _MAX_HOSTS:
        raise BadRequest(
            413, f"'hosts' names {len(body.hosts)} hosts; at most {_MAX_HOSTS} are allowed; {MANY_HOSTS}."
        )
    try:
        return tuple(dict.fromkeys(validate_host_id(host) for host in body.hosts)), None
    except ProtocolError as error:
        raise BadRequest(400, f"{error}.") from None


def json_object(body: bytes, max_bytes: int, what: str = "the request body") -> dict[str, Any]:
    """A request body that must be one JSON object of at most `max_bytes`: each mistake one sentence."""
    if len(body) > max_bytes:
        size = f"{max_bytes >> 20} MiB" if max_bytes >= 1 << 20 else f"{max_bytes >> 10} KiB"
        raise BadRequest(413, f"{what} is larger than {size}.")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(400, f"{what} is not valid JSON ({error}).") from None
    if not isinstance(data, dict):
        raise BadRequest(400, f"{what} must be a JSON object.")
    return data


def parse_session_request(body: bytes, known_diagnostics: tuple[str, ...]) -> SessionRequest:
    try:
        request, config = decode_session_request(body, FleetRequestBody, known_diagnostics)
    except RequestError as error:
        if error.status == 413 and error.field is None and "body is larger" in str(error):
            # The usual cause: a fleet-sized list of hosts. Say what to send instead.
            raise BadRequest(413, f"{str(error).rstrip('.')}; {MANY_HOSTS}.") from None
        raise
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
