"""What the controller publishes about each registered diagnostic, derived from its spec and nothing else:
the web form's catalogue (GET /api/v1/diagnostics) and the config schemas in its OpenAPI document.

Each entry is the diagnostic's name, help and its config's JSON Schema (netsleuth.spec.schemas: each field's
`title` label, `description` help, `x-group` fieldset and `x-flag` CLI spelling), with what a form needs to
know about the fleet on top:
- `x-scope` on the fields its `ScopeTraits` name: `network-namespace` (the form offers the namespaces the
  role allows and the hosts report), `kubernetes-namespace` (the Kubernetes namespaces the role allows and
  the hosts' pods are in), `address`;
- `x-form: false` on a config field the session request itself sets (`duration`: the session's own);
- `scope.host_wide_only`: why it runs only host-wide, if it does.
The form names no diagnostic and no filter: it renders what this says (controller/ui/js/newsession.js).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic
from netsleuth.spec.schemas import config_schema, schema_components
from netsleuth.spec.session_request import SessionRequest

__all__ = ["catalogue", "openapi_components", "session_request_schema"]

_REF = "#/components/schemas/"
# A scope role (spec.scope.ScopeTraits) as the form's `x-scope` says it.
_X_SCOPE = {"netns": "network-namespace", "k8s_namespace": "kubernetes-namespace", "address": "address"}


def _scope_fields(spec: Any) -> tuple[dict[str, str], str | None]:
    """{config field: scope role} and why it runs only host-wide (None: it can be kept in a namespace)."""
    traits = spec.scope
    roles = {role: traits.field_of(spec.config, role) for role in ("netns", "address", "k8s_namespace")}
    fields = {field: role for role, field in roles.items() if field is not None}
    return fields, traits.host_wide_only


def _form_schema(spec: Any) -> dict[str, Any]:
    schema = copy.deepcopy(config_schema(spec.config, title=spec.name))
    properties: dict[str, Any] = schema.get("properties", {})
    fields, _why = _scope_fields(spec)
    for name, role in fields.items():
        if name in properties:
            properties[name]["x-scope"] = _X_SCOPE[role]
    for name in SessionRequest.__struct_fields__:
        if name in properties and name not in ("diagnostic", "config"):
            # The session request's own field (its duration) is the config's too: asked once, not twice.
            properties[name]["x-form"] = False
            properties[name]["x-session"] = True
    return schema


@functools.cache
def catalogue() -> tuple[dict[str, Any], ...]:
    """Every registered diagnostic as the form renders it, in the registry's order (importing each one:
    called once, off the event loop)."""
    entries = []
    for name in diagnostic_names():
        spec = get_diagnostic(name)
        _fields, why = _scope_fields(spec)
        entries.append(
            {
                "name": name,
                "help": spec.help,
                "description": getattr(spec, "description", "") or spec.help,
                "config": _form_schema(spec),
                "scope": {"host_wide_only": why},
            }
        )
    return tuple(entries)


def _component(name: str) -> str:
    return "config." + name


def session_request_schema(names: list[str]) -> dict[str, Any]:
    """The session request with its config one of the diagnostics' configs, chosen by `diagnostic`."""
    variants = {name: f"{_REF}SessionRequest.{name}" for name in names}
    return {
        "allOf": [{"$ref": f"{_REF}FleetSessionRequest"}],
        "oneOf": [{"$ref": ref} for ref in variants.values()],
        "discriminator": {"propertyName": "diagnostic", "mapping": variants},
    }


@functools.cache
def openapi_components() -> dict[str, Any]:
    """Components of the controller's OpenAPI: the request envelope, each diagnostic's config and the
    variant of the request that carries it."""
    from netsleuth.controller.requests import FleetRequestBody

    (envelope,), shared = schema_components([FleetRequestBody])
    components: dict[str, Any] = dict(shared)
    components["FleetSessionRequest"] = components.pop(envelope["$ref"].removeprefix(_REF), envelope)
    names = []
    for entry in catalogue():
        name = entry["name"]
        names.append(name)
        config = dict(entry["config"])
        config.pop("$schema", None)
        for nested, body in config.pop("$defs", {}).items():
            components.setdefault(nested, body)
        components[_component(name)] = _refs_to_components(config)
        components[f"SessionRequest.{name}"] = {
            "type": "object",
            "properties": {
                "diagnostic": {"const": name},
                "config": {"$ref": f"{_REF}{_component(name)}"},
            },
            "required": ["diagnostic"],
            "description": entry["help"],
        }
    components["SessionRequest"] = session_request_schema(names)
    return components


def _refs_to_components(schema: Any) -> Any:
    """msgspec's `#/$defs/X` references as OpenAPI's `#/components/schemas/X`."""
    if isinstance(schema, dict):
        return {
            key: (
                value.replace("#/$defs/", _REF)
                if key == "$ref" and isinstance(value, str)
                else _refs_to_components(value)
            )
            for key, value in schema.items()
        }
    if isinstance(schema, list):
        return [_refs_to_components(item) for item in schema]
    return schema
