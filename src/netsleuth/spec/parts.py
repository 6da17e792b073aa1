"""Nested record parts several diagnostics' records share, declared once (docs/records.md names them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from netsleuth.spec.scope import K8sNamespaceField

if TYPE_CHECKING:
    from netsleuth.kernel.pods import Pod

__all__ = ["PodRef", "pod_ref"]


class PodRef(msgspec.Struct, frozen=True, kw_only=True):
    """The Kubernetes pod whose sandbox holds the record's network namespace (from the container runtime's
    CRI API, netsleuth.kernel.pods); a record leaves the key out where the namespace is no pod's."""

    namespace: K8sNamespaceField  # a Kubernetes namespace scope reads it (spec.scope.RecordScope)
    name: str
    uid: str


def pod_ref(pod: Pod | None) -> PodRef | msgspec.UnsetType:
    """A record's `pod` field: the pod's part, or UNSET (no key) when the namespace is no pod's."""
    if pod is None:
        return msgspec.UNSET
    return PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid)
