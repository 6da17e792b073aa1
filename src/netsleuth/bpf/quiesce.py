"""Waiting until no detached BPF program still runs, so what a run reads after detaching is final.

Destroying a link unhooks its program at once, but a CPU that entered the hook just before may still be
running it, counting into maps the last read is about to read. Every hook netsleuth attaches to runs its
programs inside an RCU read-side section: a tracepoint calls its probes with preemption disabled
(include/linux/tracepoint.h __DO_TRACE), and bpf_trace_run*(), trace_call_bpf() and the cgroup skb hooks
take rcu_read_lock() around the program. So one RCU grace period after the unhook, none is left running.
Userspace waits for a grace period with membarrier(MEMBARRIER_CMD_GLOBAL) (4.16), which is synchronize_rcu()
(kernel/sched/membarrier.c).
"""

from __future__ import annotations

import ctypes
import platform
import time

__all__ = ["wait_for_running_programs"]

# include/uapi/asm-generic/unistd.h (arm64 and the other generic-table architectures), and x86-64's own table.
_SYS_MEMBARRIER = {"x86_64": 324, "aarch64": 283}
_MEMBARRIER_CMD_GLOBAL = 1  # include/uapi/linux/membarrier.h
# Where membarrier cannot wait (nohz_full kernels refuse MEMBARRIER_CMD_GLOBAL, a seccomp filter may deny
# it): a program's run takes microseconds, so a scheduler tick at the slowest HZ (100) is far more than it.
_FALLBACK_S = 0.01


def wait_for_running_programs() -> None:
    """Return once every BPF program that was running when its link went has returned."""
    number = _SYS_MEMBARRIER.get(platform.machine())
    if number is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(number, _MEMBARRIER_CMD_GLOBAL, 0, 0) == 0:
            return
    time.sleep(_FALLBACK_S)
