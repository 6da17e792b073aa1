"""A batch of drops enriched once per kind of drop, and its JSON lines built from one encoding per kind.

A storm is thousands of drops that differ only in their timestamp: same reason, location, namespace, packet
tuple, device, CPU, task. Everything a DropRecord holds besides `time` comes from the record's bytes after
its first field (`time_ns`, drop_event's first 8 bytes), and enriching a batch is a function of those bytes
(the enricher's memos - owner, netns name, firewall verdict - are per batch, the rest per run). So the raw
records are grouped by those bytes, each group's first record is decoded and enriched (one enrich_many call
for the batch's group representatives, so the memos are shared as before), and every other record of the
group is that record with its own time. The JSON line of a group is encoded once (the typed record's own
encoding, netsleuth.spec.records) and split around its time text: each drop's line is prefix + its time +
suffix, the same bytes `encode(record)` gives (tests/unit/test_drop_batch.py checks both against the plain
path). Records are only built when asked for (a text view, a pcap sink, conn); the JSON path never builds
them.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, overload

import msgspec

from netsleuth.bpf.ringbuf import StridedBounds
from netsleuth.diagnostics.drops.records import DropRecord
from netsleuth.spec.records import WallTime, encode, iso_second

if TYPE_CHECKING:
    from netsleuth.diagnostics.drops.decode import RawDrop

__all__ = ["DropBatch", "DropBatcher"]

_TIME = struct.Struct("<Q").unpack_from  # drop_event.time_ns, the record's first field
_TIME_SIZE = 8


class _Kind:
    """One group of a batch: its enriched first drop, its captured packet bytes (the same for every drop of
    the group: they are part of the record after its time) and its JSON line (UTF-8) cut around the time
    text (`head` up to the opening quote, `tail` from the time zone on); filled in once the batch's kinds
    are enriched."""

    __slots__ = ("head", "packet", "record", "tail")

    def __init__(self) -> None:
        self.record: DropRecord | None = None
        self.packet = b""
        self.head: bytes | None = None  # None: the line could not be cut (never seen; encoded whole then)
        self.tail = b""


class DropBatch(Sequence["DropRecord"]):
    """The records of one poll: a Sequence of DropRecords (built on access) with `json_lines`/`json_blob`."""

    def __init__(
        self, kinds: list[_Kind], members: list[_Kind], times: list[int], wall_offset_ns: int
    ) -> None:
        self._kinds = kinds
        self._members = members  # per drop: its group
        self._times = times  # per drop: kernel monotonic ns
        self._offset = wall_offset_ns

    def __len__(self) -> int:
        return len(self._times)

    @overload
    def __getitem__(self, index: int) -> DropRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[DropRecord]: ...

    def __getitem__(self, index: int | slice) -> DropRecord | list[DropRecord]:
        if isinstance(index, slice):
            return [self._record(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("drop batch index out of range")
        return self._record(index)

    def __iter__(self) -> Iterator[DropRecord]:
        return (self._record(i) for i in range(len(self._times)))

    def select(self, keep: Callable[[DropRecord, int], bool], since_wall_ns: int | None = None) -> DropBatch:
        """The drops from `since_wall_ns` on (wall clock; all when None) whose kind `keep(its first record,
        how many of its drops are left)` accepts: a scope decided once per kind (fleet sessions), its lines
        still one encoding per kind. A drop's wall time is its time text's (to the microsecond), as a reader
        of its line takes it."""
        members, times, offset = self._members, self._times, self._offset
        if since_wall_ns is not None and times and min(times) + offset < since_wall_ns:
            chosen = [
                (kind, time_ns)
                for kind, time_ns in zip(members, times, strict=True)
                if _text_wall_ns(time_ns, offset) >= since_wall_ns
            ]
            members, times = [kind for kind, _ in chosen], [time_ns for _, time_ns in chosen]
        counts: dict[int, int] = {}
        for kind in members:
            counts[id(kind)] = counts.get(id(kind), 0) + 1
        kept = [
            kind
            for kind in self._kinds
            if id(kind) in counts and kind.record is not None and keep(kind.record, counts[id(kind)])
        ]
        if len(kept) < len(counts):
            ids = {id(kind) for kind in kept}
            chosen = [
                (kind, time_ns) for kind, time_ns in zip(members, times, strict=True) if id(kind) in ids
            ]
            members, times = [kind for kind, _ in chosen], [time_ns for _, time_ns in chosen]
        return DropBatch(kept, members, times, self._offset)

    def captures(self) -> Iterator[tuple[DropRecord, bytes]]:
        """Each drop whose packet bytes were captured (a run with a snaplen: --pcap), with them."""
        for index, kind in enumerate(self._members):
            if kind.packet:
                yield self._record(index), kind.packet

    def _record(self, index: int) -> DropRecord:
        first = self._members[index].record
        assert first is not None  # every kind is enriched before the batch is made
        return _replace(first, time=WallTime((self._times[index] + self._offset) / 1e9))

    def _line_values(self) -> list[object] | None:
        """Per drop, what `_LINE` takes: its kind's head, its second's head, its microseconds and its kind's
        tail. The microseconds are IsoTimes' (the float seconds' fraction rounded half to even, carried into
        the next second), with `seconds - int(seconds)` for math.modf's fraction: the same, exactly, for any
        time after 1970. None when a kind has no cut line or a time is before 1971 (the plain path then).
        Each step is one `map` over the batch (the same float operations, run by C: no Python step per
        drop), and the four columns go into the list by strided slice assignment."""
        times, offset, count = self._times, self._offset, len(self._times)
        if any(kind.head is None for kind in self._kinds) or (times and min(times) + offset < _ONE_SECOND):
            return None
        if not count:
            return []
        seconds = list(map(operator.truediv, map(operator.add, times, repeat(offset)), repeat(1e9)))
        whole = list(map(int, seconds))
        micros = list(map(round, map(operator.mul, map(operator.sub, seconds, whole), repeat(1e6))))
        if micros and max(micros) >= 1_000_000:  # rounded up into the next second
            for index, value in enumerate(micros):
                if value >= 1_000_000:
                    micros[index] = value - 1_000_000
                    whole[index] += 1
        heads: list[bytes | None] = list(map(_SECOND_BYTES.get, whole))
        if None in heads:
            heads = [head or _second_bytes(second) for head, second in zip(heads, whole, strict=True)]
        values: list[object] = [None] * (4 * count)
        members = self._members
        values[0::4] = map(_HEAD, members) if len(self._kinds) > 1 else repeat(self._kinds[0].head, count)
        values[1::4] = heads
        values[2::4] = micros
        values[3::4] = map(_TAIL, members) if len(self._kinds) > 1 else repeat(self._kinds[0].tail, count)
        return values

    def json_lines(self) -> list[bytes]:
        """One newline-terminated JSON line per drop (as `encode(record)` and a newline)."""
        values = self._line_values()
        if values is None:
            return [encode(self._record(index)) + b"\n" for index in range(len(self))]
        line = _LINE
        return [line % tuple(values[at : at + 4]) for at in range(0, len(values), 4)]

    def json_blob(self) -> bytes:
        """Every line of `json_lines`, joined: what a file or pipe gets, made by one %-format of the whole
        batch."""
        values = self._line_values()
        if values is None:
            return b"".join(self.json_lines())
        return (_LINE * len(self._times)) % tuple(values)


_replace = msgspec.structs.replace
_HEAD = operator.attrgetter("head")
_TAIL = operator.attrgetter("tail")
_ZONE = "+00:00"
_LINE = b"%s%s%06d%s"  # a drop's line: its kind's head, its second's head, its microseconds, its kind's tail
_ONE_SECOND = 1_000_000_000
_TIME_KEY = '"time":"'
_SECOND_BYTES: dict[int, bytes] = {}  # second -> b"YYYY-MM-DDTHH:MM:SS."


def _text_wall_ns(time_ns: int, offset: int) -> int:
    """The wall time a drop's ISO text says, in ns (its microseconds as `_line_values` rounds them)."""
    seconds = (time_ns + offset) / 1e9
    second = int(seconds)
    return (second * 1_000_000 + round((seconds - second) * 1e6)) * 1000


def _second_bytes(second: int) -> bytes:
    """A second's head as UTF-8, from the time text's one per-second cache (spec.records.iso_second, what
    WallTime.iso uses), kept here as bytes for `_line_values`' dict lookup per drop."""
    if len(_SECOND_BYTES) >= 4096:
        _SECOND_BYTES.clear()
    head = _SECOND_BYTES[second] = f"{iso_second(second)}.".encode()
    return head


def _cut(kind: _Kind, line: bytes, time_text: str) -> None:
    """Fill in the kind's head and tail: the line's text before its time value and from the value's time
    zone on. `time` is the record's third key, after `type` and `v`, so its first `"time":"<text>"` is
    the one."""
    time_bytes = time_text.encode()
    at = line.find(b'"time":"' + time_bytes + b'"')
    if at < 0 or not time_text.endswith(_ZONE):
        return
    start = at + len(_TIME_KEY)
    kind.head, kind.tail = line[:start], line[start + len(time_bytes) - len(_ZONE) :]


def _one_kind(blob: bytes, bounds: StridedBounds) -> list[int] | None:
    """The records' times when every record in `blob` is one kind of drop (the bytes after the time the
    same in all: a storm's poll), else None. Told by C-level passes over the blob, not a Python step per
    record: the times read as one strided slice of it as u64s, then a copy with what differs between
    records of one kind zeroed - each one's ring header before it (its page offset differs; the ring read
    only records of one length), its time and the ring's alignment padding after it, which the kernel does
    not clear - compared with its first record repeated."""
    stride, first, length, count = bounds.stride, bounds.first, bounds.length, len(bounds)
    if count < 2 or stride % 8 or first % 8 or length < _TIME_SIZE or len(blob) != count * stride:
        return None
    times: list[int] = memoryview(blob).cast("Q")[first >> 3 :: stride >> 3].tolist()
    masked = bytearray(blob)
    zeros = bytes(count)
    for at in (*range(first + _TIME_SIZE), *range(first + length, stride)):
        masked[at::stride] = zeros
    if masked != masked[:stride] * count:
        return None
    return times


class DropBatcher:
    """Turns a poll's raw ring-buffer records into a DropBatch, with the run's decoder and enricher."""

    def __init__(
        self,
        decode: Callable[[list[bytes]], list[RawDrop]],
        enrich: Callable[[Sequence[RawDrop]], list[DropRecord]],
        wall_offset_ns: Callable[[], int],
    ) -> None:
        self._decode = decode
        self._enrich = enrich
        self._wall_offset_ns = wall_offset_ns

    def batch(self, records: Sequence[bytes]) -> DropBatch:
        """The batch of these records (as `batch_blob` of them joined)."""
        from netsleuth.bpf.ringbuf import joined_records

        return self.batch_blob(*joined_records(list(records)))

    def batch_blob(self, blob: bytes, bounds: Sequence[tuple[int, int]]) -> DropBatch:
        """The batch of the records `blob[first:last]` for each (first, last) of `bounds` (as the ring
        buffer hands them over: one copy of every record, netsleuth.bpf.ringbuf). A storm sends one kind
        after another of the same: a record whose bytes after its time are the last one's is told by one
        comparison in place, and only the others are cut out and looked up."""
        index: dict[bytes, _Kind] = {}
        firsts: list[bytes] = []
        kinds: list[_Kind] = []
        members: list[_Kind] = []
        times: list[int] = []
        one_kind = _one_kind(blob, bounds) if isinstance(bounds, StridedBounds) else None
        if one_kind is not None:
            kind = _Kind()
            kinds.append(kind)
            firsts.append(blob[bounds[0][0] : bounds[0][1]])
            members = [kind] * len(bounds)
            times = one_kind
            bounds = ()
        add_member, add_time, time_of, same = members.append, times.append, _TIME, blob.startswith
        kind = _Kind()
        key, size = b"", -1  # the last record's bytes after its time, and its size
        for first, last in bounds:
            add_time(time_of(blob, first)[0])
            if last - first == size and same(key, first + _TIME_SIZE):
                add_member(kind)
                continue
            key, size = blob[first + _TIME_SIZE : last], last - first
            found = index.get(key)
            if found is None:
                found = index[key] = _Kind()
                kinds.append(found)
                firsts.append(blob[first:last])
            kind = found
            add_member(kind)
        # Read before enriching, as enrich_many reads it: every drop's time, its group's first included, is
        # then computed with the same offset.
        offset = self._wall_offset_ns()
        # One decode and one enrich_many for the kinds: the enricher's per-batch memos see them together.
        raws = self._decode(firsts) if firsts else []
        enriched = self._enrich(raws) if raws else []
        for each, raw, record in zip(kinds, raws, enriched, strict=True):
            each.record = record
            each.packet = raw.packet_bytes
            _cut(each, encode(record) + b"\n", record.time.iso())
        return DropBatch(kinds, members, times, offset)
