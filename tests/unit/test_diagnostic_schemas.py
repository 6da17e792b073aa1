"""What the controller publishes about each registered diagnostic comes from its spec: the web form's
catalogue and the OpenAPI document carry every diagnostic's config schema, and the form's JavaScript names
no diagnostic and no filter."""

from __future__ import annotations

import re
from pathlib import Path

from netsleuth.controller.diagnostic_schemas import catalogue, openapi_components
from netsleuth.diagnostics.registry import diagnostic_names

NEWSESSION = Path(__file__).resolve().parents[2] / "src/netsleuth/controller/ui/js/newsession.js"


def test_every_registered_diagnostic_has_its_config_schema_in_the_catalogue_and_the_openapi() -> None:
    entries = {entry["name"]: entry for entry in catalogue()}
    assert list(entries) == list(diagnostic_names())
    components = openapi_components()
    mapping = components["SessionRequest"]["discriminator"]["mapping"]
    assert set(mapping) == set(entries)
    for name, entry in entries.items():
        properties = entry["config"]["properties"]
        assert entry["help"] and properties, name
        assert components[f"config.{name}"]["properties"].keys() == properties.keys()
        variant = components[f"SessionRequest.{name}"]
        assert variant["properties"]["diagnostic"] == {"const": name}
        assert mapping[name] == f"#/components/schemas/SessionRequest.{name}"
    # A typed config's fields carry their label, help, fieldset and CLI flag; the scope fields are marked.
    dport = entries["route"]["config"]["properties"]["dport"]
    assert (dport["title"], dport["x-flag"], dport["x-group"]) == (
        "destination port",
        "--dport",
        "filters (applied in the kernel)",
    )
    netns = entries["snoop.exec"]["config"]["properties"]["netns"]
    assert netns["x-scope"] == "network-namespace"
    assert entries["route"]["config"]["properties"]["k8s_namespace"]["x-scope"] == "kubernetes-namespace"
    assert entries["route"]["config"]["properties"]["duration"]["x-form"] is False  # the session's own
    assert entries["softirq"]["scope"]["host_wide_only"]


def test_the_forms_javascript_names_no_diagnostic_and_no_filter() -> None:
    source = NEWSESSION.read_text()
    literals = set(re.findall(r"""["'`]([A-Za-z0-9_.\-]+)["'`]""", source))
    names = set(diagnostic_names())
    fields = {
        name
        for entry in catalogue()
        for name in entry["config"]["properties"]
        if name not in ("duration", "v")  # the session request's own field, and the schema's version
    }
    # Words that are also some diagnostic's field name but mean something else there: the HTML element
    # <summary>, and the role's name for a host's own namespace (controller/rbac.py HOST_NETNS).
    other_meanings = {"summary", "host"}
    assert not names & literals, names & literals
    assert not (fields & literals) - other_meanings, fields & literals
