"""`profile` attached: on-CPU sampling on every CPU at --hz (bpf/profile.bpf.c), counted in the kernel by
(pid, kernel stack, user stack), named with kallsyms and the ELF symbols of each process's mapped files
(netsleuth.kernel.user_symbols).

Counts are exact: every sample that passed the filters is in `matched`; the sum of the stacks' counts equals
it minus the samples the counts table had no room for (`uncounted`); a stack the stack map could not hold
is a "[kernel stack lost]"/"[user stack lost]" frame and is counted on its own. The window is the sampling
window: the clocks start after the start is stamped and stop before the end is, and stacks and totals are
read from stopped clocks, so a process gets at most hz x seconds (+1) samples per CPU it ran on.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from netsleuth._generated.profile_abi import (
    PROFILE_MAX_FRAMES,
    PROFILE_NEW_PIDS,
    PROFILE_NO_SOFTIRQ,
    PROFILE_STATS,
    ProfileConfigC,
    ProfileKeyC,
    ProfileNewPidsC,
    ProfileObject,
    ProfilePrograms,
    ProfileRodata,
    ProfileStat,
)
from netsleuth.bpf.errors import BpfError
from netsleuth.bpf.features import require_tracing
from netsleuth.bpf.object import BpfObject
from netsleuth.bpf.skeleton import variant_programs
from netsleuth.diagnostics.filter_maps import fill_netns_config
from netsleuth.diagnostics.profile.records import ProfileConfig, ProfileSummary, StackRecord, TopFunction
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.kernel.softirqs import softirq_names, softirq_vector
from netsleuth.kernel.user_symbols import UserSymbolizer
from netsleuth.spec.summary import ClockPart, Summary

if TYPE_CHECKING:
    from netsleuth.kernel.context import KernelContext

__all__ = ["KERNEL_SUFFIX", "ProfileDiagnostic", "ProfileTotals", "merge_stacks"]

_KEY_SIZE = ctypes.sizeof(ProfileKeyC)
_EFAULT = (
    -14
)  # bpf_get_stackid: no such stack (a kernel thread's user stack, a user-mode sample's kernel one)
_PID_SCAN_S = 0.25  # how often new pids are looked for (one map read), to read their maps while they run
_SOFTIRQ_VARIANTS = (("_b", "tp_btf"), ("_r", "raw_tp"))
_SOFTIRQ_PROGRAMS = variant_programs(
    ProfileObject, ("profile_sirq_entry", "profile_sirq_exit"), [suffix for suffix, _ in _SOFTIRQ_VARIANTS]
)
_SAMPLE = ProfilePrograms.profile_sample.name
KERNEL_SUFFIX = "_[k]"  # flamegraph.pl's annotation of kernel frames


@dataclass(frozen=True)
class ProfileTotals:
    samples: int  # the clock fired, every CPU and task
    matched: int  # passed the filters: exact
    kernel_lost: int
    user_lost: int
    uncounted: int
    idle: int


def merge_stacks(stacks: list[StackRecord]) -> list[StackRecord]:
    """One stack per process and frames: different return addresses inside the same functions are distinct
    stack ids in the kernel but the same stack by name. Largest first."""
    merged: dict[tuple[int, tuple[str, ...], bool], StackRecord] = {}
    for stack in stacks:
        key = (stack.pid, stack.frames, stack.in_softirq)
        known = merged.get(key)
        merged[key] = (
            stack if known is None else msgspec.structs.replace(known, count=known.count + stack.count)
        )
    return sorted(merged.values(), key=lambda stack: (-stack.count, stack.frames))


# -- the session ---------------------------------------------------------------------------------------


class ProfileDiagnostic:
    """`profile` as a session of the diagnostic model: counts while it runs, the stacks at `drain`."""

    def __init__(self, config: ProfileConfig, context: KernelContext | None = None) -> None:
        from netsleuth.kernel.context import KernelContext

        self.config = config
        # Resolved on this host now: a vector, process, namespace or cgroup it does not have is an error
        # before any load.
        names = softirq_names() if config.softirq is not None else []
        self._softirq = softirq_vector(config.softirq, "--softirq", names) if config.softirq else None
        self._vector = names.index(self._softirq) if self._softirq in names else None
        self._context = context or KernelContext()
        self._own_context = context is None
        try:
            self._tasks = config.task_selection(self._context.netns_names)
        except BaseException:
            if self._own_context:
                self._context.close()
            raise
        self._kernel_only = config.kernel_stacks_only
        self._object: ProfileObject | None = None
        self._cpus: list[int] = []
        self._symbolizer = UserSymbolizer()
        self._started = 0.0
        self._stopped: float | None = None
        self._scanned = 0.0
        self._pid_heads: list[int] = []  # per CPU: how far `new_pids` was read
        self._stacks: list[StackRecord] | None = None
        self._totals: ProfileTotals | None = None  # read with the stacks, once sampling stopped
        self._clocks: list[int] = []  # each CPU's clock: its perf event fd
        self.attach_kind = ""
        self.outputs: list[str] = []

    def _kernel_config(self) -> ProfileConfigC:
        tasks = self._tasks
        cfg = ProfileConfigC()
        cfg.pid = tasks.pid or 0
        fill_netns_config(cfg, tasks.netns)
        cfg.cgroup_id = tasks.cgroup_id or 0
        cfg.comm = (tasks.comm or "").encode()
        cfg.kernel_only = int(self._kernel_only)
        cfg.include_idle = int(self.config.include_idle)
        cfg.softirq = PROFILE_NO_SOFTIRQ if self._vector is None else self._vector
        return cfg

    def start(self) -> None:
        """Load and attach with every CPU's clock stopped, get names ready, then stamp the start and start the
        clocks: the window reported is the one sampled (`drain` stops the clocks before reading)."""
        from netsleuth.bpf.perf_event import attach_program, enable, online_cpus, open_cpu_clock

        require_tracing()
        failure: BpfError | None = None
        variants = _SOFTIRQ_VARIANTS if self._vector is not None else (("", "perf_event"),)
        for suffix, kind in variants:
            bpf_object = BpfObject.open_generated(ProfileObject.object_name)
            try:
                bpf_object.check_struct(ProfileKeyC.c_name, ProfileKeyC)
                bpf_object.set_rodata(ProfileRodata.cfg, self._kernel_config())
                softirq_programs = [name + suffix for name in _SOFTIRQ_PROGRAMS] if suffix else []
                for name in _SOFTIRQ_PROGRAMS:
                    for other, _ in _SOFTIRQ_VARIANTS:
                        bpf_object.set_autoload(name + other, name + other in softirq_programs)
                bpf_object.load([_SAMPLE, *softirq_programs])
                for name in softirq_programs:
                    bpf_object.attach(name)
                self._cpus = online_cpus()
                sample = bpf_object.program_fd(_SAMPLE)
                for cpu in self._cpus:
                    # Opened stopped, and the program set with the bare ioctl: libbpf's attach would start
                    # each clock at once, before the window begins.
                    self._clocks.append(open_cpu_clock(cpu, self.config.hz, disabled=True))
                    attach_program(self._clocks[-1], sample)
            except BpfError as error:
                self._close_clocks()
                bpf_object.close()
                failure = failure or error
                continue
            self._object = ProfileObject(bpf_object)
            self.attach_kind = "perf_event" + (f"+{kind}" if suffix else "")
            break
        if self._object is None:
            assert failure is not None
            raise failure
        self._context.prepare(self._tasks.netns)
        self._started = time.monotonic()
        for fd in self._clocks:
            enable(fd)

    def _stop_sampling(self) -> None:
        """Every CPU's clock stopped, then the end stamped: no sample is taken after it, and none is counted
        while the stacks and totals are read (one consistent read)."""
        from netsleuth.bpf.perf_event import disable
        from netsleuth.bpf.quiesce import wait_for_running_programs

        for fd in self._clocks:
            disable(fd)
        wait_for_running_programs()  # a sample taken just before its clock stopped has been counted
        self._stopped = time.monotonic()

    def _close_clocks(self) -> None:
        import os

        for fd in self._clocks:
            os.close(fd)  # the last reference to the event: it and its program's attachment go away
        self._clocks = []

    # -- run -------------------------------------------------------------------------------------------
    def _keys(self) -> list[ProfileKeyC]:
        if self._object is None:
            return []
        counts = self._object.maps.profile_counts
        return [ProfileKeyC.from_buffer_copy(raw) for raw in counts.keys()]  # noqa: SIM118 - a BPF map

    def _remember_new_pids(self) -> None:
        for key in self._keys():
            if key.pid and not self._symbolizer.known(key.pid):
                self._symbolizer.remember(key.pid)

    def _remember_recent_pids(self) -> None:
        """The pids the program noted as new since the last call (one map read), or the whole counts table
        when a CPU noted more than its ring holds: walking every key each second cost the profiled CPUs more
        than the sampling did."""
        assert self._object is not None
        slots = self._object.maps.new_pids.lookup_per_cpu(bytes(4))
        if len(self._pid_heads) != len(slots):
            self._pid_heads = [0] * len(slots)
        overflowed = False
        for cpu, raw in enumerate(slots):
            recent = ProfileNewPidsC.from_buffer_copy(raw)
            seen, self._pid_heads[cpu] = self._pid_heads[cpu], recent.head
            if recent.head - seen > PROFILE_NEW_PIDS:
                overflowed = True
                continue
            for position in range(seen, recent.head):
                pid = recent.pids[position % PROFILE_NEW_PIDS]
                if pid and not self._symbolizer.known(pid):
                    self._symbolizer.remember(pid)
        if overflowed:
            self._remember_new_pids()

    def poll(self, timeout_ms: int) -> list[StackRecord]:
        time.sleep(timeout_ms / 1000)
        if time.monotonic() - self._scanned >= _PID_SCAN_S and not self._kernel_only:
            self._scanned = time.monotonic()
            self._remember_recent_pids()
        return []

    def drain(self) -> list[StackRecord]:
        """Every distinct stack with its count, largest first (read once, at the end)."""
        if self._stacks is None:
            self._stop_sampling()
            self._stacks = self._read_stacks()
            self._totals = self._read_totals()
        return list(self._stacks)

    def _stack_frames(self, stack_id: int) -> list[int]:
        assert self._object is not None
        raw = self._object.maps.profile_stacks.lookup(stack_id.to_bytes(4, "little"))
        if raw is None:
            return []
        frames = []
        for index in range(PROFILE_MAX_FRAMES):
            address = int.from_bytes(raw[index * 8 : index * 8 + 8], "little")
            if not address:
                break
            frames.append(address)
        return frames

    def _read_stacks(self) -> list[StackRecord]:
        if self._object is None:
            return []
        if not self._kernel_only:
            self._remember_new_pids()
        counts = self._object.maps.profile_counts
        stacks = []
        for raw_key, raw_value in counts.items():
            key = ProfileKeyC.from_buffer_copy(raw_key[:_KEY_SIZE])
            count = int.from_bytes(raw_value[:8], "little")
            comm = key.comm.decode(errors="replace")
            frames: list[str] = [comm]
            user_lost = key.user_stack < 0 and key.user_stack not in (-1, _EFAULT)
            kernel_lost = key.kernel_stack < 0 and key.kernel_stack not in (-1, _EFAULT)
            if key.user_stack >= 0:
                user = self._stack_frames(key.user_stack)
                frames += [self._symbolizer.frame(key.pid, address) for address in reversed(user)]
            elif user_lost:
                frames.append("[user stack lost]")
            if key.kernel_stack >= 0:
                kernel = self._stack_frames(key.kernel_stack)
                frames += [
                    self._context.function_name(address) + KERNEL_SUFFIX for address in reversed(kernel)
                ]
            elif kernel_lost:
                frames.append("[kernel stack lost]")
            stacks.append(
                StackRecord(
                    pid=key.pid,
                    comm=comm,
                    count=count,
                    frames=tuple(frames),
                    in_softirq=bool(key.in_softirq),
                    kernel_lost=kernel_lost,
                    user_lost=user_lost,
                )
            )
        return merge_stacks(stacks)

    def profile_totals(self) -> ProfileTotals:
        """The totals so far; once drained, those read with the stacks after the clocks stopped."""
        return self._totals if self._totals is not None else self._read_totals()

    def _read_totals(self) -> ProfileTotals:
        if self._object is None:
            return ProfileTotals(0, 0, 0, 0, 0, 0)
        stats = self._object.maps.profile_stats
        sums = [
            sum(
                int.from_bytes(value[:8], "little") for value in stats.lookup_per_cpu(i.to_bytes(4, "little"))
            )
            for i in range(PROFILE_STATS)
        ]
        return ProfileTotals(
            samples=sums[ProfileStat.SAMPLES],
            matched=sums[ProfileStat.MATCHED],
            kernel_lost=sums[ProfileStat.KERNEL_LOST],
            user_lost=sums[ProfileStat.USER_LOST],
            uncounted=sums[ProfileStat.UNCOUNTED],
            idle=sums[ProfileStat.IDLE],
        )

    def totals(self) -> EventTotals:
        totals = self.profile_totals()
        return EventTotals(seen=totals.samples, matched=totals.matched, ungrouped=totals.uncounted)

    def summary(self, interrupted: bool) -> ProfileSummary:
        stacks = self.drain()
        leaves: dict[str, int] = {}
        for stack in stacks:
            leaf = stack.frames[-1] if len(stack.frames) > 1 else f"{stack.comm} (no stack)"
            leaves[leaf] = leaves.get(leaf, 0) + stack.count
        top = sorted(leaves.items(), key=lambda item: -item[1])[:15]
        end = self._stopped if self._stopped is not None else time.monotonic()
        totals = self.profile_totals()
        return ProfileSummary(
            diagnostic="profile",
            **Summary.totals_fields(self.totals()),
            attach="perf_event",
            interrupted=interrupted,
            clock=ClockPart(**self._context.clock.to_json()),
            hz=self.config.hz,
            cpus=len(self._cpus),
            seconds=round(end - self._started, 3) if self._started else 0.0,
            softirq=self._softirq,
            samples=totals.samples,
            matched=totals.matched,
            kernel_stack_lost=totals.kernel_lost,
            user_stack_lost=totals.user_lost,
            uncounted=totals.uncounted,
            idle=totals.idle,
            stacks=len(stacks),
            counted=sum(stack.count for stack in stacks),
            top_functions=tuple(TopFunction(function=name, samples=count) for name, count in top),
            outputs=tuple(self.outputs),
        )

    def program_fds(self) -> dict[str, int]:
        if self._object is None:
            return {}
        bpf_object = self._object.bpf_object
        fds = {name: bpf_object.program_fd(name) for name in set(bpf_object.attached_programs())}
        if self._clocks:
            fds[_SAMPLE] = bpf_object.program_fd(_SAMPLE)
        return fds

    def notes(self) -> list[str]:
        totals = self.profile_totals()
        note = self.config.softirq_note()
        notes = [note] if note else []
        if totals.kernel_lost or totals.user_lost:
            notes.append(
                f"{totals.kernel_lost} kernel and {totals.user_lost} user stacks did not fit in the stack "
                "map; they are counted as [kernel stack lost] / [user stack lost] frames"
            )
        if totals.uncounted:
            notes.append(
                f"{totals.uncounted} samples found the counts table full: in the totals, in no stack"
            )
        return notes

    def close(self) -> None:
        self._close_clocks()
        if self._object is not None:
            self._object.bpf_object.close()
            self._object = None
        if self._own_context:
            self._context.close()
