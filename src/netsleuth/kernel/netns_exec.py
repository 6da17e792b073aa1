"""Doing something inside another network namespace: the one place netsleuth enters one.

Only a child ever moves (setns(2) between fork and exec, or in a forked child); this process never changes
namespace, so nothing else in netsleuth is affected. Python 3.11 has no os.setns, hence ctypes.

- `run_in_netns(argv, path)`: run a read-only tool there (iptables-save, nft, cat) and return its stdout.
  The child makes one libc call before exec, so it is safe in the threaded agent.
- `read_file_in_netns(path, netns)`: a per-namespace file (/proc/self/net/...) as seen from inside.
- `call_in_netns(netns, function)`: run Python there in a forked child and bring the (pickled) result back.
  /proc/net follows the calling process's namespace, but /sys/class/net follows the namespace of whoever
  mounted sysfs, and ethtool ioctls and netlink sockets bind to the namespace they were created in. So the
  child does what `ip netns exec` does (iproute2 lib/namespace.c netns_switch): setns(CLONE_NEWNET),
  unshare(CLONE_NEWNS), make mounts private, remount /sys.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import shutil
import socket
import struct
import subprocess
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from netsleuth.errors import EnvironmentProblem, UsageError

__all__ = [
    "CommandFailed",
    "call_in_netns",
    "files_in_netns",
    "netns_file",
    "read_file_in_netns",
    "run_in_netns",
    "sockets_in_netns",
]

# include/uapi/linux/sched.h, include/uapi/linux/mount.h
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_REC = 0x4000
_MS_SLAVE = 1 << 19
_MNT_DETACH = 2
_DEFAULT_TIMEOUT = 10.0

T = TypeVar("T")


class CommandFailed(EnvironmentProblem):
    """The command ran but exited non-zero; readers that can do without its output catch this."""

    def __init__(self, message: str, returncode: int, stderr: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


def netns_file(netns: str) -> str:
    """An `ip netns` name or a namespace file (/proc/PID/ns/net, /run/netns/NAME) -> the file."""
    path = netns if netns.startswith("/") else f"/run/netns/{netns}"
    if not os.path.exists(path):
        raise UsageError(f"no network namespace named {netns!r} (expected {path})")
    return path


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.setns.restype = ctypes.c_int
    return libc


def _open_netns(netns_path: str) -> int:
    try:
        return os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"network namespace {netns_path} does not exist") from None
    except PermissionError:
        raise EnvironmentProblem(f"reading network namespace {netns_path} needs root") from None


def _is_current_netns(fd: int) -> bool:
    """Entering our own namespace is a no-op; skipping it also avoids needing CAP_SYS_ADMIN for it."""
    try:
        own = os.stat("/proc/self/ns/net")
    except OSError:
        return False
    target = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (target.st_dev, target.st_ino)


def _enter_before_exec(fd: int) -> Callable[[], None]:
    """The preexec_fn. subprocess documents preexec_fn as unsafe when other threads run (the child may
    inherit a lock some thread held at fork), so everything is looked up here, in the parent, and the
    child only makes one libc call: no imports, no logging, nothing that takes a Python-level lock."""
    setns = _libc().setns

    def enter() -> None:
        if setns(fd, _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return enter


def run_in_netns(argv: Sequence[str], netns_path: str | None, *, timeout: float = _DEFAULT_TIMEOUT) -> str:
    """Run `argv` in the network namespace at `netns_path` (None: this process's) and return its stdout.

    Raises EnvironmentProblem when the binary is missing, the namespace cannot be entered or the command
    times out, CommandFailed when it exits non-zero, UsageError when the namespace does not exist.
    """
    binary = shutil.which(argv[0])
    if binary is None:
        raise EnvironmentProblem(f"{argv[0]} is not installed (or not on PATH)")
    fd = _open_netns(netns_path) if netns_path is not None else None
    try:
        preexec = _enter_before_exec(fd) if fd is not None and not _is_current_netns(fd) else None
        result = subprocess.run(
            [binary, *argv[1:]],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            preexec_fn=preexec,
            # Tool output is parsed: keep it in the C locale whatever the user's settings.
            env={**os.environ, "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"{argv[0]} did not finish within {timeout:g} s") from None
    except subprocess.SubprocessError as error:
        # subprocess reports a failing preexec_fn only as "Exception occurred in preexec_fn."
        raise EnvironmentProblem(
            f"could not enter network namespace {netns_path} to run {argv[0]} (needs CAP_SYS_ADMIN)"
        ) from error
    except PermissionError:
        raise EnvironmentProblem(f"{argv[0]} is not executable by this user") from None
    finally:
        if fd is not None:
            os.close(fd)
    if result.returncode != 0:
        first_line = next((line for line in result.stderr.splitlines() if line.strip()), "no error message")
        raise CommandFailed(
            f"{argv[0]} failed (exit {result.returncode}): {first_line.strip()}",
            result.returncode,
            result.stderr,
        )
    return result.stdout


def read_file_in_netns(path: str, netns_path: str | None) -> str | None:
    """The contents of a per-namespace file such as /proc/self/net/ip_tables_names as seen from inside the
    namespace, or None when it does not exist there."""
    if netns_path is None:
        try:
            with open(path, encoding="utf-8") as file:
                return file.read()
        except FileNotFoundError:
            return None
    try:
        return run_in_netns(["cat", path], netns_path)
    except CommandFailed as error:
        if "No such file" in error.stderr:
            return None
        raise


def _enter_with_sysfs(path: str) -> None:
    """In the forked child: the namespace, a private mount namespace, and that namespace's /sys."""
    libc = _libc()
    fd = _open_netns(path)
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


def call_in_netns(netns: str | None, function: Callable[[], T]) -> T:
    """`function()` in `netns` (a name under /run/netns or a path); in this process when netns is None."""
    if netns is None:
        return function()
    path = netns_file(netns)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        os.close(read_fd)
        try:
            _enter_with_sysfs(path)
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


def _child_enter(setns: Any, path: str) -> int:
    """In a forked child: enter the network namespace at `path`; 0, or setns's errno (OSError from open)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return 0 if setns(fd, _CLONE_NEWNET) == 0 else ctypes.get_errno()
    finally:
        os.close(fd)


def sockets_in_netns(
    paths: Sequence[str], family: int, kind: int, proto: int, per_netns: int = 1
) -> dict[str, list[socket.socket] | OSError]:
    """`per_netns` sockets made inside each namespace file in `paths` (a socket stays bound to the namespace
    it was made in). One forked child enters the namespaces in turn and hands each one's sockets back over a
    unix socket (SCM_RIGHTS): one fork for any number of namespaces, and this process never moves. A
    namespace that cannot be entered maps to its OSError."""
    if not paths:
        return {}
    setns = _libc().setns  # looked up before the fork: the child makes only system calls
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        parent_end.close()
        try:
            for path in paths:
                made: list[socket.socket] = []
                try:
                    code = _child_enter(setns, path)
                    if not code:
                        made = [
                            socket.socket(family, kind | socket.SOCK_CLOEXEC, proto) for _ in range(per_netns)
                        ]
                except OSError as error:
                    code = error.errno or 1
                socket.send_fds(child_end, [struct.pack("=i", code)], [sock.fileno() for sock in made])
                for sock in made:
                    sock.close()
        finally:
            os._exit(0)
    child_end.close()
    result: dict[str, list[socket.socket] | OSError] = {}
    try:
        for path in paths:
            data, fds, _, _ = socket.recv_fds(parent_end, 4, per_netns)
            if len(data) < 4:
                break  # the child died: the rest stay unanswered
            code = struct.unpack("=i", data)[0]
            if code:
                for fd in fds:
                    os.close(fd)
                result[path] = OSError(code, f"cannot enter network namespace {path}: {os.strerror(code)}")
            else:
                result[path] = [socket.socket(fileno=fd) for fd in fds]
    finally:
        parent_end.close()
        os.waitpid(pid, 0)
    return result


def files_in_netns(netns_path: str, paths: Sequence[str]) -> list[int | None]:
    """Read-only fds of per-namespace files (/proc/self/net/...) opened inside the namespace at `netns_path`,
    one forked child for all (fds handed back over SCM_RIGHTS, as `sockets_in_netns`); None for a file that
    does not exist there. A /proc/net file keeps the namespace it was opened in: reading the fd again later,
    from this process, shows that namespace's current contents (os.pread at offset 0). EnvironmentProblem
    when the namespace cannot be entered."""
    setns = _libc().setns  # looked up before the fork: the child makes only system calls
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        parent_end.close()
        try:
            code, opened = 0, []
            try:
                code = _child_enter(setns, netns_path)
                for path in paths if not code else ():
                    try:
                        opened.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
                    except FileNotFoundError:
                        opened.append(-1)
            except OSError as error:
                code = error.errno or 1
            present = [fd for fd in opened if fd >= 0]
            header = struct.pack(
                f"=i{len(paths)}b", code, *(fd >= 0 for fd in opened), *([0] * (len(paths) - len(opened)))
            )
            socket.send_fds(child_end, [header], present)
        finally:
            os._exit(0)
    child_end.close()
    try:
        size = 4 + len(paths)
        data, fds, _, _ = socket.recv_fds(parent_end, size, len(paths))
    finally:
        parent_end.close()
        os.waitpid(pid, 0)
    if len(data) < size:
        for fd in fds:
            os.close(fd)
        raise EnvironmentProblem(
            f"the helper process in network namespace {netns_path} died without an answer"
        )
    code, *found = struct.unpack(f"=i{len(paths)}b", data)
    if code:
        for fd in fds:
            os.close(fd)
        raise EnvironmentProblem(f"cannot enter network namespace {netns_path}: {os.strerror(code)}")
    received = iter(fds)
    return [next(received) if present else None for present in found]
