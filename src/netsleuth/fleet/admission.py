"""Whether this agent runs a task, decided before anything touches the kernel.

In order, each refusal one sentence the controller records in its audit: the message parses; the Ed25519
signature is the configured controller key's over the task exactly as received; the task is for this host
and for this run of the agent process; it is not expired, not issued in the future, not longer-lived than
`fleet.max_task_lifetime`, and its id was not seen before (ids are remembered until their expiry, which is
what bounds the memory); the diagnostic is in this agent's catalogue; the scope resolves on this host, can be
enforced in the kernel and stays within this host, and the diagnostic can be kept inside it; its config is
valid. The accepted task comes back with its effective config - the diagnostic's typed config with the scope
pushed into the fields its `ScopeTraits` name (netsleuth.spec.scope: the namespace as the inode resolved
here, the addresses narrowed, a Kubernetes namespace's pods) and its own narrowing hook for what reaches
further - the scope as one typed value (`spec.scope.Scope`, which the session's last-line filter holds,
scope_filter.py), and budgets capped by the agent's [sessions] limits.

Scopes: `netns: []` is this host's own namespace (the agent's, or its `fleet.netns`); `netns: [name]` that
namespace; `netns: ["*"]` every namespace of the host - *host-wide*, the only scope under which a
diagnostic whose records cannot say their namespace (softirq's per-CPU histograms, profile's stacks) may
run; `k8s_namespaces: [ns]` the pods of that Kubernetes namespace on this host (resolved here, at task time,
through the container runtime). A role grants host-wide with `netns = ["*"]` and a user asks for it with
`--netns '*'`.

A NATS user who may publish on this host's task subject still cannot make it run anything the controller did
not sign; the signature, not the transport, is what is trusted.

Replays across restarts: the seen ids live in this process only, so a task captured off the wire could run
again once the agent restarted (upgrade, crash, OOM) while it is still unexpired. Each run of the agent has
its own random run id, published in its registry entry; the controller signs the run id of the host's
current entry into each task, and a task for any other run is refused. No clock is compared (the
controller's and the agent's may differ by more than a restart takes) and nothing needs to survive on disk
(a reinstalled host or a fresh container has no old file to trust, and an entry in NATS could be rewritten
by whoever holds the controller's login); docs/fleet.md says why in full.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from netsleuth.agent.config import SessionLimits
from netsleuth.errors import NetsleuthError, UsageError
from netsleuth.fleet.host_namespaces import NamespaceLookup
from netsleuth.fleet.protocol import Budgets, ProtocolError, SignedTask, Task, decode
from netsleuth.spec.configs import Config, ConfigError
from netsleuth.spec.options import IpNetwork
from netsleuth.spec.scope import Scope, ScopeTraits

__all__ = ["HOST_WIDE", "AcceptedTask", "ReplayGuard", "TaskAdmission", "TaskRefused", "narrow_config"]

HOST_WIDE = "*"  # scope.netns ["*"]: every namespace of this host
_CLOCK_SKEW_S = 30.0  # a task issued this far in our future is refused: our clock or theirs is wrong
_MAX_REMEMBERED = 100_000


class TaskRefused(Exception):
    """The task will not run; str() is the reason sent back and audited. `task` is set once it parsed;
    `signed` once its signature verified (before that, its fields are anyone's claims)."""

    def __init__(self, reason: str, task: Task | None = None, signed: bool = True) -> None:
        super().__init__(reason)
        self.task = task
        self.signed = signed and task is not None


@dataclass(frozen=True)
class AcceptedTask:
    task: Task
    # The diagnostic's typed config with the scope pushed in.
    config: Any
    budgets: Budgets  # the task's budgets capped by the agent's own limits
    deadline_s: float
    scope: Scope  # what the session's last-line filter lets leave the host
    namespace_files: tuple[str, ...] = ()  # files that enter the scope's namespaces (its conntrack tables)

    @property
    def config_json(self) -> dict[str, Any]:
        """The effective config as JSON (what conntrack's entries are matched against)."""
        built: dict[str, Any] = msgspec.to_builtins(self.config, enc_hook=str)
        return built


class ReplayGuard:
    """Task ids seen, each kept until its task's expiry (after which it is refused as expired anyway)."""

    def __init__(self, clock: Callable[[], float] = time.time, capacity: int = _MAX_REMEMBERED) -> None:
        self._clock = clock
        self._capacity = capacity
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def remember(self, task_id: str, expires_at: float) -> bool:
        """False when the id was seen already (a replay)."""
        now = self._clock()
        with self._lock:
            if task_id in self._seen:
                return False
            if len(self._seen) >= self._capacity:
                for known, expiry in list(self._seen.items()):
                    if expiry < now:
                        del self._seen[known]
            if len(self._seen) >= self._capacity:
                raise TaskRefused(f"this agent already holds {self._capacity} unexpired task ids")
            self._seen[task_id] = expires_at
            return True

    def __len__(self) -> int:
        return len(self._seen)


def _network(text: str, where: str) -> IpNetwork:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise UsageError(f"{where} {text!r} is not an address or CIDR") from None


def within(inner: IpNetwork, outer: IpNetwork) -> bool:
    return inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]


class TaskAdmission:
    def __init__(
        self,
        host_id: str,
        controller_key: Ed25519PublicKey,
        catalogue: Callable[[], Collection[str]],
        limits: SessionLimits,
        host_netns: str,
        namespaces: NamespaceLookup,
        run_id: str,
        max_task_lifetime: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`namespaces` resolves what a scope names on this host (fleet/host_namespaces.py)."""
        self.host_id = host_id
        self.run_id = run_id
        self._key = controller_key
        self._catalogue = catalogue
        self._limits = limits
        self._host_netns = host_netns
        self._namespaces = namespaces
        self._max_lifetime = max_task_lifetime
        self._clock = clock
        self.replays = ReplayGuard(clock)

    def admit(self, data: bytes) -> AcceptedTask:
        """The task to run, or TaskRefused with the reason."""
        try:
            signed = SignedTask.from_json(decode(data, "task"))
        except ProtocolError as error:
            raise TaskRefused(f"malformed task: {error}") from None
        task = signed.task
        try:
            signed.verify(self._key)
        except ProtocolError as error:
            raise TaskRefused(str(error), task, signed=False) from None
        # From here on the task is the controller's own: its fields can be trusted as its intent.
        if task.host != self.host_id:
            raise TaskRefused(f"the task is for host {task.host!r}, this agent is {self.host_id!r}", task)
        if task.run_id != self.run_id:
            raise TaskRefused(
                f"task {task.id} is for an earlier run of this agent (run {task.run_id or 'none'}; this run "
                f"is {self.run_id}, since the agent restarted): a replay, or a controller that has not yet "
                "read this run's registry entry",
                task,
            )
        now = self._clock()
        if task.expires_at <= now:
            raise TaskRefused(f"the task expired {now - task.expires_at:.1f} s ago", task)
        if task.issued_at > now + _CLOCK_SKEW_S:
            raise TaskRefused(f"the task is issued {task.issued_at - now:.0f} s in this agent's future", task)
        if task.expires_at - task.issued_at > self._max_lifetime:
            raise TaskRefused(
                f"the task lives {task.expires_at - task.issued_at:.0f} s, over this agent's maximum of "
                f"{self._max_lifetime:g} s",
                task,
            )
        try:
            fresh = self.replays.remember(task.id, task.expires_at)
        except TaskRefused as refused:
            raise TaskRefused(str(refused), task) from None
        if not fresh:
            raise TaskRefused(f"task {task.id} was already received: a replay", task)
        catalogue = self._catalogue()
        if task.diagnostic not in catalogue:
            names = ", ".join(sorted(catalogue))
            raise TaskRefused(f"unknown diagnostic {task.diagnostic!r}: this agent runs {names}", task)
        if not self._limits.enabled:
            raise TaskRefused("sessions are disabled in this agent's config", task)
        if task.deadline_s > self._limits.max_duration:
            raise TaskRefused(
                f"the task asks for {task.deadline_s:g} s, over this agent's sessions.max_duration of "
                f"{self._limits.max_duration:g} s",
                task,
            )
        try:
            scope = self._resolve_scope(task)
            config = self._scoped_config(task, scope)
        except TaskRefused:
            raise
        except ConfigError as error:
            raise TaskRefused(f"invalid config for {task.diagnostic}: {error}", task) from None
        except NetsleuthError as error:  # a scope or filter naming what this host does not have
            raise TaskRefused(str(error), task) from None
        budgets = Budgets(
            max_events=min(task.budgets.max_events, self._limits.max_events),
            max_bytes=min(task.budgets.max_bytes, self._limits.max_bytes),
            cpu_percent=min(task.budgets.cpu_percent, self._limits.cpu_budget_percent),
        )
        files = tuple(self._namespaces.file_of(netns) for netns in scope.namespaces)
        return AcceptedTask(task, config, budgets, task.deadline_s, scope, files)

    def _resolve_scope(self, task: Task) -> Scope:
        """The task's scope as this host's namespaces, resolved once: what the kernel filter and the last
        line are given."""
        asked = task.scope
        if asked.cgroups:
            # The programs filter by netns, addresses, ports and pid; a cgroup filter is not in the kernel
            # side, and a scope the kernel does not enforce would be a promise this agent cannot keep.
            raise TaskRefused("a cgroup scope cannot be enforced in the kernel by this agent", task)
        networks = tuple(_network(text, "scope address") for text in asked.addresses)
        if HOST_WIDE in asked.netns:
            if self._host_netns:
                raise TaskRefused(
                    f"a host-wide scope is outside this host (its namespace is {self._host_netns!r})", task
                )
            if len(asked.netns) > 1 or networks or asked.k8s_namespaces:
                raise TaskRefused(
                    f"a host-wide scope (netns '{HOST_WIDE}') cannot be combined with others", task
                )
            return Scope(True)
        if asked.k8s_namespaces:
            if asked.netns:
                raise TaskRefused(
                    "a scope names network namespaces or a Kubernetes namespace, not both", task
                )
            if len(asked.k8s_namespaces) > 1:
                raise TaskRefused("the kernel filter takes one Kubernetes namespace's pods per task", task)
            if self._host_netns:
                raise TaskRefused(
                    f"a Kubernetes namespace scope is outside this host (its namespace is "
                    f"{self._host_netns!r})",
                    task,
                )
            (k8s_namespace,) = asked.k8s_namespaces
            pods = self._namespaces.k8s_namespace(k8s_namespace)
            return Scope(False, networks=networks, k8s_namespace=k8s_namespace, pod_netns=pods)
        if self._host_netns:
            # This agent's world is one namespace: every task is pinned to it and nothing else is allowed.
            chosen = task.config.get("netns")
            outside = [
                name for name in (*asked.netns, chosen) if name is not None and name != self._host_netns
            ]
            outside += [str(task.config[key]) for key in ("pod", "k8s_namespace") if task.config.get(key)]
            if outside:
                raise TaskRefused(
                    f"netns {outside[0]!r} is outside this host (its namespace is {self._host_netns!r})", task
                )
            return Scope(False, self._namespaces.netns(self._host_netns), networks)
        if len(asked.netns) > 1:
            raise TaskRefused("the kernel filter takes one network namespace per task", task)
        if asked.netns:
            (name,) = asked.netns
            try:
                return Scope(False, self._namespaces.netns(name), networks)
            except UsageError:
                raise TaskRefused(f"network namespace {name!r} does not exist on this host", task) from None
        # No namespace named: "this host's own namespace", the agent's own - the kernel filter confines it
        # there rather than tracing every container on the host.
        return Scope(False, self._namespaces.own(), networks)

    def _scoped_config(self, task: Task, scope: Scope) -> Any:
        """The diagnostic's config with the scope enforced by its kernel-side filters."""
        from netsleuth.diagnostics.registry import get_diagnostic

        spec = get_diagnostic(task.diagnostic)
        given = dict(task.config)
        if scope.host_wide and given.get("netns") == HOST_WIDE:
            # `"netns": "*"` is how a request asks for every namespace (the controller made the scope of
            # it); as a filter it is none.
            del given["netns"]
        config = spec.config_from_json(given)
        try:
            return narrow_config(config, scope, spec.scope, self._namespaces, task.diagnostic)
        except UsageError as error:
            raise TaskRefused(str(error), task) from None


C = TypeVar("C", bound=Config)


def narrow_config(
    config: C, scope: Scope, traits: ScopeTraits, namespaces: NamespaceLookup, diagnostic: str
) -> C:
    """`config` confined to `scope` on the fields `traits` name, then by its own hook: the namespace the
    kernel filters by is the scope's (as the inode resolved at admission), or the user's own choice when it
    is inside the scope (then also as its inode); an address scope becomes the "either address" filter, or
    must contain the user's. UsageError (one sentence) for a scope this diagnostic cannot be kept inside."""
    kind = type(config)
    netns_field = traits.field_of(kind, "netns")
    address_field = traits.field_of(kind, "address")
    k8s_field = traits.field_of(kind, "k8s_namespace")
    pod_field = "pod" if "pod" in kind.__struct_fields__ else None
    if scope.host_wide:
        # Every namespace is allowed; the user's own namespace filter stays theirs ("*": none), resolved
        # now so that a name this host lacks is a refusal, not a session that fails in prepare.
        own_filter = getattr(config, netns_field) if netns_field is not None else None
        if netns_field is None or own_filter is None:
            return config
        inode = namespaces.netns(str(own_filter)).inode
        return msgspec.structs.replace(config, **{netns_field: str(inode)})
    if traits.host_wide_only is not None:
        raise UsageError(
            f"{diagnostic} cannot be kept inside a namespace scope ({traits.host_wide_only}): it needs a "
            f"host-wide scope (netns '{HOST_WIDE}')"
        )
    if netns_field is None:
        raise UsageError(
            f"{diagnostic} has no network namespace filter, so it cannot be kept inside a namespace scope: "
            f"it needs a host-wide scope (netns '{HOST_WIDE}')"
        )
    changes: dict[str, Any] = {}
    inside = {netns.inode for netns in scope.namespaces}
    chosen = _chosen_namespaces(config, netns_field, pod_field, k8s_field, namespaces)
    if chosen is not None:
        field, named = chosen
        if not named <= inside:
            raise UsageError(
                f"config.{field} {getattr(config, field)!r} is outside the task's scope ({scope.describe()})"
            )
        if field == netns_field:
            (inode,) = named
            changes[netns_field] = str(inode)  # the namespace resolved now, not its name again at open
    elif scope.k8s_namespace is not None and k8s_field is not None:
        changes[k8s_field] = scope.k8s_namespace
    elif len(scope.namespaces) == 1:
        changes[netns_field] = str(scope.namespaces[0].inode)
    else:
        raise UsageError(
            f"{diagnostic}'s kernel filter takes one network namespace, and Kubernetes namespace "
            f"{scope.k8s_namespace}'s pods have {len(scope.namespaces)} here"
        )
    if scope.networks:
        if address_field is None:
            # snoop's processes carry no address: nothing in the kernel or after it could narrow them.
            raise UsageError(f"{diagnostic} has no address filter, so an address scope cannot be enforced")
        hosts: tuple[IpNetwork, ...] = getattr(config, address_field)
        for network in hosts:
            if not any(within(network, outer) for outer in scope.networks):
                raise UsageError(
                    f"config.{address_field} {str(network)!r} is outside the task's address scope"
                )
        if not hosts:
            # No address filter asked: the scope itself becomes the filter ("either address" in the kernel).
            changes[address_field] = scope.networks
    narrowed = msgspec.structs.replace(config, **changes)
    try:
        narrowed.check()  # the scope's addresses against -4/-6, say
    except ConfigError as error:
        where = f"config.{error.field} " if error.field else ""
        raise UsageError(f"{where}{error.problem} (with the task's scope, {scope.describe()})") from None
    if traits.narrow is not None:
        narrowed = traits.narrow(narrowed, scope)
    return narrowed


def _chosen_namespaces(
    config: Config,
    netns_field: str,
    pod_field: str | None,
    k8s_field: str | None,
    namespaces: NamespaceLookup,
) -> tuple[str, set[int]] | None:
    """The field the user chose a namespace with and the inodes it names here; None when they chose none."""
    netns = getattr(config, netns_field)
    if netns is not None:
        return netns_field, {namespaces.netns(str(netns)).inode}
    if pod_field is not None and getattr(config, pod_field) is not None:
        return pod_field, {namespaces.pod(str(getattr(config, pod_field))).inode}
    if k8s_field is not None and getattr(config, k8s_field) is not None:
        return k8s_field, {netns.inode for netns in namespaces.k8s_namespace(str(getattr(config, k8s_field)))}
    return None
