"""Which registered host an alert is about, and which of its namespaces to look in, from the alert's labels.

The host: the `netsleuth_host` or `host` label (a scrape target label: docs/alerts.md), else `instance`
without its port, matched against host ids and then the hostnames agents registered (one match, or the
alert is refused: guessing a host would diagnose the wrong machine). The namespace, for a rule whose scope is
`netns`: `netns_name` (from netsleuth_netns_info; `host` is the host's own), else the `netns` inode, else
`container_id`, each looked up in that host's registry entry; a namespace the host does not list is refused,
so an alert can never widen a diagnosis beyond what its host reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from netsleuth.controller.alert_webhook import AlertRefused, Scope

__all__ = ["HOST_LABELS", "HOST_WIDE", "choose_host", "choose_netns"]

HOST_LABELS = ("netsleuth_host", "host")
HOST_WIDE = "*"  # the session config's netns for "every namespace of the host"
_OWN_NETNS = "host"  # netsleuth_netns_info's name for the host's own namespace
_PORT = re.compile(r"^(?P<name>.+?)(:\d+)?$")


def _instance_name(instance: str) -> str:
    if instance.startswith("["):  # [2001:db8::1]:9478
        return instance[1:].partition("]")[0]
    if instance.count(":") > 1:  # a bare IPv6 address
        return instance
    match = _PORT.match(instance)
    return match.group("name") if match else instance


def choose_host(labels: dict[str, str], hosts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    entries = list(hosts)
    by_id = {str(entry.get("host")): entry for entry in entries}
    for label in HOST_LABELS:
        value = labels.get(label)
        if value:
            if value in by_id:
                return by_id[value]
            raise AlertRefused(f"its {label} label {value!r} names no registered host.")
    instance = labels.get("instance")
    if not instance:
        raise AlertRefused("it has no host, netsleuth_host or instance label to find its host by.")
    name = _instance_name(instance)
    if name in by_id:
        return by_id[name]
    short = name.split(".")[0]
    matches = [
        entry
        for entry in entries
        if str(entry.get("hostname") or "") in (name, short)
        or str(entry.get("hostname") or "").split(".")[0] == short
    ]
    if len(matches) == 1:
        return matches[0]
    if matches:
        ids = ", ".join(sorted(str(entry.get("host")) for entry in matches))
        raise AlertRefused(
            f"its instance {instance!r} matches the hostname of several hosts ({ids}); give the scrape "
            "target a host label naming one."
        )
    raise AlertRefused(f"its instance {instance!r} matches no registered host id or hostname.")


def _namespaces(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in entry.get("namespaces") or [] if isinstance(item, dict)]


def _named_netns(labels: dict[str, str], entry: dict[str, Any]) -> str | None:
    """The namespace the labels name on this host: its name, or None for the host's own."""
    host = entry.get("host")
    namespaces = _namespaces(entry)
    name = labels.get("netns_name")
    if name:
        if name == _OWN_NETNS:
            return None
        if any(item.get("name") == name for item in namespaces):
            return name
        raise AlertRefused(f"netns {name!r} is not a namespace host {host} reported.")
    inode = labels.get("netns")
    if inode:
        if inode == "other":
            raise AlertRefused(
                'it sums namespaces past the exporter\'s series limit (netns="other"), so it names no '
                "one namespace; raise exporter.drops.netns_series or give the rule another scope."
            )
        for item in namespaces:
            if str(item.get("inode")) == inode and item.get("name"):
                return str(item["name"])
        raise AlertRefused(f"netns inode {inode} is not a named namespace host {host} reported.")
    container = labels.get("container_id")
    if container:
        for item in entry.get("containers") or []:
            ident = str(item.get("id") or "") if isinstance(item, dict) else ""
            if ident and (ident.startswith(container) or container.startswith(ident)) and item.get("netns"):
                return str(item["netns"])
        raise AlertRefused(f"container {container!r} is not a container host {host} reported.")
    raise AlertRefused(
        "its rule asks for a namespace scope, but it has no netns_name, netns or container_id label."
    )


def choose_netns(scope: Scope | None, labels: dict[str, str], entry: dict[str, Any]) -> str | None:
    """The session's `netns`: a name, HOST_WIDE, or None for the host's own namespace."""
    if scope == "host":
        return None
    if scope == HOST_WIDE:
        return HOST_WIDE
    if scope in ("pod", "k8s_namespace"):
        raise AlertRefused(
            f"its rule asks for a {scope} scope, which needs pod names in the host registry; "
            "this controller's registry has network namespaces and containers only."
        )
    if scope is None and not any(labels.get(key) for key in ("netns_name", "netns", "container_id")):
        return None
    return _named_netns(labels, entry)
