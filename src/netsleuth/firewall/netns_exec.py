"""Run a read-only command inside another network namespace and return what it printed.

The firewall tools (iptables-save, nft) list the rules of the namespace they run in, so the child enters
the target namespace with setns(2) between fork and exec. Python 3.11 has no os.setns, hence ctypes. Only
the child moves; this process never changes namespace, so nothing else in netsleuth is affected.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence

from netsleuth.errors import EnvironmentProblem, UsageError

__all__ = ["CommandFailed", "read_file_in_netns", "run_in_netns"]

# include/uapi/linux/sched.h
_CLONE_NEWNET = 0x40000000
_DEFAULT_TIMEOUT = 10.0


class CommandFailed(EnvironmentProblem):
    """The command ran but exited non-zero; readers that can do without its output catch this."""

    def __init__(self, message: str, returncode: int, stderr: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


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


def _enter_netns(fd: int) -> Callable[[], None]:
    """The preexec_fn. subprocess documents preexec_fn as unsafe when other threads run (the child may
    inherit a lock some thread held at fork), so everything is looked up here, in the parent, and the
    child only makes one libc call: no imports, no logging, nothing that takes a Python-level lock."""
    setns = ctypes.CDLL(None, use_errno=True).setns
    setns.argtypes = (ctypes.c_int, ctypes.c_int)
    setns.restype = ctypes.c_int

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
        preexec = _enter_netns(fd) if fd is not None and not _is_current_netns(fd) else None
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
