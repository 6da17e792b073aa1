"""Run one function inside a named network namespace, in a forked child, and bring its result back.

/proc/net follows the calling process's namespace, but /sys/class/net follows the namespace of whoever
mounted sysfs, and ethtool ioctls and netlink sockets bind to the namespace they were created in. So the
child does what `ip netns exec` does (iproute2 lib/namespace.c netns_switch): setns(CLONE_NEWNET),
unshare(CLONE_NEWNS), make mounts private, remount /sys. The parent's namespaces never change.
"""

from __future__ import annotations

import ctypes
import os
import pickle
from collections.abc import Callable
from typing import TypeVar

from netsleuth.errors import EnvironmentProblem, UsageError

__all__ = ["netns_path", "run_in_netns"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_REC = 0x4000
_MS_SLAVE = 1 << 19
_MNT_DETACH = 2

T = TypeVar("T")


def netns_path(netns: str) -> str:
    path = netns if netns.startswith("/") else f"/run/netns/{netns}"
    if not os.path.exists(path):
        raise UsageError(f"no network namespace named {netns!r} (expected {path})")
    return path


def _enter(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise EnvironmentProblem(
                f"cannot enter network namespace {path}: {os.strerror(ctypes.get_errno())}"
            )
    finally:
        os.close(fd)
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise EnvironmentProblem(f"cannot unshare the mount namespace: {os.strerror(ctypes.get_errno())}")
    # Keep our /sys remount out of the parent's mount namespace.
    libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None)
    libc.umount2(b"/sys", _MNT_DETACH)
    if libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None) != 0:
        raise EnvironmentProblem(f"cannot mount sysfs for {path}: {os.strerror(ctypes.get_errno())}")


def run_in_netns(netns: str | None, function: Callable[[], T]) -> T:
    """`function()` in `netns` (a name under /run/netns or a path); in this process when netns is None."""
    if netns is None:
        return function()
    path = netns_path(netns)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        os.close(read_fd)
        try:
            _enter(path)
            payload = pickle.dumps((True, function()))
        except BaseException as error:  # the parent re-raises it
            try:
                payload = pickle.dumps((False, error))
            except Exception:
                payload = pickle.dumps((False, RuntimeError(str(error))))
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(payload)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    if not data:
        raise EnvironmentProblem(f"the helper process in namespace {netns} died without an answer")
    ok, value = pickle.loads(data)
    if not ok:
        raise value
    result: T = value
    return result
