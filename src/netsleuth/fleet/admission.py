"""Whether this agent runs a task, decided before anything touches the kernel.

In order, each refusal one sentence the controller records in its audit: the message parses; the Ed25519
signature is the configured controller key's over the task exactly as received; the task is for this host
and for this run of the agent process; it is not expired, not issued in the future, not longer-lived than
`fleet.max_task_lifetime`, and its id was not seen before (ids are remembered until their expiry, which is
what bounds the memory); the diagnostic
is in this agent's catalogue; the scope can be enforced in the kernel and stays within this host, and the
diagnostic can be kept inside it. The accepted task comes back with its effective config: the scope pushed
into the diagnostic's own filters (netns forced to the host's namespace, addresses narrowed), the scope as
enforced (for the session's last-line filter, scope_filter.py), budgets capped by the agent's [sessions]
limits.

Scopes: `netns: []` is this host's own namespace (the agent's, or its `fleet.netns`); `netns: [name]` that
namespace; `netns: ["*"]` every namespace of the host - *host-wide*, the only scope under which a
diagnostic whose records cannot say their namespace (softirq's per-CPU histograms, profile's stacks) may
run. A role grants it with `netns = ["*"]` and a user asks for it with `--netns '*'`.

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
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from netsleuth.agent.config import SessionLimits
from netsleuth.errors import UsageError
from netsleuth.fleet.protocol import Budgets, ProtocolError, SignedTask, Task, decode
from netsleuth.fleet.scope_filter import EnforcedScope

__all__ = ["HOST_WIDE", "AcceptedTask", "ReplayGuard", "TaskAdmission", "TaskRefused", "host_wide_only"]

HOST_NETNS = "/proc/self/ns/net"  # the agent runs in the host's own namespace
HOST_WIDE = "*"  # scope.netns ["*"]: every namespace of this host
_CLOCK_SKEW_S = 30.0  # a task issued this far in our future is refused: our clock or theirs is wrong
_MAX_REMEMBERED = 100_000


def host_wide_only(diagnostic: str) -> str | None:
    """Why `diagnostic` can run only host-wide - its records carry no namespace or address, so neither the
    kernel nor the last-line filter could keep them inside a narrower scope - in the refusal's words, as its
    spec says (ScopeTraits.host_wide_only); None when it can be kept inside one."""
    from netsleuth.diagnostics.registry import get_diagnostic

    try:
        spec = get_diagnostic(diagnostic)
    except UsageError:
        return None
    why: str | None = getattr(getattr(spec, "scope", None), "host_wide_only", None)
    return why


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
    config: dict[str, Any]  # the diagnostic's config with the scope pushed in
    budgets: Budgets  # the task's budgets capped by the agent's own limits
    deadline_s: float
    scope: EnforcedScope  # what the session's last-line filter lets leave the host


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


def _network(text: str, where: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise TaskRefused(f"{where} {text!r} is not an address or CIDR") from None


def _within(
    inner: ipaddress.IPv4Network | ipaddress.IPv6Network,
    outer: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> bool:
    return inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]


class TaskAdmission:
    def __init__(
        self,
        host_id: str,
        controller_key: Ed25519PublicKey,
        catalogue: Callable[[], Collection[str]],
        limits: SessionLimits,
        host_netns: str,
        known_netns: Callable[[str], bool],
        run_id: str,
        max_task_lifetime: float = 300.0,
        clock: Callable[[], float] = time.time,
        validate_config: Callable[[str, dict[str, Any]], object] | None = None,
    ) -> None:
        self.host_id = host_id
        self.run_id = run_id
        self._key = controller_key
        self._catalogue = catalogue
        self._limits = limits
        self._host_netns = host_netns
        self._known_netns = known_netns
        self._max_lifetime = max_task_lifetime
        self._clock = clock
        self._validate = validate_config
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
        config, scope = self._scoped_config(task)
        if self._validate is not None:
            # The diagnostic's own validation of its config (the CLI's flags, as JSON): a bad filter is a
            # refusal now, not an accepted task that fails in prepare.
            try:
                self._validate(task.diagnostic, config)
            except UsageError as error:
                raise TaskRefused(f"invalid config for {task.diagnostic}: {error}", task) from None
        budgets = Budgets(
            max_events=min(task.budgets.max_events, self._limits.max_events),
            max_bytes=min(task.budgets.max_bytes, self._limits.max_bytes),
            cpu_percent=min(task.budgets.cpu_percent, self._limits.cpu_budget_percent),
        )
        return AcceptedTask(task, config, budgets, task.deadline_s, scope)

    def _scoped_config(self, task: Task) -> tuple[dict[str, Any], EnforcedScope]:
        """The diagnostic's config with the scope enforced by its kernel-side filters, and the scope as the
        last-line filter holds it."""
        scope = task.scope
        config = dict(task.config)
        if HOST_WIDE in scope.netns:
            return self._host_wide_config(task, config)
        why = host_wide_only(task.diagnostic)
        if why is not None:
            raise TaskRefused(
                f"{task.diagnostic} cannot be kept inside a namespace scope ({why}): it needs a host-wide "
                f"scope (netns '{HOST_WIDE}')",
                task,
            )
        if scope.cgroups:
            # The programs filter by netns, addresses, ports and pid; a cgroup filter is not in the kernel
            # side, and a scope the kernel does not enforce would be a promise this agent cannot keep.
            raise TaskRefused("a cgroup scope cannot be enforced in the kernel by this agent", task)
        asked = config.get("netns")
        if asked is not None and not isinstance(asked, str):
            raise TaskRefused("config.netns must be a namespace name", task)
        if self._host_netns:
            # This agent's world is one namespace: every task is pinned to it and nothing else is allowed.
            named = [*scope.netns, *([asked] if asked else [])]
            outside = [name for name in named if name != self._host_netns]
            if outside:
                raise TaskRefused(
                    f"netns {outside[0]!r} is outside this host (its namespace is {self._host_netns!r})", task
                )
            config["netns"] = self._host_netns
        else:
            if len(scope.netns) > 1:
                raise TaskRefused("the kernel filter takes one network namespace per task", task)
            if scope.netns:
                (allowed,) = scope.netns
                if asked and asked != allowed:
                    raise TaskRefused(f"config.netns {asked!r} is outside the task's scope {allowed!r}", task)
                config["netns"] = allowed
            elif asked is not None:
                raise TaskRefused(
                    f"config.netns {asked!r} is outside the task's scope (this host's own namespace)", task
                )
            else:
                # No namespace named: "this host's own namespace" (FLEET-CONTRACT.md), the agent's own - the
                # kernel filter confines it there rather than tracing every container on the host.
                config["netns"] = HOST_NETNS
            target = config.get("netns")
            if isinstance(target, str) and target != HOST_NETNS and not self._known_netns(target):
                raise TaskRefused(f"network namespace {target!r} does not exist on this host", task)
        if scope.addresses:
            from netsleuth.diagnostics.registry import get_diagnostic

            if "host" not in get_diagnostic(task.diagnostic).keys:
                # snoop's processes carry no address: nothing in the kernel or after it could narrow them.
                raise TaskRefused(
                    f"{task.diagnostic} has no address filter, so an address scope cannot be enforced", task
                )
            allowed_networks = [_network(text, "scope address") for text in scope.addresses]
            hosts = config.get("host") or []
            if not isinstance(hosts, list) or not all(isinstance(item, str) for item in hosts):
                raise TaskRefused("config.host must be a list of addresses", task)
            for text in hosts:
                network = _network(text, "config.host")
                if not any(_within(network, outer) for outer in allowed_networks):
                    raise TaskRefused(f"config.host {text!r} is outside the task's address scope", task)
            # No address filter asked: the scope itself becomes the filter ("either address" in the kernel).
            config["host"] = hosts or [str(network) for network in allowed_networks]
        netns = config.get("netns")
        networks = tuple(_network(text, "scope address") for text in scope.addresses)
        return config, EnforcedScope(False, netns if isinstance(netns, str) else HOST_NETNS, networks)

    def _host_wide_config(self, task: Task, config: dict[str, Any]) -> tuple[dict[str, Any], EnforcedScope]:
        """Every namespace of this host: what an operator's role grants with netns '*'. The diagnostic's own
        netns/address filters are the user's (still checked by the diagnostic); nothing is withheld."""
        scope = task.scope
        if self._host_netns:
            raise TaskRefused(
                f"a host-wide scope is outside this host (its namespace is {self._host_netns!r})", task
            )
        if len(scope.netns) > 1 or scope.addresses or scope.cgroups:
            raise TaskRefused(f"a host-wide scope (netns '{HOST_WIDE}') cannot be combined with others", task)
        asked = config.get("netns")
        if asked == HOST_WIDE:
            del config["netns"]  # "*" as the user's netns filter: no filter
        elif asked is not None and (not isinstance(asked, str) or not self._known_netns(asked)):
            raise TaskRefused(f"network namespace {asked!r} does not exist on this host", task)
        return config, EnforcedScope(True, None)
