"""Consumer of a BPF ring buffer: records are read straight out of the kernel's mapped ring, in bulk.

libbpf's ring_buffer__poll calls back into Python once per record (a ctypes callback and a string_at each:
most of a drop storm's consumer time went there). The ring is plain shared memory, so on x86-64 this module
reads it the way libbpf's ringbuf.c does, without the callbacks:
- the map's fd mapped at offset 0 is the consumer page (read-write: consumer_pos, a u64 we advance), at
  offset one page the producer page (producer_pos) followed by the data pages, mapped twice in a row so a
  record that wraps around the end is contiguous;
- each record has an 8-byte header: u32 length with bit 31 BUSY (reserved, not yet committed) and bit 30
  DISCARD (to be skipped), u32 page offset; a record takes its length plus the header, rounded up to 8.
We walk the headers from consumer_pos up to producer_pos, stop at the first BUSY one, copy every committed
record in one slice, then store the new consumer_pos. Ordering: x86-64 is TSO (loads are not reordered with
loads, stores not with stores), so reading producer_pos, then a header, then the copy sees what the kernel
committed with its release stores, and our store of consumer_pos is seen after our reads - the acquire and
release libbpf spells out hold by themselves. The positions are read and written through memoryviews cast to
u64, whose item access is one aligned 8-byte memcpy: one load or store, never torn. (Not struct.pack_into: it
zeroes its target before writing, and a consumer_pos of 0 for an instant reads as a full ring to the BPF
side, which then samples and loses events - seen in the storm benchmark.) Other architectures keep libbpf's
callback path (`_CallbackRing`).

A storm's records are all one size: their headers then sit one stride apart, and one strided read of them
(a C-level slice of the mapped words, compared with the first header repeated) tells that every one is
committed, instead of a Python step per record; the batch then says where its records are as `StridedBounds`
(first, stride, count, length), which a consumer can read whole (netsleuth.diagnostics.drops.batch).

What the consumer cannot take stays in the ring; past half full the BPF side samples (emit.bpf.h), counted,
never silently lost.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import select
import time
from collections.abc import Iterator, Sequence
from typing import overload

from netsleuth.bpf import _libbpf
from netsleuth.bpf.errors import BpfError, last_errno_error

__all__ = ["RecordBlob", "RingBuffer", "StridedBounds", "joined_records"]

_BATCH = 4096  # records per poll on the callback path
_MAX_BYTES = 1 << 20  # per poll on the mapped path (~6k drops): the loop keeps its clock (progress, Ctrl-C)
# A reader whose last poll found records (a stream, a storm) lets this much gather before it takes, waiting at
# most _GATHER_SECONDS: taken as soon as they come, a storm's records came ~35 per poll, and the work per poll
# (a read, one enrichment per kind, a write) cost as much as the records themselves (bench/drops_storm.py).
# The wait is far shorter than the time a storm takes to fill half the ring, where the BPF side samples.
_GATHER_BYTES = 256 << 10
_GATHER_SECONDS = 0.002
_BUSY = 1 << 31
_DISCARD = 1 << 30
_LENGTH = ~(_BUSY | _DISCARD) & 0xFFFFFFFF
_HEADER = 8


def _max_entries(map_fd: int) -> int:
    # struct bpf_map_info: __u32 type, id, key_size, value_size, max_entries, ... (include/uapi/linux/bpf.h).
    buffer = ctypes.create_string_buffer(96)
    length = ctypes.c_uint32(len(buffer))
    if _libbpf.lib().bpf_obj_get_info_by_fd(map_fd, buffer, ctypes.byref(length)) != 0:
        raise last_errno_error("cannot read the BPF ring buffer's size")
    return int.from_bytes(buffer.raw[16:20], "little")


class _MappedRing:
    """The ring read through its own mappings (see the module's docstring)."""

    def __init__(self, map_fd: int) -> None:
        size = _max_entries(map_fd)
        if size <= 0 or size & (size - 1):
            raise BpfError(f"the BPF ring buffer's size {size} is not a power of two")
        page = mmap.PAGESIZE
        self._mask = size - 1
        try:
            self._consumer = mmap.mmap(
                map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0
            )
            self._producer = mmap.mmap(map_fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        except OSError as error:
            raise BpfError(f"cannot map the BPF ring buffer: {error.strerror}") from None
        self._data = memoryview(self._producer)[page:]
        self._words = self._data.cast("I")
        self._consumer_pos = memoryview(self._consumer).cast("B").cast("Q")
        self._producer_pos = memoryview(self._producer)[:8].cast("Q")
        self._epoll = select.epoll()
        self._epoll.register(map_fd, select.EPOLLIN)
        self._closed = False
        self._streaming = False  # the last poll found records

    def _take(self, limit: int) -> list[bytes]:
        """The committed records from consumer_pos on (at most about `limit` bytes), consumed."""
        blob, bounds = self._take_blob(limit)
        return [blob[first:last] for first, last in bounds]

    def _take_blob(self, limit: int) -> RecordBlob:
        """`_take`'s records as one copy of the ring and where each record is in it."""
        start = self._consumer_pos[0]
        end = self._producer_pos[0]
        if start >= end:
            return _EMPTY
        words = self._words  # the data as u32s: headers are 8-byte aligned
        base = start & self._mask
        # Offsets from `base`; never past base + one ring's size: the second mapping keeps records contiguous.
        offset = 0
        stop = min(end, start + limit) - start
        strided = self._take_strided(base, stop)
        if strided is not None:
            blob = self._data[base : base + len(strided) * strided.stride].tobytes()
            self._consumer_pos[0] = start + len(strided) * strided.stride
            return blob, strided
        bounds: list[tuple[int, int]] = []
        append = bounds.append
        while offset < stop:
            header = words[(base + offset) >> 2]
            if header & _BUSY:
                break
            length = header & _LENGTH
            if not header & _DISCARD:
                append((offset + _HEADER, offset + _HEADER + length))
            offset += (length + _HEADER + 7) & ~7
        if offset == 0:
            return _EMPTY
        # One copy of every committed record; only then is the space given back.
        blob = self._data[base : base + offset].tobytes()
        self._consumer_pos[0] = start + offset
        return blob, bounds

    def _take_strided(self, base: int, stop: int) -> StridedBounds | None:
        """The committed records from `base` on, when they are at least two of one size (a storm's): their
        headers, one stride apart, read in one strided slice and compared with the first one repeated; the
        longest run of equal ones (a BUSY or other-sized record ends it) by halving. None otherwise: the
        per-record walk then."""
        words = self._words
        header = words[base >> 2]
        if header & (_BUSY | _DISCARD):
            return None
        length = header & _LENGTH
        stride = (length + _HEADER + 7) & ~7
        most = -(-stop // stride)  # every record that starts before `stop`, as the walk takes them
        if most < 2:
            return None
        step = stride >> 2
        first = base >> 2
        heads = words[first : first + most * step : step].tobytes()
        expected = header.to_bytes(4, "little") * most
        count = most
        if heads != expected:
            low, high = 1, most  # heads[:4*low] matches, heads[:4*high] does not
            while high - low > 1:
                middle = (low + high) // 2
                if heads[: 4 * middle] == expected[: 4 * middle]:
                    low = middle
                else:
                    high = middle
            count = low
        if count < 2:
            return None
        return StridedBounds(_HEADER, stride, count, length)

    def poll(self, timeout_ms: int) -> list[bytes]:
        blob, bounds = self.poll_blob(timeout_ms)
        return [blob[first:last] for first, last in bounds]

    def poll_blob(self, timeout_ms: int) -> RecordBlob:
        if self._closed:
            return _EMPTY
        if self._streaming and timeout_ms and self._producer_pos[0] - self._consumer_pos[0] < _GATHER_BYTES:
            time.sleep(_GATHER_SECONDS if timeout_ms < 0 else min(_GATHER_SECONDS, timeout_ms / 1000))
        taken = self._take_blob(_MAX_BYTES)
        self._streaming = bool(taken[1])
        if taken[1]:
            return taken
        try:
            self._epoll.poll(timeout_ms / 1000 if timeout_ms >= 0 else -1)
        except InterruptedError:  # a signal (e.g. Ctrl-C): the caller's loop decides
            return _EMPTY
        return self._take_blob(_MAX_BYTES)

    def drain(self) -> list[bytes]:
        records: list[bytes] = []
        while not self._closed:
            batch = self._take(_MAX_BYTES)
            if not batch:
                break
            records.extend(batch)
        return records

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._epoll.close()
        self._words.release()
        self._data.release()
        self._consumer_pos.release()
        self._producer_pos.release()
        self._producer.close()
        self._consumer.close()


class _CallbackRing:
    """libbpf's ring_buffer__poll with a callback that only copies bytes (decoding happens in the caller, in
    bulk)."""

    def __init__(self, map_fd: int) -> None:
        self._lib = _libbpf.lib()
        self._pending: list[bytes] = []
        self._batch_full = False
        # Keep the callback object alive as long as libbpf may call it.
        self._callback = _libbpf.RingBufferCallback(self._on_record)
        with _libbpf.capture_messages() as messages:
            self._handle: int | None = self._lib.ring_buffer__new(map_fd, self._callback, None, None)
        if not self._handle:
            raise last_errno_error("cannot open the BPF ring buffer", messages)

    def _on_record(self, _ctx: int | None, data: int | None, size: int) -> int:
        self._pending.append(ctypes.string_at(data or 0, size))
        # libbpf keeps reading while the producer keeps writing; a negative return makes it store the consumer
        # position and return, so a storm never keeps us from the clock (progress, deadlines, Ctrl-C).
        if len(self._pending) >= _BATCH:
            self._batch_full = True
            return -1
        return 0

    def poll(self, timeout_ms: int) -> list[bytes]:
        if self._handle is None:
            return []
        result = self._lib.ring_buffer__poll(self._handle, timeout_ms)
        # EINTR is a signal (e.g. Ctrl-C), and our own -1 a full batch: neither is an error.
        if result < 0 and not self._batch_full and ctypes.get_errno() != errno.EINTR:
            raise last_errno_error("reading the BPF ring buffer failed")
        self._batch_full = False
        records, self._pending = self._pending, []
        return records

    def drain(self) -> list[bytes]:
        if self._handle is None:
            return []
        records: list[bytes] = []
        while True:
            self._lib.ring_buffer__consume(self._handle)
            self._batch_full = False
            if not self._pending:
                return records
            records.extend(self._pending)
            self._pending = []

    def close(self) -> None:
        if self._handle:
            self._lib.ring_buffer__free(self._handle)
        self._handle = None


_TSO = os.uname().machine == "x86_64"  # not the platform module: it is imported on the way to attaching


class StridedBounds(Sequence[tuple[int, int]]):
    """Where `number` records of `length` bytes are in a blob: the first at `first`, each `stride` bytes after
    the one before (a ring buffer's records of one size). A sequence of (first, last) like a list of them."""

    __slots__ = ("first", "length", "number", "stride")

    def __init__(self, first: int, stride: int, number: int, length: int) -> None:
        self.first = first
        self.stride = stride
        self.number = number
        self.length = length

    def __len__(self) -> int:
        return self.number

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, int]]: ...

    def __getitem__(self, index: int | slice) -> tuple[int, int] | list[tuple[int, int]]:
        if isinstance(index, slice):
            return [self[at] for at in range(*index.indices(self.number))]
        if index < 0:
            index += self.number
        if not 0 <= index < self.number:
            raise IndexError("record index out of range")
        at = self.first + index * self.stride
        return at, at + self.length

    def __iter__(self) -> Iterator[tuple[int, int]]:
        starts = range(self.first, self.first + self.number * self.stride, self.stride)
        return zip(
            starts, range(self.first + self.length, starts.stop + self.length, self.stride), strict=True
        )


# Records as one bytes object and where each one is in it: (blob, [(first, last), ...]).
RecordBlob = tuple[bytes, Sequence[tuple[int, int]]]
_EMPTY: RecordBlob = (b"", [])


def joined_records(records: list[bytes]) -> RecordBlob:
    """Separate records as a RecordBlob."""
    bounds: list[tuple[int, int]] = []
    end = 0
    for record in records:
        bounds.append((end, end + len(record)))
        end += len(record)
    return b"".join(records), bounds


class RingBuffer:
    """A BPF ring buffer map's records, in batches: the mapped reader on x86-64, libbpf's callback elsewhere
    (or with `mapped=False`)."""

    def __init__(self, map_fd: int, *, mapped: bool | None = None) -> None:
        use_mapping = _TSO if mapped is None else mapped
        self._ring: _MappedRing | _CallbackRing = (
            _MappedRing(map_fd) if use_mapping else _CallbackRing(map_fd)
        )

    @property
    def mapped(self) -> bool:
        return isinstance(self._ring, _MappedRing)

    def poll(self, timeout_ms: int) -> list[bytes]:
        """Wait up to timeout_ms for records; returns those that arrived (possibly none)."""
        return self._ring.poll(timeout_ms)

    def poll_blob(self, timeout_ms: int) -> RecordBlob:
        """`poll`'s records without cutting them apart: the mapped reader's one copy of the ring, and where
        each record is in it (a consumer that compares records in place saves a copy of each)."""
        if isinstance(self._ring, _MappedRing):
            return self._ring.poll_blob(timeout_ms)
        return joined_records(self._ring.poll(timeout_ms))

    def drain(self) -> list[bytes]:
        """Everything still queued, without waiting (used at exit so nothing produced is left unread)."""
        return self._ring.drain()

    def close(self) -> None:
        self._ring.close()
