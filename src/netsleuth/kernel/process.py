"""Who owns a socket, and which container a process runs in.

Drops and resets happen in softirq, where the kernel's `current` is whatever task was interrupted, so the
process to blame is the socket's owner. The kernel tells BPF the socket inode; /proc/PID/fd/N links read
`socket:[INODE]` (proc(5)), which maps it back to a process. Walking every fd of every process is costly, so
the map is built once, rebuilt at most every `min_rescan_interval` when an unknown inode shows up (drops
arrive far faster than that), and remembers closed sockets for a while so late events keep their owner.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "CgroupIdentity",
    "ContainerCache",
    "SocketOwner",
    "SocketOwners",
    "cgroup_identity",
    "comm_of",
    "container_of",
    "parse_cgroup",
]

# The kernel keeps 15 characters of a task name (TASK_COMM_LEN is 16 with the NUL; include/linux/sched.h).
_COMM_LENGTH = 15
_SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")

# Container ids in cgroup paths, one path component at a time, deepest first:
#   docker-<id>.scope / cri-containerd-<id>.scope / crio-<id>.scope / libpod-<id>.scope   (systemd driver)
#   /docker/<id>, /kubepods/<qos>/pod<uid>/<id>, /k8s.io/<id>                              (cgroupfs driver)
# `crio-conmon-<id>` and `libpod-conmon-<id>` are the runtime monitor beside the container, not in it.
_CONTAINER_COMPONENT = re.compile(
    r"^(?:(?P<runtime>docker|cri-containerd|crio|libpod|containerd)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)
_RUNTIME_NAMES = {
    "docker": "docker",
    "cri-containerd": "containerd",
    "containerd": "containerd",
    "crio": "cri-o",
    "libpod": "podman",
}
# Pod uid: `pod<uuid>` (cgroupfs) or `kubepods-<qos>-pod<uuid with _ for ->.slice` (systemd driver).
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True, slots=True)
class SocketOwner:
    pid: int
    comm: str


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """What a process's cgroup path says about where it runs."""

    path: str
    container_id: str | None = None  # the full 64-hex id
    runtime: str | None = None  # docker, containerd, cri-o, podman; None when the path does not say
    pod_uid: str | None = None

    @property
    def short_id(self) -> str | None:
        """The 12-character id `docker ps` and `crictl ps` print."""
        return self.container_id[:12] if self.container_id else None


def comm_of(pid: int, proc_root: str = "/proc") -> str | None:
    """The process's name (/proc/PID/comm), None when it is gone."""
    try:
        with open(os.path.join(proc_root, str(pid), "comm"), encoding="utf-8", errors="replace") as comm_file:
            return comm_file.read().rstrip("\n")
    except OSError:
        return None


def parse_cgroup(text: str) -> CgroupIdentity:
    """Container and pod from the contents of /proc/PID/cgroup (cgroups(7): `ID:controllers:path` lines;
    cgroup v2 is the single `0::path` line, which we prefer)."""
    paths = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths.append((parts[0] != "0" or parts[1] != "", parts[2]))
    paths.sort(key=lambda entry: entry[0])  # v2 first, then v1 hierarchies in file order
    for _, path in paths:
        pod = _POD_UID.search(path)
        pod_uid = pod.group(1).replace("_", "-") if pod else None
        for component in reversed(path.split("/")):
            match = _CONTAINER_COMPONENT.match(component)
            if match:
                runtime = match.group("runtime")
                if runtime is None and "/docker/" in path:
                    runtime = "docker"
                return CgroupIdentity(
                    path=path,
                    container_id=match.group("id"),
                    runtime=_RUNTIME_NAMES.get(runtime) if runtime else None,
                    pod_uid=pod_uid,
                )
        if pod_uid is not None:
            return CgroupIdentity(path=path, pod_uid=pod_uid)
    return CgroupIdentity(path=paths[0][1] if paths else "")


def cgroup_identity(pid: int, proc_root: str = "/proc") -> CgroupIdentity | None:
    """The parsed /proc/PID/cgroup, None when the process is gone."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as cgroup:
            return parse_cgroup(cgroup.read())
    except OSError:
        return None


def container_of(pid: int, proc_root: str = "/proc") -> str | None:
    """The short (12-character) container id the process runs in, None on the host or when it is gone."""
    identity = cgroup_identity(pid, proc_root)
    return identity.short_id if identity else None


def _pids(proc_root: str) -> list[int]:
    try:
        return [int(name) for name in os.listdir(proc_root) if name.isdigit()]
    except OSError:
        return []


def _socket_inodes(proc_root: str, pid: int) -> list[int]:
    """Socket inodes among the process's open fds (empty when it is gone or not ours to read)."""
    inodes = []
    try:
        with os.scandir(os.path.join(proc_root, str(pid), "fd")) as fds:
            for fd in fds:
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue  # closed between listing and reading
                if target.startswith("socket:["):
                    match = _SOCKET_LINK.match(target)
                    if match:
                        inodes.append(int(match.group(1)))
    except OSError:
        pass
    return inodes


class SocketOwners:
    """Socket inode → owning process, from /proc/*/fd.

    `owner()` never scans per call: an unknown inode triggers a rescan only when the last one is at least
    `min_rescan_interval` seconds old. Sockets that disappear stay known for `retain_closed` seconds, so a
    drop reported just after close() is still attributed.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        min_rescan_interval: float = 0.5,
        retain_closed: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self.min_rescan_interval = min_rescan_interval
        self.retain_closed = retain_closed
        self._clock = clock
        self._lock = threading.Lock()
        self._owners: dict[int, tuple[SocketOwner, ...]] = {}
        self._last_seen: dict[int, float] = {}
        self._scanned_at: float | None = None
        self.scans = 0  # how many /proc walks so far (for tests and self-reported cost)

    def owner(self, inode: int) -> SocketOwner | None:
        """The socket's owner; with several (a socket shared across fork), the lowest pid — for a pre-fork
        server, the parent that opened it."""
        owners = self.owners(inode)
        return owners[0] if owners else None

    def owners(self, inode: int) -> tuple[SocketOwner, ...]:
        """Every process holding the socket, by pid."""
        owners = self._owners.get(inode)
        if owners is None:
            with self._lock:
                scanned_at = self._scanned_at
                if scanned_at is None or self._clock() - scanned_at >= self.min_rescan_interval:
                    self._rescan_locked()
            owners = self._owners.get(inode)
        return owners or ()

    def rescan(self) -> None:
        """Walk /proc now, whatever the interval."""
        with self._lock:
            self._rescan_locked()

    def _rescan_locked(self) -> None:
        now = self._clock()
        found: dict[int, list[SocketOwner]] = {}
        for pid in sorted(_pids(self.proc_root)):
            inodes = _socket_inodes(self.proc_root, pid)
            if not inodes:
                continue
            comm = comm_of(pid, self.proc_root)
            if comm is None:
                continue  # exited while we looked
            owner = SocketOwner(pid, comm)
            for inode in inodes:
                holders = found.setdefault(inode, [])
                if not holders or holders[-1].pid != pid:  # a socket dup()ed within one process
                    holders.append(owner)
        owners = {inode: tuple(holders) for inode, holders in found.items()}
        last_seen = dict.fromkeys(owners, now)
        for inode, seen in self._last_seen.items():
            if inode not in owners and now - seen < self.retain_closed:
                owners[inode] = self._owners[inode]
                last_seen[inode] = seen
        self._owners, self._last_seen = owners, last_seen
        self._scanned_at = now
        self.scans += 1

    def pids_matching(self, pid: int | None, comm: str | None) -> set[int]:
        """Processes selected by a `--pid` and/or `--comm` filter (both None: every process). A comm longer
        than the kernel keeps is compared on its first 15 characters, as the kernel stored it."""
        wanted_comm = comm[:_COMM_LENGTH] if comm is not None else None
        if pid is not None:
            candidates = [pid] if os.path.isdir(os.path.join(self.proc_root, str(pid))) else []
        else:
            candidates = _pids(self.proc_root)
        if wanted_comm is None:
            return set(candidates)
        return {candidate for candidate in candidates if comm_of(candidate, self.proc_root) == wanted_comm}

    def socket_inodes_of(self, pids: Iterable[int]) -> set[int]:
        """Inodes of every socket the processes have open now (to filter on in the kernel)."""
        inodes: set[int] = set()
        for pid in pids:
            inodes.update(_socket_inodes(self.proc_root, pid))
        return inodes


class ContainerCache:
    """container_of() per pid, remembered for the run: reading /proc/PID/cgroup costs ~90 µs, and events come
    from the same few processes over and over."""

    def __init__(self, proc_root: str = "/proc", limit: int = 65536) -> None:
        self.proc_root = proc_root
        self._limit = limit
        self._known: dict[int, str | None] = {}

    def __call__(self, pid: int) -> str | None:
        if pid not in self._known:
            if len(self._known) >= self._limit:
                self._known.clear()  # a long run meets many short-lived pids; start over rather than grow
            self._known[pid] = container_of(pid, self.proc_root)
        return self._known[pid]
