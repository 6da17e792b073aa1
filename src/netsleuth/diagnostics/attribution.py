"""Which process an event belongs to: the one set of rules for drops, resets, tcp events and connections.

Packet and socket events mostly happen in softirq or on a timer, where the running task is whoever was
interrupted, so that task is never reported unless the kernel ran the hook in its own syscall. In order:
1. the hook ran in a user task's own context (the BPF program checks it runs on that task's stack, not an
   IRQ stack) *and* that task acts on the packet or socket (a drop in its sendmsg; close() sending an
   abortive RST, connect()): that task;
2. a process the tcp state tracker saw acting on this very socket in its own syscall (connect, listen,
   close);
3. the process holding the socket's inode in /proc/PID/fd;
4. nobody: "kernel" (softirq, a kernel thread, or a packet no process owns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from netsleuth.diagnostics.drops.decode import RawDrop
    from netsleuth.diagnostics.tcp.program import RawTcpEvent
    from netsleuth.kernel.process import SocketOwners

__all__ = [
    "Owner",
    "OwnerFacts",
    "attribute_owner",
    "drop_owner_facts",
    "owner_json",
    "owner_text",
    "tcp_owner_facts",
]


@dataclass(frozen=True)
class Owner:
    pid: int | None
    comm: str
    source: str  # "task" | "socket" | "kernel"
    container: str | None = None
    container_name: str | None = None  # the runtime's name for it (CRI), when a runtime on this host knows it


@dataclass(frozen=True)
class OwnerFacts:
    """What the kernel event says about ownership (see drops.h drop_event, tcp.h tcp_event)."""

    task_pid: int | None  # the current task, when the hook ran in its syscall for this packet or socket
    task_comm: str
    tracked_pid: int  # 0: none seen
    tracked_comm: str
    sock_ino: int


def drop_owner_facts(raw: RawDrop) -> OwnerFacts:
    """A drop in a user task's own context is that task's (its sendmsg, its socket's receive path)."""
    task = raw.in_task and not raw.kthread and raw.pid
    return OwnerFacts(raw.pid if task else None, raw.comm, 0, "", raw.sock_ino)


def tcp_owner_facts(raw: RawTcpEvent, task_acts_on_socket: bool = False) -> OwnerFacts:
    """`task_acts_on_socket`: the caller knows the hook runs in a syscall on this socket (close, connect)."""
    task = task_acts_on_socket and raw.in_task and not raw.kthread and raw.pid
    return OwnerFacts(raw.pid if task else None, raw.comm, raw.owner_pid, raw.owner_comm, raw.sock_ino)


def attribute_owner(
    facts: OwnerFacts, owners: SocketOwners, container: Callable[[int], str | None] | None = None
) -> Owner:
    """`container` maps a pid to its container id (kernel.process.container_of unless given); callers on hot
    paths pass a cached one. kernel.process is imported only here, when an event is attributed: a
    diagnostic's records (Owner, owner_json) are imported by every spec lookup, the agent's start among
    them, which must not pay for the /proc scanner."""
    if container is None:
        from netsleuth.kernel.process import container_of

        container = container_of
    if facts.task_pid:
        return Owner(facts.task_pid, facts.task_comm, "task", container(facts.task_pid))
    if facts.tracked_pid:
        return Owner(facts.tracked_pid, facts.tracked_comm, "socket", container(facts.tracked_pid))
    if facts.sock_ino:
        found = owners.owner(facts.sock_ino)
        if found is not None:
            return Owner(found.pid, found.comm, "socket", container(found.pid))
    return Owner(None, "kernel", "kernel")


def owner_text(owner: Owner) -> str:
    if owner.pid is None:
        return "the kernel"
    text = f"{owner.comm}[{owner.pid}]"
    if owner.container_name:
        text += f" (container {owner.container_name} {owner.container})"
    elif owner.container:
        text += f" (container {owner.container})"
    return text


def owner_json(owner: Owner) -> dict[str, object]:
    data: dict[str, object] = {
        "pid": owner.pid,
        "comm": owner.comm,
        "owner": owner.source,
        "container": owner.container,
    }
    if owner.container_name:
        data["container_name"] = owner.container_name
    return data
