"""tracefs, where the kernel lists its trace events (events/<system>/<event>/id): classic tracepoint programs
need it, because libbpf opens such a program's event by the id it reads there.

Most distributions mount it at boot or on first access (systemd's sys-kernel-tracing.mount); minimal VMs and
fresh containers often do not. Programs attached by BTF (tp_btf, raw_tp) need no tracefs, so only the classic
tracepoints (`snoop`'s syscall events) depend on it. When it is missing and we may, it is mounted where the
kernel expects it (/sys/kernel/tracing, the directory sysfs keeps for it since 4.1) and the caller is told, so
it can say so to the user: mounting is a change to the host.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TRACEFS", "TracefsState", "ensure_tracefs", "trace_event_exists"]

TRACEFS = Path("/sys/kernel/tracing")
# Before 4.1 tracefs was only reachable under debugfs. libbpf looks there only when /sys/kernel/tracing does
# not exist, so that is the one place a kernel with /sys/kernel/tracing must have it mounted.
_LEGACY = Path("/sys/kernel/debug/tracing")


@dataclass(frozen=True)
class TracefsState:
    """Where the trace events are (None: nowhere), whether this call mounted tracefs, and why it could not."""

    events: Path | None
    mounted_now: bool = False
    problem: str | None = None

    @property
    def note(self) -> str | None:
        """The sentence for the user when we changed the host."""
        if self.mounted_now:
            return f"tracefs was not mounted: netsleuth mounted it on {TRACEFS} (as mount -t tracefs would)"
        return None


def _mount_tracefs(target: Path) -> int:
    """mount(2) tracefs on `target`; 0 or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
    libc.mount.restype = ctypes.c_int
    if libc.mount(b"nodev", os.fsencode(target), b"tracefs", 0, None) == 0:
        return 0
    return ctypes.get_errno()


def ensure_tracefs(target: Path = TRACEFS, legacy: Path = _LEGACY) -> TracefsState:
    """The trace events' directory where libbpf will look for them, mounting tracefs on `target` first when
    it is not mounted there."""
    if (target / "events").is_dir():
        return TracefsState(target / "events")
    if not target.is_dir():
        if (legacy / "events").is_dir():
            return TracefsState(legacy / "events")
        return TracefsState(None, problem=f"this kernel has no {target} to mount tracefs on (CONFIG_TRACING)")
    number = _mount_tracefs(target)
    if number == errno.EBUSY:  # mounted meanwhile (another process, an automount): look again
        number = 0
    if number:
        return TracefsState(
            None,
            problem=f"tracefs is not mounted and mounting it on {target} failed ({os.strerror(number)}); "
            f"mount it with: mount -t tracefs nodev {target}",
        )
    if not (target / "events").is_dir():
        return TracefsState(None, problem=f"tracefs mounted on {target} lists no trace events")
    return TracefsState(target / "events", mounted_now=True)


def trace_event_exists(events: Path | None, event: str) -> bool:
    """Is `system/name` a trace event of this kernel (given the events directory of ensure_tracefs)?"""
    return events is not None and (events / event).is_dir()
