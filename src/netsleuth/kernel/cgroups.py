"""cgroup v2 ids and paths: what bpf_get_current_cgroup_id() returns, turned into a path and a container.

A cgroup v2 id is the inode number of the cgroup's directory in the unified hierarchy (kernfs: the id is the
node's ino; cgroup_id() in include/linux/cgroup.h), so `os.stat(dir).st_ino` gives it and a walk of the mount
maps ids back to paths. `--cgroup` accepts a path (absolute, or relative to the mount) or a number.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from netsleuth.errors import UsageError
from netsleuth.kernel.process import parse_cgroup

__all__ = ["CgroupPaths", "cgroup2_mount", "resolve_cgroup_arg"]

_RESCAN_S = 1.0  # an unknown id (a cgroup made after the last walk) walks again at most this often


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> str | None:
    """Where the unified (v2) hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid
    systems), None without one."""
    try:
        with open(mounts, encoding="utf-8") as lines:
            for line in lines:
                fields = line.split()
                if len(fields) >= 3 and fields[2] == "cgroup2":
                    return fields[1]
    except OSError:
        return None
    return None


def resolve_cgroup_arg(text: str, mount: str | None = None) -> int:
    """--cgroup as an id: a number is taken as is; a path must be a directory of the v2 hierarchy."""
    if text.isdigit():
        return int(text)
    mount = mount if mount is not None else cgroup2_mount()
    if mount is None:
        raise UsageError("--cgroup needs the cgroup v2 hierarchy, and this host has none mounted")
    path = text if text.startswith(mount) else os.path.join(mount, text.lstrip("/"))
    try:
        return os.stat(path).st_ino
    except OSError:
        raise UsageError(f"--cgroup {text!r} is not a cgroup: no directory {path}") from None


class CgroupPaths:
    """cgroup id -> path inside the hierarchy ("/system.slice/x.service") and the container it names."""

    def __init__(self, mount: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._mount = mount if mount is not None else cgroup2_mount()
        self._clock = clock
        self._paths: dict[int, str] = {}
        self._scanned = -_RESCAN_S

    def _scan(self) -> None:
        self._scanned = self._clock()
        if self._mount is None:
            return
        paths: dict[int, str] = {}
        for directory, _subdirs, _files in os.walk(self._mount):
            try:
                inode = os.stat(directory).st_ino
            except OSError:
                continue  # removed while walking
            relative = directory[len(self._mount) :] or "/"
            paths[inode] = relative
        self._paths = paths

    def path_of(self, cgroup_id: int) -> str | None:
        if cgroup_id not in self._paths and self._clock() - self._scanned >= _RESCAN_S:
            self._scan()
        return self._paths.get(cgroup_id)

    def container_of(self, cgroup_id: int) -> str | None:
        path = self.path_of(cgroup_id)
        return parse_cgroup(f"0::{path}").short_id if path else None
