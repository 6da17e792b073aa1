"""A batch of drops enriched once per kind of drop, and its JSON lines built from one encoding per kind.

A storm is thousands of drops that differ only in their timestamp: same reason, location, namespace, packet
tuple, device, CPU, task. Everything a DropRecord holds besides `time` comes from the record's bytes after
its first field (`time_ns`, drop_event's first 8 bytes), and enriching a batch is a function of those bytes
(the enricher's memos - owner, netns name, firewall verdict - are per batch, the rest per run). So the raw
records are grouped by those bytes, each group's first record is decoded and enriched (one enrich_many call
for the batch's group representatives, so the memos are shared as before), and every other record of the
group is that record with its own time. The JSON line of a group is encoded once and split around its time
text: each drop's line is prefix + its time + suffix, the same bytes `encode_line(record.to_json())` gives
(tests/unit/test_drop_batch.py checks both against the plain path). Records are only built when asked for
(a text view, a pcap sink); the JSON path never builds them.
"""

from __future__ import annotations

import datetime
import math
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, overload

from netsleuth.diagnostics.iso_times import IsoTimes
from netsleuth.diagnostics.struct_layout import frozen_record

if TYPE_CHECKING:
    from netsleuth.diagnostics.drops_decode import RawDrop
    from netsleuth.diagnostics.drops_enrich import DropRecord

__all__ = ["DropBatch", "DropBatcher"]

_TIME = struct.Struct("<Q").unpack_from  # drop_event.time_ns, the record's first field
_TIME_SIZE = 8


class _Kind:
    """One group of a batch: its enriched first drop and its JSON line cut around the time text (`head` up
    to the opening quote, `tail` from the time zone on); filled in once the batch's kinds are enriched."""

    __slots__ = ("head", "record", "tail")

    def __init__(self) -> None:
        self.record: DropRecord | None = None
        self.head: str | None = None  # None: the line could not be cut (never seen; encoded whole then)
        self.tail = ""


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

    def _record(self, index: int) -> DropRecord:
        from netsleuth.diagnostics.drops_enrich import DropRecord

        first = self._members[index].record
        assert first is not None  # every kind is enriched before the batch is made
        values = dict(first.__dict__)
        values["time"] = (self._times[index] + self._offset) / 1e9
        # The group's netfilter dict is per record in the plain path too (a copy each).
        if values.get("netfilter") is not None:
            values["netfilter"] = dict(values["netfilter"])
        return frozen_record(DropRecord, values)

    def _time_texts(self) -> list[str]:
        """Each drop's time text up to its microseconds (`_ISO` of its time without the time zone)."""
        texts: list[str] = []
        append = texts.append
        offset = self._offset
        heads = _SECOND_HEADS
        for time_ns in self._times:
            # IsoTimes' arithmetic, inline (a call per drop was most of the line's cost).
            seconds = (time_ns + offset) / 1e9
            fraction, whole = _modf(seconds)
            if fraction < 0:  # before 1970: never a kernel timestamp
                append(_ISO(seconds)[: -len(_ZONE)])
                continue
            micros = round(fraction * 1e6)
            second = int(whole)
            if micros >= 1_000_000:
                micros -= 1_000_000
                second += 1
            head = heads.get(second)
            if head is None:
                head = _second_head(second)
            append(f"{head}{micros:06d}")
        return texts

    def json_lines(self) -> list[bytes]:
        """One newline-terminated JSON line per drop (as `encode_line(record.to_json())`)."""
        from netsleuth.render.jsonl import encode_line

        lines: list[bytes] = []
        append = lines.append
        for index, (kind, text) in enumerate(zip(self._members, self._time_texts(), strict=True)):
            if kind.head is None:
                append(encode_line(self._record(index).to_json()))
            else:
                append((kind.head + text + kind.tail).encode())
        return lines

    def json_blob(self) -> bytes:
        """Every line of `json_lines`, joined: what a file or pipe gets."""
        if any(kind.head is None for kind in self._kinds):
            return b"".join(self.json_lines())
        parts: list[str] = []
        extend = parts.extend
        for kind, text in zip(self._members, self._time_texts(), strict=True):
            extend((kind.head, text, kind.tail))  # type: ignore[arg-type]
        return "".join(parts).encode()


_ISO = IsoTimes()  # the same text as drops_enrich's iso time (tests/unit/test_drops_fast_path.py)
_ZONE = "+00:00"
_TIME_KEY = '"time":"'
_modf = math.modf
_SECOND_HEADS: dict[int, str] = {}  # second -> "YYYY-MM-DDTHH:MM:SS."


def _second_head(second: int) -> str:
    if len(_SECOND_HEADS) >= 4096:
        _SECOND_HEADS.clear()
    text = datetime.datetime.fromtimestamp(second, datetime.UTC).isoformat(timespec="seconds")
    head = _SECOND_HEADS[second] = text[: -len(_ZONE)] + "."
    return head


def _cut(kind: _Kind, line: bytes, time_text: str) -> None:
    """Fill in the kind's head and tail: the line's text before its time value and from the value's time
    zone on. `time` is the record's third key, after `type` and `v`, so its first `"time":"<text>"` is
    the one."""
    text = line.decode()
    at = text.find(f'{_TIME_KEY}{time_text}"')
    if at < 0 or not time_text.endswith(_ZONE):
        return
    start = at + len(_TIME_KEY)
    kind.head, kind.tail = text[:start], text[start + len(time_text) - len(_ZONE) :]


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

    def batch(self, records: list[bytes]) -> DropBatch:
        from netsleuth.render.jsonl import encode_line

        index: dict[bytes, _Kind] = {}
        firsts: list[bytes] = []
        kinds: list[_Kind] = []
        members: list[_Kind] = []
        times: list[int] = []
        add_member, add_time, time_of = members.append, times.append, _TIME
        for record in records:
            key = record[_TIME_SIZE:]
            kind = index.get(key)
            if kind is None:
                kind = index[key] = _Kind()
                kinds.append(kind)
                firsts.append(record)
            add_member(kind)
            add_time(time_of(record)[0])
        # Read before enriching, as enrich_many reads it: every drop's time, its group's first included, is
        # then computed with the same offset.
        offset = self._wall_offset_ns()
        # One decode and one enrich_many for the kinds: the enricher's per-batch memos see them together.
        enriched = self._enrich(self._decode(firsts)) if firsts else []
        for kind, first in zip(kinds, enriched, strict=True):
            kind.record = first
            _cut(kind, encode_line(first.to_json()), _ISO(first.time))
        return DropBatch(kinds, members, times, offset)
