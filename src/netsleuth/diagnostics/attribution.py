"""Which process an event belongs to, for events about a socket (resets, retransmits, state changes).

Socket events mostly happen in softirq or on a timer, where the running task is whoever was interrupted, so
the order is:
1. the kernel ran the hook in a task's own syscall *and* the caller says that syscall acts on the socket
   (close() sending an abortive RST, connect()): that task;
2. a process the state tracker saw acting on this very socket in its own syscall (connect, listen, close);
3. the process holding the socket's inode in /proc/PID/fd;
4. nobody: "kernel".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from netsleuth.diagnostics.drops_enrich import Owner
from netsleuth.kernel.process import SocketOwners, container_of

__all__ = ["OwnerFacts", "attribute_owner"]


@dataclass(frozen=True)
class OwnerFacts:
    """What the kernel event says about ownership (see tcp.h tcp_event)."""

    task_pid: int | None  # the current task, when the hook ran in its syscall for this socket
    task_comm: str
    tracked_pid: int  # 0: none seen
    tracked_comm: str
    sock_ino: int


def attribute_owner(
    facts: OwnerFacts, owners: SocketOwners, container: Callable[[int], str | None] = container_of
) -> Owner:
    """`container` maps a pid to its container id; callers on hot paths pass a cached one."""
    if facts.task_pid:
        return Owner(facts.task_pid, facts.task_comm, "task", container(facts.task_pid))
    if facts.tracked_pid:
        return Owner(facts.tracked_pid, facts.tracked_comm, "socket", container(facts.tracked_pid))
    if facts.sock_ino:
        found = owners.owner(facts.sock_ino)
        if found is not None:
            return Owner(found.pid, found.comm, "socket", container(found.pid))
    return Owner(None, "kernel", "kernel")
