"""Cached probes of what the running kernel and this process can do; the one place that asks.

Diagnostics call `require_tracing()` before loading anything so the user gets one sentence about
privileges, BTF or libbpf instead of a verifier error. Tracepoint arguments that appeared in a known
release (drop reasons, reset reasons, ...) are named probes here (`drop_reasons()`,
`drop_reasons.require()`), read from the kernel's BTF prototype of the tracepoint; the source is a
parameter so the probes run on recorded facts of other kernels. Program-type fallbacks (tp_btf -> raw_tp)
are still chosen at load by trying, because a kernel can advertise a type yet refuse it (lockdown, or
fentry's EPERM on some builds); `probe_all()` reports them by really loading and attaching a
two-instruction program.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

import msgspec

from netsleuth.bpf import _libbpf
from netsleuth.bpf.btf import VMLINUX_BTF, vmlinux_btf
from netsleuth.bpf.errors import MissingFeature
from netsleuth.bpf.stats import bpf_stats_sysctl_enabled
from netsleuth.errors import EnvironmentProblem

__all__ = [
    "Features",
    "TracepointArgument",
    "TracepointSource",
    "consume_skb_location",
    "drop_reasons",
    "feature_names",
    "features",
    "kfree_skb_rx_sk",
    "lacking",
    "probe_all",
    "require_tracepoints",
    "require_tracing",
    "reset_reasons",
    "retransmit_err",
    "tracepoint",
    "tracepoint_minimum_kernel",
]

_CAP_SYS_ADMIN = 21
_CAP_PERFMON = 38
_CAP_BPF = 39
_BPF_MAP_TYPE_RINGBUF = 27
_BPF_PROG_TYPE_RAW_TRACEPOINT = 17
_BPF_PROG_TYPE_TRACING = 26
_BPF_TRACE_RAW_TP = 23
_BPF_TRACE_FENTRY = 24
_BTF_KIND_FUNC = 12


class TracepointSource(Protocol):
    """Where tracepoint prototypes come from: the kernel's BTF (`Btf`), or a recording of another kernel's."""

    def tracepoint_arity(self, tracepoint: str) -> int | None: ...


def _arity(tracepoint_name: str, source: TracepointSource | None) -> int | None:
    if source is None:
        return _running_kernel_arity(tracepoint_name)
    return source.tracepoint_arity(tracepoint_name)


@functools.cache
def _running_kernel_arity(tracepoint_name: str) -> int | None:
    # A kernel's tracepoints do not change while it runs: ask its BTF once per tracepoint and process.
    return vmlinux_btf().tracepoint_arity(tracepoint_name)


class TracepointArgument(msgspec.Struct, frozen=True):
    """A tracepoint argument that first appeared in `minimum_kernel`: present when the prototype has at least
    `arity` arguments (not counting `void *__data`). Call it for a bool; `.require()` raises
    MissingFeature."""

    tracepoint: str
    arity: int
    feature: str
    minimum_kernel: str
    hint: str = ""

    def __call__(self, source: TracepointSource | None = None) -> bool:
        return (_arity(self.tracepoint, source) or 0) >= self.arity

    def missing(self) -> MissingFeature:
        return MissingFeature(self.feature, self.minimum_kernel, self.hint)

    def require(self, source: TracepointSource | None = None) -> None:
        if not self(source):
            raise self.missing()


# The releases below are the kernel commits that added each argument (include/trace/events/*.h).
# c504e5c2f964 "net: skb: introduce kfree_skb_reason()" (5.17)
drop_reasons = TracepointArgument(
    "kfree_skb",
    3,
    "drop reasons in the skb:kfree_skb tracepoint",
    "5.17",
    "without them drops can only be located, not explained",
)
# "net: add rx_sk to trace_kfree_skb" (6.11): the socket a drop was meant for, even when skb->sk is unset.
kfree_skb_rx_sk = TracepointArgument("kfree_skb", 4, "the receiving socket (rx_sk) in skb:kfree_skb", "6.11")
# dd1b527831a3 "net: add location to trace_consume_skb()" (6.3): which function freed the skb.
consume_skb_location = TracepointArgument(
    "consume_skb",
    2,
    "the caller's location in skb:consume_skb",
    "6.3",
    "without it a SYN dropped on a full SYN queue cannot be tied to its listener",
)
# "tcp: add reasons to tcp_send_reset" series, enum sk_rst_reason (include/net/rstreason.h, 6.10).
reset_reasons = TracepointArgument(
    "tcp_send_reset", 3, "reset reasons in the tcp:tcp_send_reset tracepoint", "6.10"
)
# tcp:tcp_retransmit_skb gained the transmit result `err` in 6.11 (failed retransmits become visible).
retransmit_err = TracepointArgument(
    "tcp_retransmit_skb", 3, "the transmit result (err) in tcp:tcp_retransmit_skb", "6.11"
)


# netsleuth attaches tracepoints as raw_tp at the oldest (4.17, c4f6699dfcb8 "bpf: introduce
# BPF_RAW_TRACEPOINT"), so a tracepoint older than that needs 4.17; the ones that came later are listed.
_RAW_TRACEPOINT_KERNEL = "4.17"
_TRACEPOINT_SINCE = {
    "inet_sk_error_report": "5.14",  # "net: sock: introduce sk_error_report" replaced inet_sock_set_error
}


def tracepoint_minimum_kernel(tracepoint_name: str) -> str:
    """The first kernel on which netsleuth can attach to `tracepoint_name`."""
    return _TRACEPOINT_SINCE.get(tracepoint_name, _RAW_TRACEPOINT_KERNEL)


def tracepoint(tracepoint_name: str, source: TracepointSource | None = None) -> bool:
    """Does this kernel have the tracepoint (its `btf_trace_<name>` prototype is in BTF)?"""
    return _arity(tracepoint_name, source) is not None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def require_tracepoints(names: Iterable[str], source: TracepointSource | None = None) -> None:
    """Raise one MissingFeature naming every absent tracepoint and the first kernel that has them all."""
    missing = sorted({name for name in names if not tracepoint(name, source)})
    if missing:
        newest = max((tracepoint_minimum_kernel(name) for name in missing), key=_version_key)
        plural = "s" if len(missing) > 1 else ""
        raise MissingFeature(f"the tracepoint{plural} {', '.join(missing)}", newest)


class Features(msgspec.Struct, frozen=True):
    btf: bool
    ring_buffer: bool
    kprobes: bool
    can_trace: bool  # root, or CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN


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


def require_tracing(ring_buffer: bool = True) -> Features:
    """Raise one clear sentence when this process cannot load netsleuth's tracing programs. `ring_buffer`
    False: the caller sends its events through a perf buffer, so a kernel without ring buffers will do."""
    _libbpf.lib()  # libbpf missing is its own sentence
    found = features()
    if not found.can_trace:
        raise EnvironmentProblem(
            # The CLI prints errors after "netsleuth: ": the sentence does not name it again.
            "loading BPF programs needs root (or CAP_BPF + CAP_PERFMON + CAP_NET_ADMIN): run it with sudo"
        )
    if not found.btf:
        raise _no_btf()
    if ring_buffer and not found.ring_buffer:
        raise _no_ring_buffer()
    return found


def _no_btf() -> MissingFeature:
    return MissingFeature(
        "kernel BTF (/sys/kernel/btf/vmlinux)",
        "5.4 built with CONFIG_DEBUG_INFO_BTF=y",
        "use a distribution kernel that ships BTF",
    )


def _no_ring_buffer() -> MissingFeature:
    return MissingFeature("BPF ring buffers", "5.8")


# -- program types, by really loading and attaching ---------------------------------------------------------

# BPF_MOV64_IMM(BPF_REG_0, 0); BPF_EXIT_INSN(): the smallest program every tracing type accepts.
_RETURN_ZERO = bytes.fromhex("b7000000000000009500000000000000")


class _ProgLoadOpts(ctypes.Structure):
    # struct bpf_prog_load_opts (libbpf bpf.h, 1.0+), up to the fields used; `sz` tells libbpf where it ends.
    _fields_ = (
        ("sz", ctypes.c_size_t),
        ("attempts", ctypes.c_int),
        ("expected_attach_type", ctypes.c_int),
        ("prog_btf_fd", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_ifindex", ctypes.c_uint32),
        ("kern_version", ctypes.c_uint32),
        ("attach_btf_id", ctypes.c_uint32),
        ("attach_btf_obj_fd", ctypes.c_uint32),
        ("attach_prog_fd", ctypes.c_int),
    )


def _load_and_attach(prog_type: int, attach_type: int, attach_btf_id: int, raw_tp_name: bytes | None) -> bool:
    """Load `return 0` as `prog_type` and attach it (raw_tracepoint_open); True when both succeed."""
    lib = _libbpf.lib()
    opts = _ProgLoadOpts(sz=ctypes.sizeof(_ProgLoadOpts))
    opts.expected_attach_type = attach_type
    opts.attach_btf_id = attach_btf_id
    insns = ctypes.create_string_buffer(_RETURN_ZERO, len(_RETURN_ZERO))
    prog_fd = lib.bpf_prog_load(
        prog_type, b"ns_probe", b"GPL", insns, len(_RETURN_ZERO) // 8, ctypes.byref(opts)
    )
    if prog_fd < 0:
        return False
    try:
        link_fd = lib.bpf_raw_tracepoint_open(raw_tp_name, prog_fd)
        if link_fd < 0:
            return False
        os.close(link_fd)
        return True
    finally:
        os.close(prog_fd)


def _btf_id(name: str, kind: int) -> int | None:
    if not VMLINUX_BTF.exists():
        return None
    return vmlinux_btf().find(name, kind)


@functools.cache
def _probe_tp_btf() -> bool:
    # The attach target of a tp_btf program is the tracepoint's `btf_trace_<name>` typedef (5.5+).
    type_id = _btf_id("btf_trace_kfree_skb", _libbpf.BTF_KIND_TYPEDEF)
    return type_id is not None and _load_and_attach(_BPF_PROG_TYPE_TRACING, _BPF_TRACE_RAW_TP, type_id, None)


@functools.cache
def _probe_fentry() -> bool:
    type_id = _btf_id("tcp_v4_rcv", _BTF_KIND_FUNC)
    return type_id is not None and _load_and_attach(_BPF_PROG_TYPE_TRACING, _BPF_TRACE_FENTRY, type_id, None)


@functools.cache
def _probe_raw_tp() -> bool:
    return _load_and_attach(_BPF_PROG_TYPE_RAW_TRACEPOINT, 0, 0, b"kfree_skb")


class _PerfEventAttr(ctypes.Structure):
    # struct perf_event_attr (include/uapi/linux/perf_event.h) up to config1: PERF_ATTR_SIZE_VER0.
    _fields_ = (
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
    )


_SYS_PERF_EVENT_OPEN = 298  # x86-64
_PERF_TYPE_SOFTWARE = 1
_PERF_COUNT_SW_CPU_CLOCK = 0
_PERF_FLAG_DISABLED = 1


@functools.cache
def _probe_perf_event_profiling() -> bool:
    """Can a sampling CPU clock be opened on CPU 0 for every task (what a BPF profiler attaches to)?"""
    libc = _libbpf.open_library("libc.so.6", "c")
    attr = _PerfEventAttr(
        type=_PERF_TYPE_SOFTWARE,
        size=ctypes.sizeof(_PerfEventAttr),
        config=_PERF_COUNT_SW_CPU_CLOCK,
        sample_period=10_000_000,
        flags=_PERF_FLAG_DISABLED,
    )
    fd = libc.syscall(_SYS_PERF_EVENT_OPEN, ctypes.byref(attr), -1, 0, -1, 0)
    if fd < 0:
        return False
    os.close(fd)
    return True


@functools.cache
def _probe_bpf_stats() -> bool:
    # BPF_ENABLE_STATS (5.8) returns an fd that keeps run-time stats on until closed; closing it at once
    # leaves the sysctl as it was.
    fd = _libbpf.lib().bpf_enable_stats(0)
    if fd < 0:
        return False
    os.close(fd)
    return True


def _cgroup_v2_path(mounts: Path = Path("/proc/self/mounts")) -> str | bool:
    """Where the unified (v2) cgroup hierarchy is mounted, False when it is not."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return fields[1]
    return False


def probe_all() -> dict[str, bool | str]:
    """Every probed feature of this host as one flat dict (for the fleet's host registry and `--version`).

    Program types are probed by loading and attaching a `return 0` program, so the answer is what this
    process can really do; without tracing privileges those are all False. Each probe runs once per
    process: about 10 ms in all here, plus parsing the kernel's BTF once (about 40 ms, shared with every
    diagnostic).
    """
    found = features()
    can_load = found.can_trace
    btf = found.btf
    return {
        "kernel": os.uname().release,
        "can_trace": can_load,
        "btf": btf,
        "ring_buffer": found.ring_buffer,
        "tp_btf": can_load and btf and _probe_tp_btf(),
        "raw_tp": can_load and _probe_raw_tp(),
        "fentry": can_load and btf and _probe_fentry(),
        "kprobes": found.kprobes,
        "drop_reasons": btf and drop_reasons(),
        "kfree_skb_rx_sk": btf and kfree_skb_rx_sk(),
        "consume_skb_location": btf and consume_skb_location(),
        "reset_reasons": btf and reset_reasons(),
        "retransmit_err": btf and retransmit_err(),
        "perf_event_profiling": _probe_perf_event_profiling(),
        "cgroup_v2": _cgroup_v2_path(),
        # Can BPF run-time accounting be on: this process turns it on, or the sysctl has it on for everyone.
        "bpf_stats": can_load and (_probe_bpf_stats() or bpf_stats_sysctl_enabled()),
    }


# -- what a missing probe means -----------------------------------------------------------------------------


class _Fact(msgspec.Struct, frozen=True):
    """One probe_all() key as a person reads its absence. `after`: the facts probe_all() needs before it
    probes this one (no program loads without privileges, no typed tracepoint without BTF), so when one of
    those is missing it is the reason, not this."""

    lacking: str
    after: tuple[str, ...] = ()


_FACTS: dict[str, _Fact] = {
    "can_trace": _Fact(
        "the agent may not load BPF programs: run it as root, or with CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN"
    ),
    "btf": _Fact(str(_no_btf())),
    "ring_buffer": _Fact(str(_no_ring_buffer()), ("can_trace",)),
    # Program types are probed by loading one, so a refusal is what is known, not why. c4f6699dfcb8 "bpf:
    # introduce BPF_RAW_TRACEPOINT" (4.17); ac4414b5ca47 "bpf: Introduce BPF_TRACE_RAW_TP" (tp_btf, 5.5);
    # fec56f5890d9 "bpf: Introduce BPF trampoline" (fentry, 5.5), which patches the __fentry__ call that only
    # a kernel built with CONFIG_FUNCTION_TRACER has.
    "raw_tp": _Fact(
        f"the kernel refused a raw tracepoint program (Linux {_RAW_TRACEPOINT_KERNEL} or newer has them)",
        ("can_trace",),
    ),
    "tp_btf": _Fact(
        "the kernel refused a BTF-typed tracepoint program (tp_btf: Linux 5.5 or newer)", ("can_trace", "btf")
    ),
    "fentry": _Fact(
        "the kernel refused an fentry program (Linux 5.5 or newer, built with CONFIG_FUNCTION_TRACER)",
        ("can_trace", "btf"),
    ),
    "kprobes": _Fact("this kernel has no kprobes (it was built without CONFIG_KPROBES)"),
    "drop_reasons": _Fact(str(drop_reasons.missing()), ("btf",)),
    "kfree_skb_rx_sk": _Fact(str(kfree_skb_rx_sk.missing()), ("btf",)),
    "consume_skb_location": _Fact(str(consume_skb_location.missing()), ("btf",)),
    "reset_reasons": _Fact(str(reset_reasons.missing()), ("btf",)),
    "retransmit_err": _Fact(str(retransmit_err.missing()), ("btf",)),
    "perf_event_profiling": _Fact(
        "the agent cannot open a sampling CPU clock for every task (perf_event_open refused it: "
        "kernel.perf_event_paranoid, or a seccomp profile that blocks perf_event_open)"
    ),
    "cgroup_v2": _Fact("the agent sees no cgroup v2 hierarchy mounted"),
    "bpf_stats": _Fact(
        "BPF run-time accounting is off and the agent cannot turn it on: give it CAP_SYS_ADMIN "
        "(BPF_ENABLE_STATS, Linux 5.8 or newer) or set kernel.bpf_stats_enabled=1",
        ("can_trace",),
    ),
}


def lacking(found: Mapping[str, object], needs: Iterable[str]) -> list[str] | None:
    """Why a host whose probe_all() gave `found` cannot meet `needs` (feature names), one sentence per root
    cause: [] when it meets them all, None when `found` does not say (an agent that did not probe one of them,
    or whose probes failed). A probe that was not run because an earlier one failed is explained by that one.
    """
    wanted = list(dict.fromkeys(needs))
    causes: list[str] = []

    def add(name: str) -> None:
        fact = _FACTS[name]
        for earlier in fact.after:
            if not found.get(earlier):
                add(earlier)
                return
        if fact.lacking not in causes:
            causes.append(fact.lacking)

    if any(name not in found or name not in _FACTS for name in wanted):
        return None  # not probed by this agent (or by any: a plug-in's need this netsleuth does not know)
    for name in wanted:
        if not found[name]:
            add(name)
    return causes


def feature_names() -> tuple[str, ...]:
    """Every feature a diagnostic may name in its `needs`: the facts probe_all() reports (but the kernel
    release, which is no feature)."""
    return tuple(_FACTS)
