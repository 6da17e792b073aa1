"""`snoop exec` and `snoop open` attached: execsnoop and opensnoop from tracepoints (bpf/snoop.bpf.c).

`exec` reports every execve/execveat with its arguments and result, and the exit status of each process
whose exec it reported; `open` every open/openat with its fd or error. Both take the filters that apply to a
process (--pid, --comm, --netns, --cgroup) and --failed, all applied in the kernel, and name the process's
network namespace and container.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from netsleuth._generated.snoop_abi import (
    KIND_COUNT,
    STAT_COUNT,
    SnoopConfigC,
    SnoopEventC,
    SnoopEventKind,
    SnoopFlag,
    SnoopGroupC,
    SnoopGroupKeyC,
    SnoopMaps,
    SnoopObject,
    SnoopRodata,
)
from netsleuth.bpf.errors import MissingFeature
from netsleuth.bpf.program_session import ProgramSession, Variant
from netsleuth.bpf.skeleton import variant_programs
from netsleuth.diagnostics.filter_maps import fill_netns_config
from netsleuth.diagnostics.snoop.records import (
    ExecRecord,
    ExitRecord,
    OpenRecord,
    SnoopConfig,
    SnoopGroup,
    SnoopRecord,
    SnoopSummary,
    error_name,
    open_flags_text,
)
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import EnvironmentProblem, NetsleuthError
from netsleuth.kernel.cgroups import CgroupPaths
from netsleuth.kernel.process import ContainerCache
from netsleuth.kernel.tracefs import ensure_tracefs, trace_event_exists
from netsleuth.spec.records import WallTime
from netsleuth.spec.summary import ClockPart, Summary, TotalsPart

if TYPE_CHECKING:
    from netsleuth.kernel.context import KernelContext

__all__ = ["SnoopDiagnostic", "SnoopNamer"]

_EVENT_SIZE = ctypes.sizeof(SnoopEventC)

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
_VARIANTS = (Variant("_t", "tracepoint"),)
_ALL_PROGRAMS = variant_programs(
    SnoopObject,
    tuple(name for programs in _MODE_PROGRAMS.values() for name, _ in programs),
    [variant.suffix for variant in _VARIANTS],
)
_KIND_NAMES = {SnoopEventKind.EXEC: "exec", SnoopEventKind.EXIT: "exit", SnoopEventKind.OPEN: "open"}

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
            "time": WallTime(context.wall_time(event.time_ns)),
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
                error=error_name(event.ret),
                duration_us=round(event.duration_ns / 1000, 1),
            )
        if event.kind == SnoopEventKind.EXIT:
            status = event.ret  # the wait status: exit code << 8, or the signal number
            return ExitRecord(
                **common,
                exit_code=(status >> 8) & 0xFF if status & 0x7F == 0 else None,
                signal=status & 0x7F or None,
                runtime_ms=round(event.duration_ns / 1e6, 3),
            )
        return OpenRecord(
            **common,
            path=path,
            flags=open_flags_text(event.open_flags),
            fd=event.ret if event.ret >= 0 else None,
            error=error_name(event.ret),
            duration_us=round(event.duration_ns / 1000, 1),
        )


def decode(raw: bytes) -> tuple[SnoopEventC, bytes]:
    """A ring-buffer record: struct snoop_event, then args_size bytes of NUL-separated arguments."""
    event = SnoopEventC.from_buffer_copy(raw[:_EVENT_SIZE])
    return event, raw[_EVENT_SIZE : _EVENT_SIZE + event.args_size]


# -- the session ---------------------------------------------------------------------------------------


class SnoopDiagnostic:
    """`snoop exec` / `snoop open` as a session of the diagnostic model."""

    def __init__(self, mode: str, config: SnoopConfig, context: KernelContext | None = None) -> None:
        from netsleuth.kernel.context import KernelContext

        self.mode = mode
        self.config = config
        self._context = context or KernelContext()
        self._own_context = context is None
        self._programs = ProgramSession(
            SnoopObject,
            _ALL_PROGRAMS,
            variants=_VARIANTS,
            mirrors=(("snoop_event", SnoopEventC), ("snoop_group", SnoopGroupC)),
        )
        self._namer: SnoopNamer | None = None
        self._tracefs_note: str | None = None
        # Resolved on this host now: a namespace or cgroup that does not exist is an error before any load.
        self._tasks = config.task_selection(self._context.netns_names)

    @property
    def attach_kind(self) -> str:
        return self._programs.attach_kind

    def _kinds(self) -> tuple[SnoopEventKind, ...]:
        if self.mode == "exec":
            return (SnoopEventKind.EXEC, SnoopEventKind.EXIT)
        return (SnoopEventKind.OPEN,)

    def _kernel_config(self) -> SnoopConfigC:
        config = self.config
        tasks = self._tasks
        cfg = SnoopConfigC()
        fill_netns_config(cfg, tasks.netns)
        cfg.pid = tasks.pid or 0
        cfg.cgroup_id = tasks.cgroup_id or 0
        cfg.sample_every = config.sample
        cfg.comm = (tasks.comm or "").encode()
        cfg.failed_only = int(config.failed)
        cfg.emit_mask = 0 if config.summary else sum(1 << kind for kind in self._kinds())
        return cfg

    def start(self) -> None:
        # Classic tracepoints: libbpf opens each by its id in tracefs, which may need mounting first.
        tracefs = ensure_tracefs()
        self._tracefs_note = tracefs.note
        if tracefs.events is None:
            raise EnvironmentProblem(f"snoop attaches to trace events, and {tracefs.problem}")
        programs = [
            name for name, event in _MODE_PROGRAMS[self.mode] if trace_event_exists(tracefs.events, event)
        ]
        needed = "syscalls/sys_exit_openat" if self.mode == "open" else "syscalls/sys_exit_execve"
        if not trace_event_exists(tracefs.events, needed):
            raise MissingFeature(f"the syscall trace events ({needed}; CONFIG_FTRACE_SYSCALLS)", "4.17")
        self._programs.start(programs, (SnoopRodata.cfg, self._kernel_config()), ring=SnoopMaps.events)
        self._context.prepare(self._tasks.netns)
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
        """The run's last events: the programs stop first (every caller drains once, at its end), so the
        totals and groups read after it are final and agree."""
        return self._records(self._programs.last_drain())

    def kind_totals(self) -> dict[str, EventTotals]:
        sums = self._programs.counter_sums(SnoopMaps.snoop_stats, KIND_COUNT * STAT_COUNT)
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
        for key, value in self._programs.entries(SnoopMaps.snoop_groups):
            yield SnoopGroupKeyC.from_buffer_copy(key), SnoopGroupC.from_buffer_copy(value)

    def groups(self) -> list[SnoopGroup]:
        if not self._programs.started:
            return []
        namer = self.namer
        groups = [
            SnoopGroup(
                kind=_KIND_NAMES[SnoopEventKind(key.kind)],
                count=value.count,
                example=namer.record(value.example),
            )
            for key, value in self.raw_groups()
        ]
        return sorted(groups, key=lambda group: -group.count)

    def summary(self, interrupted: bool) -> SnoopSummary:
        self._programs.stop()  # one read of stopped counters: the total is the groups' sum (+ ungrouped)
        by_kind = self.kind_totals()
        total = EventTotals()
        for totals in by_kind.values():
            total = total + totals
        return SnoopSummary(
            diagnostic=f"snoop.{self.mode}",
            **Summary.totals_fields(total),
            by_kind={kind: TotalsPart.of(totals) for kind, totals in by_kind.items()},
            attach=self.attach_kind,
            interrupted=interrupted,
            clock=ClockPart(**self._context.clock.to_json()),
            groups=tuple(self.groups()),
        )

    def program_fds(self) -> dict[str, int]:
        return self._programs.program_fds()

    def notes(self) -> list[str]:
        return [self._tracefs_note] if self._tracefs_note else []

    def close(self) -> None:
        self._programs.close()
        if self._own_context:
            self._context.close()
