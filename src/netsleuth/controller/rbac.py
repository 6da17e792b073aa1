"""What a principal may do: roles → diagnostics × host selectors × where (network namespaces, or Kubernetes
namespaces' pods), deny by default.

A request is allowed only when ONE role grants all three for every chosen host (two roles do not combine
into a permission neither grants). A session without `netns` watches the host's own namespace, which a role
grants with the name `host` or `*`. A session that chooses pods (`k8s_namespace`, or a `pod` NAMESPACE/NAME)
needs a role whose `k8s_namespaces` matches that namespace (or whose `netns` is `*`: every namespace). What
is granted becomes the task's scope, which the agent enforces in the kernel as well: the controller's check
is not the only line of defence.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from netsleuth.controller.auth import Principal
from netsleuth.controller.config import ControllerConfig, RoleConfig

__all__ = ["HOST_NETNS", "Denied", "Limits", "Rbac"]

HOST_NETNS = "host"  # the name a role uses for "the host's own network namespace"


class Denied(Exception):
    """403, with the sentence the user and the audit record get."""


@dataclass(frozen=True)
class Limits:
    max_concurrent: int
    max_duration: float
    max_hosts: int


def host_matches(selector: str, host: dict[str, Any]) -> bool:
    if selector.startswith("label:"):
        key, _, value = selector[len("label:") :].partition("=")
        labels = host.get("labels") or {}
        return isinstance(labels, dict) and str(labels.get(key)) == value
    return fnmatch.fnmatchcase(str(host.get("host", "")), selector)


def _netns_matches(patterns: tuple[str, ...], netns: str) -> bool:
    return any(pattern == "*" or fnmatch.fnmatchcase(netns, pattern) for pattern in patterns)


class Rbac:
    def __init__(self, config: ControllerConfig) -> None:
        self._roles = config.roles

    def roles(self, principal: Principal) -> list[RoleConfig]:
        return [self._roles[name] for name in principal.roles if name in self._roles]

    def is_admin(self, principal: Principal) -> bool:
        return any(role.admin for role in self.roles(principal))

    def limits(self, principal: Principal) -> Limits:
        roles = self.roles(principal)
        if not roles:
            return Limits(max_concurrent=0, max_duration=0.0, max_hosts=0)
        return Limits(
            max_concurrent=max(role.max_concurrent for role in roles),
            max_duration=max(role.max_duration for role in roles),
            max_hosts=max(role.max_hosts for role in roles),
        )

    def allowed(self, principal: Principal) -> dict[str, list[str]]:
        roles = self.roles(principal)
        return {
            "diagnostics": sorted({d for role in roles for d in role.diagnostics}),
            "hosts": sorted({h for role in roles for h in role.hosts}),
            "netns": sorted({n for role in roles for n in role.netns}),
            "k8s_namespaces": sorted({n for role in roles for n in role.k8s_namespaces}),
        }

    def may_see(self, principal: Principal, host: dict[str, Any]) -> bool:
        return any(host_matches(selector, host) for role in self.roles(principal) for selector in role.hosts)

    def check_session(
        self,
        principal: Principal,
        diagnostic: str,
        hosts: list[dict[str, Any]],
        netns: str | None,
        k8s_namespace: str | None = None,
    ) -> None:
        """Raises Denied with the first reason; the most specific sentence wins (diagnostic, host, where)."""
        roles = self.roles(principal)
        if not roles:
            raise Denied(f"user {principal.user} has no role, so may run nothing.")
        with_diagnostic = [
            role for role in roles if diagnostic in role.diagnostics or "*" in role.diagnostics
        ]
        if not with_diagnostic:
            names = ", ".join(role.name for role in roles)
            raise Denied(f"your roles ({names}) do not allow diagnostic {diagnostic}.")
        wanted_netns = netns or HOST_NETNS
        for host in hosts:
            host_id = host.get("host")
            for_host = [role for role in with_diagnostic if any(host_matches(s, host) for s in role.hosts)]
            if not for_host:
                raise Denied(f"your roles do not allow diagnostic {diagnostic} on host {host_id}.")
            if k8s_namespace is not None:
                if not any(
                    "*" in role.netns or _netns_matches(role.k8s_namespaces, k8s_namespace)
                    for role in for_host
                ):
                    raise Denied(
                        f"your roles do not allow Kubernetes namespace {k8s_namespace} on host {host_id}."
                    )
                continue
            if not any(_netns_matches(role.netns, wanted_netns) for role in for_host):
                pods = sorted({n for role in for_host for n in role.k8s_namespaces})
                hint = f"; they allow the pods of Kubernetes namespace {', '.join(pods)}" if pods else ""
                raise Denied(
                    f"your roles do not allow network namespace {wanted_netns} on host {host_id}"
                    + ("" if netns else " (no --netns means the host's own namespace)")
                    + hint
                    + "."
                )

    def is_owner_or_admin(self, principal: Principal, owner: str) -> bool:
        return principal.user == owner or self.is_admin(principal)
