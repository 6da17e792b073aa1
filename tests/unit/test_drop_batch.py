"""A DropBatch (one decode, enrichment and JSON encoding per kind of drop) gives exactly the plain path's
records and lines: decode every record, enrich the batch, `encode_line(record.to_json())` each."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from netsleuth.bpf.ringbuf import StridedBounds
from netsleuth.diagnostics.drops.batch import DropBatcher, _one_kind
from netsleuth.diagnostics.drops.decode import decode_records
from netsleuth.diagnostics.drops.enrich import DropEnricher
from netsleuth.render.jsonl import JsonLinesWriter, encode_line, record_blob, record_lines
from tests.unit.test_drops_decode import enricher, make_event
from tests.unit.test_drops_fast_path import random_record

FRAMES = (0xFFFFFFFF81300150, 0xFFFFFFFF81200099, 0xFFFFFFFF81100410)


def with_time(record: bytes, time_ns: int) -> bytes:
    return time_ns.to_bytes(8, "little") + record[8:]


def batcher(enrich: DropEnricher) -> DropBatcher:
    return DropBatcher(decode_records, enrich.enrich_many, lambda: enrich.context.wall_offset_ns)


def storm(rng: random.Random, kinds: list[bytes], count: int) -> list[bytes]:
    """`count` drops of the given kinds in random order, each at its own time (some a second apart, some
    on microsecond and rounding boundaries)."""
    start = 1_700_000_000_000_000_000
    times = [
        start + rng.choice((rng.getrandbits(40), 999_999_500 + rng.getrandbits(10), 500))
        for _ in range(count)
    ]
    return [with_time(rng.choice(kinds), time_ns) for time_ns in times]


def check_same(enrich: DropEnricher, records: list[bytes]) -> None:
    plain = enrich.enrich_many(decode_records(records))
    batch = batcher(enrich).batch(records)
    assert len(batch) == len(plain)
    assert list(batch) == plain
    assert batch[-1] == plain[-1] and batch[1:3] == plain[1:3]
    lines = [encode_line(record.to_json()) for record in plain]
    assert batch.json_lines() == lines
    assert batch.json_blob() == b"".join(lines)
    assert list(record_lines(batch)) == lines and record_blob(batch) == b"".join(lines)


def test_storm_of_few_kinds_equals_the_plain_path(tmp_path: Path) -> None:
    rng = random.Random(5)
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        import os

        inode = os.fstat(receiver.fileno()).st_ino
        kinds = [
            make_event(in_task=1, pid=1234, comm=b"sender", frames=FRAMES),
            make_event(in_task=0, pid=99, comm=b"innocent", frames=FRAMES),
            make_event(in_task=0, sock_ino=inode),
            make_event(in_task=1, pid=1234, comm=b"sender", frames=FRAMES, packet=b"\x45" + b"\0" * 19),
        ]
        check_same(enricher(tmp_path), storm(rng, kinds, 3000))
    finally:
        receiver.close()


def test_random_records_equal_the_plain_path(tmp_path: Path) -> None:
    rng = random.Random(13)
    kinds = [random_record(rng) for _ in range(40)]
    check_same(enricher(tmp_path), storm(rng, kinds, 2000))


def test_an_empty_batch_writes_nothing(tmp_path: Path) -> None:
    batch = batcher(enricher(tmp_path)).batch([])
    assert len(batch) == 0 and not batch and batch.json_blob() == b"" and batch.json_lines() == []


def test_writer_takes_a_batch_or_plain_records(tmp_path: Path) -> None:
    import io

    enrich = enricher(tmp_path)
    records = storm(random.Random(1), [make_event(in_task=1, pid=7, comm=b"x")], 50)
    plain = enrich.enrich_many(decode_records(records))
    outputs = []
    for given in (batcher(enrich).batch(records), plain):
        stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
        JsonLinesWriter(stream).write_records(given)
        stream.flush()
        outputs.append(stream.buffer.getvalue())
    assert outputs[0] == outputs[1] == b"".join(encode_line(record.to_json()) for record in plain)


def strided(records: list[bytes], padding: bytes) -> tuple[bytes, StridedBounds]:
    """Records of one size as the ring buffer hands them over: each after an 8-byte header (its length and
    its page offset, which differs), padded to 8 bytes with whatever the ring held there before (`padding`,
    cycled)."""
    (length,) = {len(record) for record in records}
    stride = (length + 8 + 7) & ~7
    pad = stride - 8 - length
    blob = b"".join(
        length.to_bytes(4, "little")
        + (index * stride // 8).to_bytes(4, "little")  # the header's offset field, different in each
        + record
        + padding[index % len(padding) :][:pad].ljust(pad)
        for index, record in enumerate(records)
    )
    return blob, StridedBounds(8, stride, len(records), length)


def test_a_strided_storm_of_one_kind_equals_the_plain_path(tmp_path: Path) -> None:
    # One kind, read whole (no step per record), with stale bytes in the ring's padding; then the same with
    # two kinds, where the per-record path takes over.
    rng = random.Random(7)
    enrich = enricher(tmp_path)
    one = make_event(in_task=1, pid=1234, comm=b"sender", frames=FRAMES)
    other = make_event(in_task=1, pid=4321, comm=b"other", frames=FRAMES)
    for kinds in ([one], [one, other]):
        records = storm(rng, kinds, 2500)
        blob, bounds = strided(records, padding=bytes(range(1, 250)))
        assert [blob[first:last] for first, last in bounds] == records
        plain = enrich.enrich_many(decode_records(records))
        batch = batcher(enrich).batch_blob(blob, bounds)
        assert list(batch) == plain
        lines = [encode_line(record.to_json()) for record in plain]
        assert batch.json_lines() == lines and batch.json_blob() == b"".join(lines)


def test_one_kind_is_told_from_the_bytes_after_the_time() -> None:
    record = bytes(range(45))  # padded to 56 in the ring: 3 stale bytes after each record
    same = [with_time(record, 10**18 + index) for index in range(5)]
    blob, bounds = strided(same, padding=bytes(range(1, 200)))
    assert bounds.stride == 56
    assert _one_kind(blob, bounds) == [10**18 + index for index in range(5)]
    changed = [*same[:3], same[3][:-1] + b"\x00", same[4]]
    assert _one_kind(*strided(changed, padding=b"\xff")) is None
