"""One live BPF object for one diagnostic: choose a program variant, configure, load, attach, read, close.

Every diagnostic's kernel side has the same life (bpf/*.bpf.c): a `const volatile cfg` set before load, a
set of programs of which a run wants some, each built twice (tp_btf reads its arguments with no copy;
raw_tp serves kernels that refuse tp_btf), a per-CPU array of exact counters, maybe a hash map of in-kernel
groups, and a ring buffer of events. `ProgramSession` owns that life once, so a diagnostic module only says
which object, which programs, what configuration and which maps to fill - and decodes what comes back.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import msgspec

from netsleuth.bpf.abi import RodataVar
from netsleuth.bpf.errors import BpfError
from netsleuth.bpf.features import require_tracing
from netsleuth.bpf.object import BpfObject
from netsleuth.bpf.perfbuf import PerfBuffer, retire_ring_buffer_map
from netsleuth.bpf.quiesce import wait_for_running_programs
from netsleuth.bpf.ringbuf import RecordBlob, RingBuffer, joined_records
from netsleuth.bpf.skeleton import MapAttr, ObjectMaps, Skeleton, variant_programs

__all__ = ["TP_BTF_THEN_RAW_TP", "PerfFallback", "ProgramBacked", "ProgramSession", "Variant"]


class Variant(msgspec.Struct, frozen=True):
    """One build of an object's programs: their names end in `suffix`; `kind` is how they attach."""

    suffix: str
    kind: str


@dataclass(frozen=True)  # not a Struct: its fields' types are descriptors, which mypy then applies
class PerfFallback:
    """How an object sends its events on a kernel without ring buffers (< 5.8): the perf event array it
    declares beside the ring buffer, and the `const volatile __u8` that routes its output there (e.g.
    bpf/emit.bpf.h `events_perf`, `ns_use_perfbuf`: drops and tcp opt in with NS_EMIT_PERF_FALLBACK)."""

    map: MapAttr
    switch: RodataVar[ctypes.c_uint8]


M = TypeVar("M", bound=ObjectMaps)


# The order in which variants are tried: typed BTF arguments first, then the raw tracepoint.
TP_BTF_THEN_RAW_TP = (Variant("_b", "tp_btf"), Variant("_r", "raw_tp"))


class ProgramSession(Generic[M]):
    """A BPF object from the package's _generated directory, attached with the first variant that loads.

    `skeleton` is the object's generated handles (netsleuth._generated.<name>_abi.<Name>Object): its maps are
    `maps.<name>` once started. `programs` are the base names (without the variant suffix) of every program in
    the object, each checked against the object's programs: the ones a run asks `start` for are loaded and
    attached, every other one is left out (autoload off), so a run pays only for the tracepoints it needs.
    """

    def __init__(
        self,
        skeleton: type[Skeleton[M]],
        programs: Sequence[str],
        variants: Sequence[Variant] = TP_BTF_THEN_RAW_TP,
        mirrors: Sequence[tuple[str, type[ctypes.Structure]]] = (),
    ) -> None:
        self.skeleton_type = skeleton
        self.object_name = skeleton.object_name
        self.variants = tuple(variants)
        self.all_programs = variant_programs(
            skeleton, programs, [variant.suffix for variant in self.variants]
        )
        self._mirrors = tuple(mirrors)
        self._object: BpfObject | None = None
        self._skeleton: Skeleton[M] | None = None
        self._ring: RingBuffer | PerfBuffer | None = None
        self.attach_kind = ""
        self.attached: tuple[str, ...] = ()
        self.attach_seconds = 0.0
        self.stopped_at: float | None = None  # time.monotonic() when stop() ended the run's events

    # -- start -----------------------------------------------------------------------------------------
    def start(
        self,
        programs: Sequence[str],
        config: tuple[RodataVar[Any], ctypes.Structure],
        fill_maps: Callable[[Skeleton[M]], None] = lambda _object: None,
        ring: MapAttr | None = None,
        perf: PerfFallback | None = None,
        sizes: Mapping[MapAttr, int] | None = None,
    ) -> None:
        """Load `programs` (base names) with `config` written to its .rodata variable, fill maps, attach,
        and open the ring buffer map `ring` if events are wanted. The first variant that loads and attaches
        wins; if none does, the first variant's error is raised (it says most about the kernel). With
        `perf`, events go through the object's perf buffer instead: its switch is set and the ring buffer
        map retired before load, so the object loads on a kernel that cannot create one. `sizes` shrinks
        maps this run leaves unused (map -> max_entries) before load."""
        unknown = sorted(set(programs) - set(self.all_programs))
        if unknown:
            raise BpfError(f"{', '.join(unknown)} is not one of the {self.object_name} programs")
        require_tracing(ring_buffer=perf is None)
        started = time.monotonic()
        variable, value = config
        failure: BpfError | None = None
        for variant in self.variants:
            bpf_object = BpfObject.open_generated(self.object_name)
            chosen = [name + variant.suffix for name in programs]
            try:
                for c_name, mirror in self._mirrors:
                    bpf_object.check_struct_size(c_name, mirror)
                bpf_object.set_rodata(variable, value)
                for bpf_map, entries in (sizes or {}).items():
                    bpf_object.set_max_entries(bpf_map.name, entries)
                if perf is not None:
                    bpf_object.set_rodata(perf.switch, ctypes.c_uint8(1))
                    retire_ring_buffer_map(bpf_object, ring.name if ring is not None else "events")
                for name in self.all_programs:
                    for other in self.variants:
                        full = name + other.suffix
                        bpf_object.set_autoload(full, full in chosen)
                bpf_object.load(chosen)
                skeleton = self.skeleton_type(bpf_object)
                fill_maps(skeleton)
                for name in chosen:
                    bpf_object.attach(name)
            except BpfError as error:
                bpf_object.close()
                failure = failure or error
                continue
            self._object = bpf_object
            self._skeleton = skeleton
            self.attach_kind = variant.kind
            self.attached = tuple(chosen)
            break
        if self._object is None:
            assert failure is not None
            raise failure
        if ring is not None:
            fd = self._object.map(perf.map.name if perf is not None else ring.name).fd
            self._ring = PerfBuffer(fd) if perf is not None else RingBuffer(fd)
        self.attach_seconds = time.monotonic() - started

    @property
    def started(self) -> bool:
        return self._object is not None

    @property
    def bpf_object(self) -> BpfObject:
        if self._object is None:
            raise BpfError(f"the {self.object_name} programs are not attached")
        return self._object

    @property
    def maps(self) -> M:
        """The started object's maps, typed (`maps.drop_groups`), each looked up once."""
        if self._skeleton is None:
            raise BpfError(f"the {self.object_name} programs are not attached")
        return self._skeleton.maps

    # -- run -------------------------------------------------------------------------------------------
    def poll(self, timeout_ms: int) -> list[bytes]:
        """Ring-buffer records that arrived within `timeout_ms`; without a ring (counting only) just waits."""
        if self._ring is None:
            time.sleep(timeout_ms / 1000)
            return []
        return self._ring.poll(timeout_ms)

    def drain(self) -> list[bytes]:
        return self._ring.drain() if self._ring is not None else []

    def poll_blob(self, timeout_ms: int) -> RecordBlob:
        """`poll`'s records as one blob and where each is in it (netsleuth.bpf.ringbuf.RecordBlob)."""
        if isinstance(self._ring, RingBuffer):
            return self._ring.poll_blob(timeout_ms)
        return joined_records(self.poll(timeout_ms))

    @property
    def perf_lost(self) -> int | None:
        """Records the kernel reported lost to a perf buffer (PERF_RECORD_LOST); None with a ring buffer. The
        program's own LOST counters count the same losses (netsleuth.bpf.perfbuf)."""
        return self._ring.lost if isinstance(self._ring, PerfBuffer) else None

    def counter_sums(self, counters_map: MapAttr, count: int, first: int = 0) -> list[int]:
        """Sums over CPUs of `count` u64 slots of a per-CPU array, from index `first` on: the exact totals."""
        if self._skeleton is None:
            return [0] * count
        counters = self._skeleton.maps.find(counters_map)
        sums = []
        for index in range(first, first + count):
            per_cpu = counters.lookup_per_cpu(index.to_bytes(4, "little"))
            sums.append(sum(int.from_bytes(value[:8], "little") for value in per_cpu))
        return sums

    def entries(self, groups_map: MapAttr) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of a hash map: the in-kernel groups."""
        if self._skeleton is None:
            return iter(())
        return self._skeleton.maps.find(groups_map).items()

    def program_fds(self) -> dict[str, int]:
        if self._object is None:
            return {}
        return {name: self._object.program_fd(name) for name in self._object.attached_programs()}

    # -- the end of a run ------------------------------------------------------------------------------
    def stop(self, keep: Sequence[str] = ()) -> None:
        """End the run's events: every program is detached and any still running on another CPU has
        returned (netsleuth.bpf.quiesce). Maps, counters and the ring stay readable and no longer move, so
        the last `drain` misses nothing and the totals and groups read after it are final and agree with each
        other. `keep` (base names) stay attached until `close`: a helper whose map no summary reads, e.g.
        drops' marker of netsleuth's own netlink sockets, which must see the firewall reads that name the
        last events. Safe to call twice, and before `start` (nothing to stop)."""
        if self._object is None or self.stopped_at is not None:
            return
        self._object.detach_all(keep={name + variant.suffix for name in keep for variant in self.variants})
        wait_for_running_programs()
        self.stopped_at = time.monotonic()

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    def last_drain(self, keep: Sequence[str] = ()) -> list[bytes]:
        """A run's last read: `stop` (but `keep`), then everything the ring still holds."""
        self.stop(keep)
        return self.drain()

    def close(self) -> None:
        """Detach and free everything; safe to call twice."""
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        if self._object is not None:
            self._object.close()
            self._object = None
        self._skeleton = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ProgramBacked:
    """Base of a diagnostic's kernel session that owns one `ProgramSession` as `_programs`: what it attached
    as, its programs' fds, stopping and closing (also as a context manager)."""

    _programs: ProgramSession[Any]

    def stop(self) -> None:
        """End the run's events before its last read (ProgramSession.stop)."""
        self._programs.stop(self._kept_attached)

    # Programs left attached by `stop` until `close` (ProgramSession.stop's `keep`).
    _kept_attached: tuple[str, ...] = ()

    @property
    def attach_kind(self) -> str:
        return self._programs.attach_kind

    @property
    def attach_seconds(self) -> float:
        return self._programs.attach_seconds

    def program_fds(self) -> dict[str, int]:
        return self._programs.program_fds()

    def close(self) -> None:
        self._programs.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
