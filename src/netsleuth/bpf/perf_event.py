"""perf_event_open(2) for the profiler: one software CPU clock per CPU, sampling at a frequency, for a BPF
perf_event program to attach to (`attach_program`: PERF_EVENT_IOC_SET_BPF). The only place netsleuth opens
perf events.

PERF_COUNT_SW_CPU_CLOCK is an hrtimer-driven software event: it works in VMs and containers without a PMU,
which is why profilers (bcc profile, bpftrace profile:hz) use it. With `freq` set, `sample_freq` is samples
per second per CPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
from pathlib import Path

from netsleuth.bpf.errors import BpfError
from netsleuth.bpf.features import _PerfEventAttr

__all__ = ["attach_program", "disable", "enable", "online_cpus", "open_cpu_clock"]

_SYS_PERF_EVENT_OPEN = 298  # x86-64 (arch/x86/entry/syscalls/syscall_64.tbl)
_PERF_TYPE_SOFTWARE = 1
_PERF_COUNT_SW_CPU_CLOCK = 0
_FLAG_DISABLED = 1 << 0  # perf_event_attr bit 0: opened stopped, until PERF_EVENT_IOC_ENABLE
_FLAG_FREQ = 1 << 10  # perf_event_attr bit 10: sample_period is a frequency
_PERF_FLAG_FD_CLOEXEC = 1 << 3
# include/uapi/linux/perf_event.h: _IO('$', 0), _IO('$', 1), _IOW('$', 8, __u32)
_IOC_ENABLE = 0x2400
_IOC_DISABLE = 0x2401
_IOC_SET_BPF = 0x40042408
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def online_cpus(path: Path = Path("/sys/devices/system/cpu/online")) -> list[int]:
    """The online CPUs, from the kernel's list syntax ("0-3,6")."""
    cpus: list[int] = []
    for part in path.read_text().strip().split(","):
        if "-" in part:
            first, last = part.split("-")
            cpus.extend(range(int(first), int(last) + 1))
        elif part:
            cpus.append(int(part))
    return cpus


def open_cpu_clock(cpu: int, hz: int, disabled: bool = False) -> int:
    """A sampling CPU clock on `cpu` for every task (pid -1), `hz` samples a second; returns its fd.
    `disabled`: it fires only once `enable`d (a sampling window the caller starts and stops itself)."""
    attr = _PerfEventAttr(
        type=_PERF_TYPE_SOFTWARE,
        size=ctypes.sizeof(_PerfEventAttr),
        config=_PERF_COUNT_SW_CPU_CLOCK,
        sample_period=hz,  # the union's sample_freq, with the freq flag
        flags=_FLAG_FREQ | (_FLAG_DISABLED if disabled else 0),
    )
    fd = int(_libc.syscall(_SYS_PERF_EVENT_OPEN, ctypes.byref(attr), -1, cpu, -1, _PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        number = ctypes.get_errno()
        raise BpfError(
            f"cannot open a {hz} Hz CPU clock on CPU {cpu}: {os.strerror(number)} (perf_event_open needs "
            "CAP_PERFMON or root, and kernel.perf_event_paranoid <= 1 without them)"
        )
    return fd


def _ioctl(fd: int, request: int, argument: int, what: str) -> None:
    try:
        fcntl.ioctl(fd, request, argument)
    except OSError as error:
        raise BpfError(f"cannot {what} perf event fd {fd}: {error.strerror}") from None


def attach_program(fd: int, program_fd: int) -> None:
    """Run a BPF perf_event program on each sample of the event (PERF_EVENT_IOC_SET_BPF), without enabling
    it as libbpf's attach does: the program stays attached while the event's fd is open."""
    _ioctl(fd, _IOC_SET_BPF, program_fd, "attach a BPF program to")


def enable(fd: int) -> None:
    _ioctl(fd, _IOC_ENABLE, 0, "enable")


def disable(fd: int) -> None:
    """Stop the event: once this returns, its program runs no more on that CPU (the kernel stops the clock
    there with an IPI and waits), so what the program counted stays as it is."""
    _ioctl(fd, _IOC_DISABLE, 0, "disable")
