"""`snoop exec` and `snoop open`: execsnoop and opensnoop from tracepoints (bpf/snoop.bpf.c).

`exec` reports every execve/execveat with its arguments and result, and the exit status of each process
whose exec it reported; `open` every open/openat with its fd or error. Both take the filters that apply to a
process (--pid, --comm, --netns, --cgroup) and --failed, all applied in the kernel, and name the process's
network namespace and container.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from netsleuth._generated.snoop_abi import (
    KIND_COUNT,
    STAT_COUNT,
    SnoopConfigC,
    SnoopEventC,
    SnoopEventKind,
    SnoopFlag,
    SnoopGroupC,
    SnoopGroupKeyC,
)
from netsleuth.bpf.errors import MissingFeature
from netsleuth.bpf.program_session import ProgramSession, Variant
from netsleuth.diagnostics.filters import read_task_selection
from netsleuth.diagnostics.model import ConfigInput, DiagnosticSpec, RunOptions
from netsleuth.diagnostics.schema import SCHEMA_VERSIONS
from netsleuth.diagnostics.tcp_context import iso_time
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import EnvironmentProblem, NetsleuthError, UsageError
from netsleuth.kernel.cgroups import CgroupPaths
from netsleuth.kernel.process import ContainerCache
from netsleuth.kernel.tracefs import ensure_tracefs, trace_event_exists

if TYPE_CHECKING:
    from netsleuth.kernel.context import KernelClock, KernelContext

__all__ = [
    "DIAGNOSTICS",
    "ExecRecord",
    "ExitRecord",
    "OpenRecord",
    "SnoopConfig",
    "SnoopDiagnostic",
    "SnoopSummary",
    "open_flags_text",
    "read_snoop_config",
]

_EVENT_SIZE = ctypes.sizeof(SnoopEventC)
MODES = ("exec", "open")
# The packet filters of other diagnostics that mean nothing for a process trace.
_PACKET_ONLY = ("proto", "host", "src", "dst", "port", "sport", "dport", "dev", "family")

# Programs per mode: (base name, trace event); a syscall the architecture lacks (open on arm64) is left out.
_MODE_PROGRAMS: dict[str, tuple[tuple[str, str], ...]] = {
    "exec": (
        ("snoop_exec_enter", "syscalls/sys_enter_execve"),
        ("snoop_exec_exit", "syscalls/sys_exit_execve"),
        ("snoop_execat_enter", "syscalls/sys_enter_execveat"),
        ("snoop_execat_exit", "syscalls/sys_exit_execveat"),
        ("snoop_exec_moved", "sched/sched_process_exec"),
        ("snoop_exit", "sched/sched_process_exit"),
    ),
    "open": (
        ("snoop_open_enter", "syscalls/sys_enter_open"),
        ("snoop_open_exit", "syscalls/sys_exit_open"),
        ("snoop_openat_enter", "syscalls/sys_enter_openat"),
        ("snoop_openat_exit", "syscalls/sys_exit_openat"),
    ),
}
_ALL_PROGRAMS = tuple(name for programs in _MODE_PROGRAMS.values() for name, _ in programs)
_VARIANTS = (Variant("_t", "tracepoint"),)

# include/uapi/asm-generic/fcntl.h (x86-64 values), the flags opensnoop users read.
_ACCESS = {0: "O_RDONLY", 1: "O_WRONLY", 2: "O_RDWR"}
_OPEN_FLAGS = (
    (0o100, "O_CREAT"),
    (0o200, "O_EXCL"),
    (0o1000, "O_TRUNC"),
    (0o2000, "O_APPEND"),
    (0o4000, "O_NONBLOCK"),
    (0o200000, "O_DIRECTORY"),
    (0o400000, "O_NOFOLLOW"),
    (0o2000000, "O_CLOEXEC"),
    (0o10000000, "O_PATH"),
    (0o20200000, "O_TMPFILE"),
)


def open_flags_text(flags: int) -> str:
    names = [_ACCESS.get(flags & 3, f"0x{flags & 3:x}")]
    for bit, name in _OPEN_FLAGS:
        if flags & bit == bit and not (name == "O_DIRECTORY" and flags & 0o20200000 == 0o20200000):
            names.append(name)
    return "|".join(names)


def error_name(ret: int) -> str | None:
    return errno.errorcode.get(-ret, str(ret)) if ret < 0 else None


# -- config --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnoopConfig:
    mode: str = "exec"
    pid: int | None = None
    comm: str | None = None
    netns: int | None = None
    cgroup_id: int | None = None
    failed: bool = False
    summary_only: bool = False
    sample_every: int = 1
    duration: float | None = None

    @property
    def run_options(self) -> RunOptions:
        return RunOptions(summary=self.summary_only, sample=self.sample_every, duration=self.duration)


SNOOP_KEYS = ("pid", "comm", "netns", "cgroup", "failed", *RunOptions.KEYS)


def read_snoop_config(values: ConfigInput, mode: str) -> SnoopConfig:

    if mode not in MODES:
        raise UsageError(f"snoop traces exec or open, not {mode!r}")
    for key in _PACKET_ONLY:
        value = values.raw(key)
        if value not in (None, [], False):
            raise UsageError(
                f"{ConfigInput.flag_name(key)} does not apply to snoop: it traces processes, not packets"
            )
    options = RunOptions.read(values)
    tasks = read_task_selection(values)
    return SnoopConfig(
        mode=mode,
        pid=tasks.pid,
        comm=tasks.comm,
        netns=tasks.netns,
        cgroup_id=tasks.cgroup_id,
        failed=values.flag("failed"),
        summary_only=options.summary,
        sample_every=options.sample,
        duration=options.duration,
    )


# -- records -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Process:
    time: float
    pid: int
    tid: int
    ppid: int
    uid: int
    comm: str
    netns: int
    netns_name: str | None
    container: str | None

    def _base(self) -> dict[str, Any]:
        return {
            "time": iso_time(self.time),
            "pid": self.pid,
            "tid": self.tid,
            "ppid": self.ppid,
            "uid": self.uid,
            "comm": self.comm,
            "netns": self.netns,
            "netns_name": self.netns_name,
            "container": self.container,
        }


@dataclass(frozen=True)
class ExecRecord(_Process):
    path: str
    args: tuple[str, ...]
    args_truncated: bool
    ret: int
    duration_us: float

    @property
    def error(self) -> str | None:
        return error_name(self.ret)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "exec",
            "v": SCHEMA_VERSIONS["exec"],
            **self._base(),
            "path": self.path,
            "args": list(self.args),
            "args_truncated": self.args_truncated,
            "ret": self.ret,
            "error": self.error,
            "duration_us": round(self.duration_us, 1),
        }


@dataclass(frozen=True)
class ExitRecord(_Process):
    status: int  # the wait status: exit code << 8, or the signal number
    runtime_ms: float  # since the exec that was reported

    @property
    def exit_code(self) -> int | None:
        return (self.status >> 8) & 0xFF if self.status & 0x7F == 0 else None

    @property
    def signal(self) -> int | None:
        return self.status & 0x7F or None

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "exit",
            "v": SCHEMA_VERSIONS["exit"],
            **self._base(),
            "exit_code": self.exit_code,
            "signal": self.signal,
            "runtime_ms": round(self.runtime_ms, 3),
        }


@dataclass(frozen=True)
class OpenRecord(_Process):
    path: str
    flags: int
    ret: int
    duration_us: float

    @property
    def error(self) -> str | None:
        return error_name(self.ret)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "open",
            "v": SCHEMA_VERSIONS["open"],
            **self._base(),
            "path": self.path,
            "flags": open_flags_text(self.flags),
            "fd": self.ret if self.ret >= 0 else None,
            "error": self.error,
            "duration_us": round(self.duration_us, 1),
        }


SnoopRecord = ExecRecord | ExitRecord | OpenRecord

_KIND_NAMES = {SnoopEventKind.EXEC: "exec", SnoopEventKind.EXIT: "exit", SnoopEventKind.OPEN: "open"}


@dataclass(frozen=True)
class SnoopGroup:
    """Exact count of one (kind, name, path prefix, result, netns), with the first event as its example."""

    kind: str
    count: int
    example: SnoopRecord

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": self.count, "example": self.example.to_json()}


@dataclass(frozen=True)
class SnoopSummary:
    mode: str
    by_kind: dict[str, EventTotals]
    attach: str
    interrupted: bool
    groups: tuple[SnoopGroup, ...]
    clock: KernelClock

    @property
    def totals(self) -> EventTotals:
        total = EventTotals()
        for totals in self.by_kind.values():
            total = total + totals
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "summary",
            "v": SCHEMA_VERSIONS["summary"],
            "diagnostic": f"snoop.{self.mode}",
            **self.totals.to_json(),
            "by_kind": {kind: totals.to_json() for kind, totals in self.by_kind.items()},
            "attach": self.attach,
            "interrupted": self.interrupted,
            "clock": self.clock.to_json(),
            "groups": [group.to_json() for group in self.groups],
        }


# -- naming --------------------------------------------------------------------------------------------


class SnoopNamer:
    """Raw events -> records: the namespace's name and the container (from the process while it lives,
    else from its cgroup id: a short command has often exited before its event is read)."""

    def __init__(self, context: KernelContext) -> None:
        self.context = context
        self._containers = ContainerCache(context.owners.proc_root)
        self._cgroups = CgroupPaths()

    def container(self, pid: int, cgroup_id: int) -> str | None:
        if os.path.exists(os.path.join(self._containers.proc_root, str(pid))):
            found = self._containers(pid)
            if found is not None:
                return found
        return self._cgroups.container_of(cgroup_id)

    def record(self, event: SnoopEventC, args_bytes: bytes = b"") -> SnoopRecord:
        context = self.context
        common = {
            "time": context.wall_time(event.time_ns),
            "pid": event.pid,
            "tid": event.tid,
            "ppid": event.ppid,
            "uid": event.uid,
            "comm": event.comm.decode(errors="replace"),
            "netns": event.netns,
            "netns_name": context.netns_name(event.netns),
            "container": self.container(event.pid, event.cgroup_id),
        }
        path = event.path.decode(errors="replace")
        if event.kind == SnoopEventKind.EXEC:
            args = tuple(
                part.decode(errors="replace") for part in args_bytes.split(b"\0")[: event.args_count]
            )
            return ExecRecord(
                **common,
                path=path,
                args=args,
                args_truncated=bool(event.flags & SnoopFlag.ARGS_TRUNCATED),
                ret=event.ret,
                duration_us=event.duration_ns / 1000,
            )
        if event.kind == SnoopEventKind.EXIT:
            return ExitRecord(**common, status=event.ret, runtime_ms=event.duration_ns / 1e6)
        return OpenRecord(
            **common, path=path, flags=event.open_flags, ret=event.ret, duration_us=event.duration_ns / 1000
        )


def decode(raw: bytes) -> tuple[SnoopEventC, bytes]:
    """A ring-buffer record: struct snoop_event, then args_size bytes of NUL-separated arguments."""
    event = SnoopEventC.from_buffer_copy(raw[:_EVENT_SIZE])
    return event, raw[_EVENT_SIZE : _EVENT_SIZE + event.args_size]


# -- the session ---------------------------------------------------------------------------------------


class SnoopDiagnostic:
    """`snoop exec` / `snoop open` as a session of the diagnostic model."""

    def __init__(self, config: SnoopConfig, context: KernelContext | None = None) -> None:
        from netsleuth.kernel.context import KernelContext

        self.config = config
        self._context = context or KernelContext()
        self._own_context = context is None
        self._programs = ProgramSession(
            "snoop",
            _ALL_PROGRAMS,
            variants=_VARIANTS,
            mirrors=(("snoop_event", SnoopEventC), ("snoop_group", SnoopGroupC)),
        )
        self._namer: SnoopNamer | None = None
        self._tracefs_note: str | None = None

    @property
    def attach_kind(self) -> str:
        return self._programs.attach_kind

    def _kinds(self) -> tuple[SnoopEventKind, ...]:
        if self.config.mode == "exec":
            return (SnoopEventKind.EXEC, SnoopEventKind.EXIT)
        return (SnoopEventKind.OPEN,)

    def _kernel_config(self) -> SnoopConfigC:
        config = self.config
        cfg = SnoopConfigC()
        cfg.netns = config.netns or 0
        cfg.pid = config.pid or 0
        cfg.cgroup_id = config.cgroup_id or 0
        cfg.sample_every = config.sample_every
        cfg.comm = (config.comm or "").encode()
        cfg.failed_only = int(config.failed)
        cfg.emit_mask = 0 if config.summary_only else sum(1 << kind for kind in self._kinds())
        return cfg

    def start(self) -> None:
        # Classic tracepoints: libbpf opens each by its id in tracefs, which may need mounting first.
        tracefs = ensure_tracefs()
        self._tracefs_note = tracefs.note
        if tracefs.events is None:
            raise EnvironmentProblem(f"snoop attaches to trace events, and {tracefs.problem}")
        programs = [
            name
            for name, event in _MODE_PROGRAMS[self.config.mode]
            if trace_event_exists(tracefs.events, event)
        ]
        needed = "syscalls/sys_exit_openat" if self.config.mode == "open" else "syscalls/sys_exit_execve"
        if not trace_event_exists(tracefs.events, needed):
            raise MissingFeature(f"the syscall trace events ({needed}; CONFIG_FTRACE_SYSCALLS)", "4.17")
        self._programs.start(programs, ("cfg", self._kernel_config()), ring="events")
        self._context.prepare(self.config.netns)
        self._namer = SnoopNamer(self._context)

    @property
    def namer(self) -> SnoopNamer:
        if self._namer is None:
            raise NetsleuthError("the snoop programs are not attached: start() first")
        return self._namer

    def _records(self, raws: list[bytes]) -> list[SnoopRecord]:
        namer = self.namer
        return [namer.record(*decode(raw)) for raw in raws]

    def poll(self, timeout_ms: int) -> list[SnoopRecord]:
        return self._records(self._programs.poll(timeout_ms))

    def drain(self) -> list[SnoopRecord]:
        return self._records(self._programs.drain())

    def kind_totals(self) -> dict[str, EventTotals]:
        sums = self._programs.counter_sums("snoop_stats", KIND_COUNT * STAT_COUNT)
        return {
            _KIND_NAMES[kind]: EventTotals(*sums[kind * STAT_COUNT : (kind + 1) * STAT_COUNT])
            for kind in self._kinds()
        }

    def totals(self) -> EventTotals:
        total = EventTotals()
        for totals in self.kind_totals().values():
            total = total + totals
        return total

    def raw_groups(self) -> Iterator[tuple[SnoopGroupKeyC, SnoopGroupC]]:
        for key, value in self._programs.entries("snoop_groups"):
            yield SnoopGroupKeyC.from_buffer_copy(key), SnoopGroupC.from_buffer_copy(value)

    def groups(self) -> list[SnoopGroup]:
        if not self._programs.started:
            return []
        namer = self.namer
        groups = [
            SnoopGroup(_KIND_NAMES[SnoopEventKind(key.kind)], value.count, namer.record(value.example))
            for key, value in self.raw_groups()
        ]
        return sorted(groups, key=lambda group: -group.count)

    def summary(self, interrupted: bool) -> SnoopSummary:
        return SnoopSummary(
            self.config.mode,
            self.kind_totals(),
            self.attach_kind,
            interrupted,
            tuple(self.groups()),
            self._context.clock,
        )

    def program_fds(self) -> dict[str, int]:
        return self._programs.program_fds()

    def notes(self) -> list[str]:
        return [self._tracefs_note] if self._tracefs_note else []

    def close(self) -> None:
        self._programs.close()
        if self._own_context:
            self._context.close()


def _spec(mode: str, help_text: str) -> DiagnosticSpec[SnoopConfig]:
    return DiagnosticSpec(
        name=f"snoop.{mode}",
        help=help_text,
        keys=SNOOP_KEYS,
        read=lambda values: read_snoop_config(values, mode),
        open=lambda config, context: SnoopDiagnostic(config, context),
        objects=("snoop",),
        records=("exec", "exit", "summary") if mode == "exec" else ("open", "summary"),
    )


DIAGNOSTICS: dict[str, DiagnosticSpec[SnoopConfig]] = {
    "snoop.exec": _spec("exec", "every exec with its arguments, result and exit status (execsnoop)"),
    "snoop.open": _spec("open", "every file open with its fd or error (opensnoop)"),
}
