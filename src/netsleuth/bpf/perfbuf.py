"""Consumer of a BPF perf event array (per-CPU perf buffers): the fallback for kernels without ring buffers
(BPF_MAP_TYPE_RINGBUF is 5.8+; perf buffers work back to 4.4). Same face as RingBuffer: `poll` and `drain`
return raw records in batches, decoding is the caller's.

Loss accounting is the same as with the ring buffer: the program counts every bpf_perf_event_output that
fails (-ENOSPC: that CPU's buffer was full) in its LOST counter, exactly as it counts a failed
bpf_ringbuf_output. The kernel also tells the consumer, through a PERF_RECORD_LOST written before the next
record that fits (kernel/events/ring_buffer.c perf_output_begin); `lost` sums those, so a test or a caller
can check the two agree. Differences the caller must know:

- records arrive per CPU, so two events from different CPUs can come out of order (sort by timestamp when
  order matters); the ring buffer is one queue in reserve order;
- a perf sample's raw data is padded so that its u32 size plus the data is a multiple of 8
  (perf_prepare_sample), so a record can carry up to 7 trailing zero bytes: decoders must take lengths from
  the record itself, never from len(record).
"""

from __future__ import annotations

import ctypes
import errno

from netsleuth.bpf import _libbpf
from netsleuth.bpf.errors import BpfError, last_errno_error
from netsleuth.bpf.object import BpfObject

__all__ = ["DEFAULT_PAGES_PER_CPU", "PerfBuffer", "retire_ring_buffer_map"]

# 64 pages = 256 KiB per CPU: on a 2-CPU host the same 512 KiB order as drops' ring buffer per CPU, and a
# power of two as perf_buffer__new requires.
DEFAULT_PAGES_PER_CPU = 64


class PerfBuffer:
    """Open per-CPU perf buffers on the PERF_EVENT_ARRAY map `map_fd`; close() (or `with`) frees them."""

    def __init__(self, map_fd: int, pages_per_cpu: int = DEFAULT_PAGES_PER_CPU) -> None:
        if pages_per_cpu <= 0 or pages_per_cpu & (pages_per_cpu - 1):
            raise ValueError(f"pages_per_cpu must be a power of two, not {pages_per_cpu}")
        self._lib = _libbpf.lib()
        self._pending: list[bytes] = []
        self.lost = 0  # PERF_RECORD_LOST counts the kernel reported, all CPUs
        self.lost_by_cpu: dict[int, int] = {}
        # Keep both callback objects alive as long as libbpf may call them.
        self._sample_callback = _libbpf.PerfSampleCallback(self._on_sample)
        self._lost_callback = _libbpf.PerfLostCallback(self._on_lost)
        with _libbpf.capture_messages() as messages:
            self._handle: int | None = self._lib.perf_buffer__new(
                map_fd, pages_per_cpu, self._sample_callback, self._lost_callback, None, None
            )
        if not self._handle:
            raise last_errno_error("cannot open the BPF perf buffers", messages)

    def _on_sample(self, _ctx: int | None, _cpu: int, data: int | None, size: int) -> None:
        self._pending.append(ctypes.string_at(data or 0, size))

    def _on_lost(self, _ctx: int | None, cpu: int, count: int) -> None:
        self.lost += count
        self.lost_by_cpu[cpu] = self.lost_by_cpu.get(cpu, 0) + count

    def poll(self, timeout_ms: int) -> list[bytes]:
        """Wait up to timeout_ms for records on any CPU; returns those that arrived (possibly none)."""
        if self._handle is None:
            return []
        result = self._lib.perf_buffer__poll(self._handle, timeout_ms)
        # EINTR is a signal (e.g. Ctrl-C), not an error.
        if result < 0 and ctypes.get_errno() != errno.EINTR:
            raise last_errno_error("reading the BPF perf buffers failed")
        records, self._pending = self._pending, []
        return records

    def drain(self) -> list[bytes]:
        """Everything still queued on every CPU, without waiting (at exit, so nothing produced is left)."""
        if self._handle is None:
            return []
        if self._lib.perf_buffer__consume(self._handle) < 0:
            raise last_errno_error("reading the BPF perf buffers failed")
        records, self._pending = self._pending, []
        return records

    def close(self) -> None:
        if self._handle:
            self._lib.perf_buffer__free(self._handle)
        self._handle = None

    def __enter__(self) -> PerfBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_BPF_MAP_TYPE_ARRAY = 2


def retire_ring_buffer_map(bpf_object: BpfObject, name: str = "events") -> None:
    """Before load, turn the object's ring buffer map into a one-entry array so the object loads on a kernel
    without BPF_MAP_TYPE_RINGBUF (< 5.8), whose map creation would fail.

    Only valid for an object whose every use of the map sits behind a `const volatile` switch that was set
    to the perf buffer path: the verifier then never walks those instructions and they are removed as dead
    code, so it does not matter that the map they name is an array (libbpf's documented fallback recipe).
    """
    # Same package as BpfObject: its phases are ours to check (map pointers exist from open to load).
    if bpf_object._loaded:
        raise BpfError("the ring buffer map can only be retired before load")
    pointer = bpf_object._map_pointer(name)
    lib = _libbpf.lib()
    for failed, what in (
        (lib.bpf_map__set_type(pointer, _BPF_MAP_TYPE_ARRAY), "type"),
        (lib.bpf_map__set_key_size(pointer, 4), "key size"),
        (lib.bpf_map__set_value_size(pointer, 4), "value size"),
        (lib.bpf_map__set_max_entries(pointer, 1), "size"),
    ):
        if failed:
            raise last_errno_error(f"cannot change the {what} of map {name}")
