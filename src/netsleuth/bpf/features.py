"""Cached probes of what the running kernel and this process can do; the one place that asks.

Diagnostics call `require_tracing()` before loading anything so the user gets one sentence about privileges,
BTF or libbpf instead of a verifier error. Program-type fallbacks (tp_btf -> raw_tp) are chosen at load by
trying, because a kernel can advertise a type yet refuse it (e.g. lockdown, or fentry's EPERM on some builds).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from netsleuth.bpf import _libbpf
from netsleuth.bpf.btf import VMLINUX_BTF
from netsleuth.bpf.errors import MissingFeature
from netsleuth.errors import EnvironmentProblem

__all__ = ["Features", "features", "require_tracing"]

_CAP_SYS_ADMIN = 21
_CAP_PERFMON = 38
_CAP_BPF = 39
_BPF_MAP_TYPE_RINGBUF = 27


@dataclass(frozen=True)
class Features:
    btf: bool
    ring_buffer: bool
    kprobes: bool
    can_trace: bool  # root, or CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN

    def as_dict(self) -> dict[str, bool]:
        return {
            "btf": self.btf,
            "ring_buffer": self.ring_buffer,
            "kprobes": self.kprobes,
            "can_trace": self.can_trace,
        }


def _effective_caps(status: Path = Path("/proc/self/status")) -> int:
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _can_trace() -> bool:
    caps = _effective_caps()

    def has(bit: int) -> bool:
        return bool(caps & (1 << bit))

    return os.geteuid() == 0 or has(_CAP_SYS_ADMIN) or (has(_CAP_BPF) and has(_CAP_PERFMON))


@functools.cache
def features() -> Features:
    can_trace = _can_trace()
    ring_buffer = False
    if can_trace:
        ring_buffer = _libbpf.lib().libbpf_probe_bpf_map_type(_BPF_MAP_TYPE_RINGBUF, None) == 1
    return Features(
        btf=VMLINUX_BTF.exists(),
        ring_buffer=ring_buffer,
        # The kprobe PMU is how libbpf attaches kprobes on 4.17+; without it kprobes are not compiled in.
        kprobes=Path("/sys/bus/event_source/devices/kprobe/type").exists(),
        can_trace=can_trace,
    )


def require_tracing() -> Features:
    """Raise one clear sentence when this process cannot load netsleuth's tracing programs."""
    _libbpf.lib()  # libbpf missing is its own sentence
    found = features()
    if not found.can_trace:
        raise EnvironmentProblem(
            "netsleuth needs root (or CAP_BPF + CAP_PERFMON + CAP_NET_ADMIN) to load BPF programs: "
            "run it with sudo"
        )
    if not found.btf:
        raise MissingFeature(
            "kernel BTF (/sys/kernel/btf/vmlinux)",
            "5.4 built with CONFIG_DEBUG_INFO_BTF=y",
            "use a distribution kernel that ships BTF",
        )
    if not found.ring_buffer:
        raise MissingFeature("BPF ring buffers", "5.8")
    return found
