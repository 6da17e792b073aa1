"""The drops consumer's fast path gives exactly what the plain path gives: batch decoding against ctypes
decoding, the per-second time text against datetime, orjson lines against the standard library's, batch
enrichment against one record at a time, and the firewall matcher's memo against deciding again."""

from __future__ import annotations

import ctypes
import io
import json
import random
import socket
import time
from pathlib import Path

import pytest

from netsleuth._generated.drops_abi import DropEvent, DropGroupValue
from netsleuth.diagnostics.drops.decode import EVENT_SIZE, decode_event, decode_records
from netsleuth.diagnostics.iso_times import IsoTimes, iso_time
from netsleuth.diagnostics.struct_layout import flat_struct
from netsleuth.firewall import FirewallMatcher
from netsleuth.render.jsonl import JsonLinesWriter, encode_line
from tests.unit.test_drops_decode import enricher, make_event
from tests.unit.test_firewall_matcher import Clock, Reader, stateless_listing, udp

_STDLIB = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def ctypes_decode(record: bytes):  # type: ignore[no-untyped-def]
    """The decoding the batch decoder replaced: ctypes attribute reads, one int.from_bytes per frame."""
    event = DropEvent.from_buffer_copy(record[:EVENT_SIZE])
    frames_end = EVENT_SIZE + 8 * event.nr_frames
    frames = tuple(int.from_bytes(record[i : i + 8], "little") for i in range(EVENT_SIZE, frames_end, 8))
    return decode_event(event, frames, record[frames_end : frames_end + event.caplen])


def random_record(rng: random.Random) -> bytes:
    event = DropEvent()
    for name, kind in (
        ("time_ns", 64),
        ("location", 64),
        ("sock_ino", 32),
        ("reason", 8),
        ("netns", 32),
        ("pid", 22),
        ("tid", 22),
        ("ifindex", 16),
        ("skb_len", 16),
        ("cpu", 3),
    ):
        setattr(event, name, rng.getrandbits(kind))
    event.in_task, event.kthread = rng.getrandbits(1), rng.getrandbits(1)
    event.sk_state = rng.choice((0xFF, 1, 10))
    event.comm = bytes(rng.choice(b"abcxyz\xff") for _ in range(rng.randint(0, 15)))
    event.ifname = rng.choice((b"", b"veth0", b"eth\xfe1"))
    family = rng.choice((0, 4, 6))
    proto = rng.choice((1, 6, 17, 58, 47))
    tup = event.tuple
    tup.family, tup.l4proto, tup.has_ports = family, proto, rng.getrandbits(1)
    tup.sport, tup.dport, tup.tcp_flags = rng.getrandbits(16), rng.getrandbits(16), rng.getrandbits(8)
    tup.l3_len = rng.choice((0, rng.getrandbits(12)))
    ctypes.memmove(tup.saddr, rng.randbytes(16), 16)
    ctypes.memmove(tup.daddr, rng.randbytes(16), 16)
    frames = [rng.getrandbits(64) for _ in range(rng.choice((0, 1, 15, 32)))]
    packet = rng.randbytes(rng.choice((0, 20, 256)))
    event.nr_frames, event.caplen = len(frames), len(packet)
    return bytes(event) + b"".join(frame.to_bytes(8, "little") for frame in frames) + packet


def test_batch_decoding_equals_ctypes_decoding() -> None:
    rng = random.Random(13)
    records = [random_record(rng) for _ in range(3000)]
    records += records[:500]  # repeats: the caches must give the same answer again
    assert decode_records(records) == [ctypes_decode(record) for record in records]


def test_flat_layout_follows_the_generated_mirror() -> None:
    flat = flat_struct(DropGroupValue)
    assert flat.size == ctypes.sizeof(DropGroupValue)
    value = DropGroupValue()
    value.count, value.bytes = 7, 99
    value.example.tuple.sport = 4242
    value.example.comm = b"curl"
    value.example_frames[0], value.example_frames[11] = 0xFFFF0001, 0xFFFF0012
    unpacked = flat.unpack_from(bytes(value))
    assert unpacked[flat.index["count"]] == 7 and unpacked[flat.index["bytes"]] == 99
    assert unpacked[flat.index["example.tuple.sport"]] == 4242
    assert unpacked[flat.index["example.comm"]].rstrip(b"\0") == b"curl"
    frames = flat.index["example_frames"]
    assert unpacked[frames] == 0xFFFF0001 and unpacked[frames + 11] == 0xFFFF0012
    assert len(unpacked) == frames + 12
    assert flat.offset["example"] == DropGroupValue.example.offset


def test_iso_times_equal_datetime() -> None:
    rng = random.Random(5)
    now = time.time()
    stamps = [now + rng.uniform(-1e6, 1e6) for _ in range(20000)]
    stamps += [now + k * 1e-6 + 0.5e-6 for k in range(20000)]  # half-microsecond ties round to even
    stamps += [1763890000.9999995, 1763890000.0000005, 1763890000.0, 0.0]
    times = IsoTimes(limit=64)  # small: the cache is cleared and refilled on the way
    assert [times(stamp) for stamp in stamps] == [iso_time(stamp) for stamp in stamps]


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1e-5, "b": 6.25e-06, "c": 1e-9, "d": 0.0001, "e": 1e16, "f": -0.0, "g": 123.456},
        {"big": 2**70, "neg": -(2**63), "u64": 2**64 - 1},
        {"text": 'é\u2028\x01\x7f"\\ e-5 0.00001', "list": [1, (2, 3), None, True]},
        {1: "non-string key", "nested": {"x": [{}]}},
    ],
)
def test_lines_equal_the_standard_library(value: dict[str, object]) -> None:
    assert encode_line(value) == (_STDLIB(value) + "\n").encode()


def test_floats_equal_the_standard_library() -> None:
    rng = random.Random(9)
    values = [10 ** rng.uniform(-320, 307) * rng.choice((1, -1)) for _ in range(20000)]
    values += [round(rng.uniform(0, 100), 3) for _ in range(2000)]
    assert [encode_line({"x": v}) for v in values] == [(_STDLIB({"x": v}) + "\n").encode() for v in values]


def test_unserializable_is_the_standard_librarys_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode_line({"when": object()})


def test_writer_text_and_binary_streams_agree() -> None:
    objects = [{"type": "drop", "n": n, "name": "é"} for n in range(5)]
    text = io.StringIO()
    text_writer = JsonLinesWriter(text)
    for obj in objects:
        text_writer.write(obj)
    raw = io.BytesIO()
    wrapper = io.TextIOWrapper(raw, encoding="utf-8")
    wrapper.write("before\n")  # text written first stays first
    writer = JsonLinesWriter(wrapper)
    for obj in objects:
        writer.write(obj)
    writer.flush()
    assert raw.getvalue().decode() == "before\n" + text.getvalue()
    assert text.getvalue() == "".join(_STDLIB(obj) + "\n" for obj in objects)


def test_batch_enrichment_equals_one_at_a_time(tmp_path: Path) -> None:
    frames = (0xFFFFFFFF81300150, 0xFFFFFFFF81200099, 0xFFFFFFFF81100410)
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        import os

        inode = os.fstat(receiver.fileno()).st_ino
        records = [
            make_event(in_task=1, pid=1234, comm=b"sender", frames=frames),
            make_event(in_task=0, pid=99, comm=b"innocent", frames=frames),
            make_event(in_task=0, sock_ino=inode),
            make_event(in_task=1, pid=1234, comm=b"sender", frames=frames, packet=b"\x45" + b"\0" * 19),
        ] * 3
        raws = decode_records(records)
        enrich = enricher(tmp_path)  # one context: the same clock offset for both
        batch = enrich.enrich_many(raws)
        one_by_one = [enrich.enrich(raw) for raw in raws]
    finally:
        receiver.close()
    assert batch == one_by_one
    assert [record.to_json() for record in batch] == [record.to_json() for record in one_by_one]
    assert batch[2].owner == "socket"


def test_the_matchers_memo_is_dropped_with_its_reading() -> None:
    # The start and the first reading show no counter growth: only "possible". Within that reading the
    # verdict is remembered (no new reading); once the reading is older than max_age the rules are read
    # again, the owner rule's counter has grown, and the verdict is decided again ("counters").
    clock = Clock()
    reader = Reader(clock, ("before", "before", "after"))
    matcher = FirewallMatcher(None, reader=reader, chain_listing=stateless_listing, clock=clock)
    packet = udp("198.18.0.1", "198.18.0.50", 5000)
    first = matcher.explain(packet, "output", None, "ext0")
    reads = reader.reads
    assert first is not None and first.confidence == "possible"
    assert matcher.explain(packet, "output", None, "ext0") is first and reader.reads == reads
    clock.now += 0.6
    later = matcher.explain(packet, "output", None, "ext0")
    assert reader.reads > reads
    assert later is not None and later.confidence == "counters"
    assert later.rule == "-A OUTPUT -p udp -m owner --uid-owner 4242 -j DROP"
