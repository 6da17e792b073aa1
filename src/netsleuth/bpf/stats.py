"""Kernel-side cost of our own programs: run count and run time from bpf_stats (BPF_ENABLE_STATS)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import msgspec

from netsleuth.bpf import _libbpf

__all__ = ["ProgramStats", "RunTimeStats", "bpf_stats_sysctl_enabled", "program_stats"]

# Offsets in struct bpf_prog_info (include/uapi/linux/bpf.h; UAPI, so stable).
_PROG_INFO_SIZE = 232
_RUN_TIME_NS = 192
_RUN_CNT = 200
_BPF_STATS_RUN_TIME = 0


_BPF_STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


def bpf_stats_sysctl_enabled(path: Path = _BPF_STATS_SYSCTL) -> bool:
    """kernel.bpf_stats_enabled=1: run-time accounting is on for everyone (what the systemd unit sets when
    the agent lacks CAP_SYS_ADMIN for BPF_ENABLE_STATS)."""
    try:
        return path.read_text().strip() == "1"
    except OSError:
        return False


class ProgramStats(msgspec.Struct, frozen=True):
    run_count: int
    run_time_ns: int

    @property
    def ns_per_run(self) -> float:
        return self.run_time_ns / self.run_count if self.run_count else 0.0


def program_stats(fd: int) -> ProgramStats:
    buffer = ctypes.create_string_buffer(_PROG_INFO_SIZE)
    length = ctypes.c_uint32(_PROG_INFO_SIZE)
    if _libbpf.lib().bpf_obj_get_info_by_fd(fd, buffer, ctypes.byref(length)) != 0:
        return ProgramStats(0, 0)
    raw = buffer.raw
    return ProgramStats(
        run_count=int.from_bytes(raw[_RUN_CNT : _RUN_CNT + 8], "little"),
        run_time_ns=int.from_bytes(raw[_RUN_TIME_NS : _RUN_TIME_NS + 8], "little"),
    )


class RunTimeStats:
    """Turns on run-time accounting for as long as it is open (the kernel counts only while an fd is held).

    Accounting costs two clock reads per program run, so it is on only when someone asked for the figures.
    """

    def __init__(self) -> None:
        self._fd = _libbpf.lib().bpf_enable_stats(_BPF_STATS_RUN_TIME)

    @property
    def enabled(self) -> bool:
        return bool(self._fd >= 0)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> RunTimeStats:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
