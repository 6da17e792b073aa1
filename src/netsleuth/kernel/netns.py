"""Network namespaces by inode: the number the kernel hands BPF programs (`net->ns.inum`), mapped to what an
operator knows — an `ip netns` name, a path to enter it, the processes inside.

A namespace file (`/proc/PID/ns/net`, or an `ip netns add` bind mount under /run/netns) lives on the nsfs
pseudo-filesystem and its inode number is the namespace's inum (namespaces(7), "The /proc/[pid]/ns/
directory"). So `os.stat` is all it takes; no setns, no privileges beyond being allowed to look.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Sequence

from netsleuth.errors import UsageError

__all__ = [
    "DEFAULT_NETNS_DIRS",
    "NetnsNames",
    "current_netns_inode",
    "netns_inode",
    "resolve_netns_arg",
]

# iproute2 keeps its bind mounts in /run/netns (NETNS_RUN_DIR); /var/run/netns is the same place on systems
# where /var/run is a symlink, and the only place on old ones.
DEFAULT_NETNS_DIRS = ("/run/netns", "/var/run/netns")

# `readlink /proc/PID/ns/net` prints `net:[4026531840]`; accept that form as well as the bare number.
# Compiled when a --netns value is first read (re caches them), not on every start.
_NS_LINK = r"^net:\[(\d+)\]$"
_NS_LINK_ANY = r"^(\w+):\[(\d+)\]$"
_UNKNOWN = "unknown network namespace {text!r}: give an inode, an `ip netns` name or /proc/PID/ns/net"


def netns_inode(path: str) -> int:
    """The namespace inode of a namespace file (`/proc/PID/ns/net`, `/run/netns/NAME`)."""
    try:
        return os.stat(path).st_ino
    except OSError as error:
        raise UsageError(f"cannot open network namespace {path}: {error.strerror}") from error


def current_netns_inode(proc_root: str = "/proc") -> int:
    """The network namespace netsleuth itself runs in."""
    return netns_inode(os.path.join(proc_root, "self", "ns", "net"))


def _nsfs_device(proc_root: str) -> int | None:
    """The device number of nsfs, to tell a live `ip netns` bind mount from the empty file it leaves behind
    once unmounted (iproute2 creates the mount point as a plain file)."""
    try:
        return os.stat(os.path.join(proc_root, "self", "ns", "net")).st_dev
    except OSError:
        return None


class NetnsNames:
    """inode → `ip netns` name, a path to enter it, and its processes.

    Scans /run/netns and every /proc/PID/ns/net; lookups of an unknown inode rescan at most once per
    `refresh_interval` seconds, so a stream of events from unnamed namespaces costs no more than that.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        netns_dirs: Sequence[str] = DEFAULT_NETNS_DIRS,
        refresh_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self.netns_dirs = tuple(netns_dirs)
        self.refresh_interval = refresh_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._scanned_at: float | None = None
        self._names: dict[str, int] = {}  # name → inode, in directory order
        self._name_paths: dict[str, str] = {}
        self._pids: dict[int, list[int]] = {}  # inode → pids, ascending

    def refresh(self) -> None:
        """Rescan now."""
        nsfs = _nsfs_device(self.proc_root)
        names: dict[str, int] = {}
        name_paths: dict[str, str] = {}
        for directory in self.netns_dirs:
            try:
                entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
            except OSError:
                continue
            for entry in entries:
                if entry.name in names:
                    continue  # /var/run/netns is usually /run/netns again
                try:
                    status = os.stat(entry.path)
                except OSError:
                    continue
                if nsfs is not None and status.st_dev != nsfs:
                    continue  # a mount point left behind by `ip netns delete` or a failed add
                names[entry.name] = status.st_ino
                name_paths[entry.name] = entry.path
        pids: dict[int, list[int]] = {}
        try:
            process_dirs = [name for name in os.listdir(self.proc_root) if name.isdigit()]
        except OSError:
            process_dirs = []
        for pid in sorted(process_dirs, key=int):
            try:
                inode = os.stat(os.path.join(self.proc_root, pid, "ns", "net")).st_ino
            except OSError:
                continue  # gone, a kernel thread's zombie, or not ours to look at without root
            pids.setdefault(inode, []).append(int(pid))
        with self._lock:
            self._names, self._name_paths, self._pids = names, name_paths, pids
            self._scanned_at = self._clock()

    def _scan_once(self) -> None:
        if self._scanned_at is None:
            self.refresh()

    def _rescan_if_due(self) -> None:
        if self._scanned_at is None or self._clock() - self._scanned_at >= self.refresh_interval:
            self.refresh()

    def _known(self, inode: int) -> bool:
        return inode in self._pids or inode in self._names.values()

    def _lookup(self, inode: int) -> None:
        self._scan_once()
        if not self._known(inode):
            self._rescan_if_due()

    def name_of(self, inode: int) -> str | None:
        """The `ip netns` name of the namespace, None when it has none."""
        self._lookup(inode)
        return next((name for name, named in self._names.items() if named == inode), None)

    def path_of(self, inode: int) -> str | None:
        """A file to enter the namespace with (setns(2), `nsenter --net=`): its /run/netns mount, else
        /proc/PID/ns/net of its lowest-numbered process. None when nothing visible holds it."""
        name = self.name_of(inode)
        if name is not None:
            return self._name_paths[name]
        pids = self._pids.get(inode)
        return os.path.join(self.proc_root, str(pids[0]), "ns", "net") if pids else None

    def pids_of(self, inode: int) -> list[int]:
        """Processes in the namespace, ascending."""
        self._lookup(inode)
        return list(self._pids.get(inode, []))

    def inode_of_name(self, name: str) -> int | None:
        """The inode behind an `ip netns` name."""
        self._scan_once()
        if name not in self._names:
            self._rescan_if_due()
        return self._names.get(name)

    def inodes(self) -> list[int]:
        """Every namespace a name or a process holds, ascending."""
        self._rescan_if_due()
        return sorted(set(self._names.values()) | set(self._pids))

    def names(self) -> dict[str, int]:
        """Every `ip netns` name and its inode."""
        self._rescan_if_due()
        return dict(self._names)


def _held_open(inode: int, proc_root: str) -> bool:
    """Whether some process holds the namespace only through an open file descriptor (a runtime that keeps
    it open without a bind mount or a process inside): the last place a live namespace can be."""
    wanted = f"net:[{inode}]"
    try:
        processes = [name for name in os.listdir(proc_root) if name.isdigit()]
    except OSError:
        return False
    for pid in processes:
        fd_dir = os.path.join(proc_root, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) == wanted:
                    return True
            except OSError:
                continue
    return False


def resolve_netns_arg(text: str, names: NetnsNames | None = None) -> int:
    """A user's `--netns` value → namespace inode. Accepts an inode number (also as `net:[N]`), an `ip netns`
    name, or a namespace file such as /proc/PID/ns/net."""
    value = text.strip()
    link = re.match(_NS_LINK, value)
    if link:
        value = link.group(1)
    names = names or NetnsNames()
    if value.isdigit():
        inode = int(value)
        if inode <= 0:
            raise UsageError(_UNKNOWN.format(text=text))
        # A number nothing holds names no namespace: filtering on it would show nothing, silently.
        if names.path_of(inode) is None and not _held_open(inode, names.proc_root):
            raise UsageError(
                f"no network namespace has inode {inode} on this host (no `ip netns` name, process or "
                "open file holds one)"
            )
        return inode
    if "/" in value:
        try:
            status = os.stat(value)
        except OSError as error:
            raise UsageError(f"{_UNKNOWN.format(text=text)} ({error.strerror})") from error
        # Any other file, or another namespace type (/proc/PID/ns/mnt reads as `mnt:[N]`), is not a network
        # namespace; say so rather than filter on a number that will never match.
        nsfs = _nsfs_device(names.proc_root)
        if nsfs is not None and status.st_dev != nsfs:
            raise UsageError(_UNKNOWN.format(text=text))
        try:
            kind = re.match(_NS_LINK_ANY, os.readlink(value))
        except OSError:
            kind = None  # a /run/netns bind mount is no symlink; only `ip netns` makes those
        if kind is not None and kind.group(1) != "net":
            raise UsageError(_UNKNOWN.format(text=text))
        return status.st_ino
    named = names.inode_of_name(value) if value else None
    if named is None:
        raise UsageError(_UNKNOWN.format(text=text))
    return named
