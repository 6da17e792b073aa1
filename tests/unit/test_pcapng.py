"""PcapngWriter: real IPv4/IPv6 UDP packets (with valid checksums) written with comments, then read back by
tshark and by a small independent block parser that checks the layout rules of draft-ietf-opsawg-pcapng."""

from __future__ import annotations

import io
import ipaddress
import json
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from netsleuth.diagnostics.drops.pcapng import LINKTYPE_ETHERNET, LINKTYPE_RAW, PcapngWriter
from netsleuth.errors import UsageError

TSHARK = shutil.which("tshark")


def _checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _udp(pseudo_header: bytes, sport: int, dport: int, payload: bytes) -> bytes:
    length = 8 + len(payload)
    header = struct.pack("!HHHH", sport, dport, length, 0)
    checksum = _checksum(pseudo_header + header + payload) or 0xFFFF
    return struct.pack("!HHHH", sport, dport, length, checksum) + payload


def ipv4_udp(src: str, dst: str, sport: int, dport: int, payload: bytes) -> bytes:
    source, destination = ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed
    udp = _udp(source + destination + struct.pack("!BBH", 0, 17, 8 + len(payload)), sport, dport, payload)
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0x1234, 0x4000, 64, 17, 0, source, destination
    )
    return header[:10] + struct.pack("!H", _checksum(header)) + header[12:] + udp


def ipv6_udp(src: str, dst: str, sport: int, dport: int, payload: bytes) -> bytes:
    source, destination = ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed
    pseudo = source + destination + struct.pack("!I3xB", 8 + len(payload), 17)
    udp = _udp(pseudo, sport, dport, payload)
    return struct.pack("!IHBB", 6 << 28, len(udp), 17, 64) + source + destination + udp


def ethernet(payload: bytes, ethertype: int) -> bytes:
    return bytes.fromhex("020000000002020000000001") + struct.pack("!H", ethertype) + payload


V4 = ipv4_udp("198.18.0.1", "198.18.0.2", 40000, 40001, b"netsleuth-v4")
V6 = ipv6_udp("2001:db8::1", "2001:db8::2", 40002, 40003, b"netsleuth-v6 payload")
T0 = 1_700_000_000_123_456_789


def write_sample(destination: Path | io.BytesIO) -> None:
    target: Any = str(destination) if isinstance(destination, Path) else destination
    with PcapngWriter(target) as writer:
        writer.write_packet(
            T0, V4, len(V4), ["drop: NETFILTER_DROP — règle #7 (ip filter INPUT)", "netns 4026532177"]
        )
        writer.write_packet(T0 + 1_000, V6[:48], len(V6), ["truncated capture"])
        writer.write_packet(T0 + 2_000_000_000, V4, len(V4))
        writer.write_packet(
            T0 + 3, ethernet(V6, 0x86DD), len(V6) + 14, ["on veth0"], linktype=LINKTYPE_ETHERNET
        )


# --- an independent reader -------------------------------------------------------------------------------


@dataclass
class Block:
    type: int
    body: bytes
    options: list[tuple[int, bytes]] = field(default_factory=list)


def _parse_options(raw: bytes) -> list[tuple[int, bytes]]:
    options: list[tuple[int, bytes]] = []
    position = 0
    while position < len(raw):
        code, length = struct.unpack_from("<HH", raw, position)
        position += 4
        if code == 0:
            assert length == 0 and position == len(raw), "opt_endofopt must be last and empty"
            return options
        value = raw[position : position + length]
        padding = raw[position + length : position + length + (-length % 4)]
        assert padding == b"\0" * (-length % 4), "option padding must be zero"
        options.append((code, value))
        position += length + (-length % 4)
    raise AssertionError("options not closed by opt_endofopt")


def parse_blocks(data: bytes) -> list[Block]:
    blocks: list[Block] = []
    position = 0
    while position < len(data):
        block_type, total = struct.unpack_from("<II", data, position)
        assert total % 4 == 0 and total >= 12
        assert struct.unpack_from("<I", data, position + total - 4)[0] == total, "trailing length differs"
        body = data[position + 8 : position + total - 4]
        fixed = {0x0A0D0D0A: 16, 0x00000001: 8}.get(block_type)
        if block_type == 6:
            captured = struct.unpack_from("<I", body, 12)[0]
            fixed = 20 + captured + (-captured % 4)
            assert body[20 + captured : fixed] == b"\0" * (-captured % 4), "packet padding must be zero"
        assert fixed is not None, f"unexpected block type {block_type:#x}"
        blocks.append(Block(block_type, body, _parse_options(body[fixed:]) if len(body) > fixed else []))
        position += total
    assert position == len(data)
    return blocks


def test_block_layout_follows_the_spec(tmp_path: Path) -> None:
    path = tmp_path / "drops.pcapng"
    write_sample(path)
    blocks = parse_blocks(path.read_bytes())
    assert [block.type for block in blocks] == [0x0A0D0D0A, 1, 6, 6, 6, 1, 6]

    magic, major, minor, section_length = struct.unpack_from("<IHHq", blocks[0].body)
    assert (magic, major, minor, section_length) == (0x1A2B3C4D, 1, 0, -1)
    assert dict(blocks[0].options)[4].startswith(b"netsleuth")

    for idb, linktype in ((blocks[1], LINKTYPE_RAW), (blocks[5], LINKTYPE_ETHERNET)):
        assert struct.unpack_from("<HHI", idb.body) == (linktype, 0, 262144)
        assert dict(idb.options)[9] == bytes([9])  # if_tsresol: nanoseconds

    interface, high, low, captured, original = struct.unpack_from("<IIIII", blocks[2].body)
    assert (interface, (high << 32) | low, captured, original) == (0, T0, len(V4), len(V4))
    assert blocks[2].body[20 : 20 + captured] == V4
    assert [value.decode() for _, value in blocks[2].options] == [
        "drop: NETFILTER_DROP — règle #7 (ip filter INPUT)",
        "netns 4026532177",
    ]
    assert struct.unpack_from("<II", blocks[3].body, 12) == (48, len(V6))
    assert blocks[4].options == []  # no comments: no options at all, not even opt_endofopt
    assert struct.unpack_from("<I", blocks[6].body)[0] == 1  # the Ethernet packet uses the second IDB


def test_file_object_is_left_open() -> None:
    buffer = io.BytesIO()
    write_sample(buffer)
    assert not buffer.closed
    assert len(parse_blocks(buffer.getvalue())) == 7


def test_snaplen_cuts_captured_bytes() -> None:
    buffer = io.BytesIO()
    with PcapngWriter(buffer, snaplen=40) as writer:
        writer.write_packet(T0, V6, len(V6))
    packet = parse_blocks(buffer.getvalue())[2]
    assert struct.unpack_from("<II", packet.body, 12) == (40, len(V6))
    assert packet.body[20:60] == V6[:40]


def test_snaplen_zero_means_no_limit_and_lengths_are_sane() -> None:
    buffer = io.BytesIO()
    with PcapngWriter(buffer, snaplen=0) as writer:
        writer.write_packet(T0, V6, len(V6))
        writer.write_packet(T0, V4, len(V4) - 10)  # a wrong original length never undercuts the bytes
    blocks = parse_blocks(buffer.getvalue())
    assert struct.unpack_from("<HHI", blocks[1].body) == (LINKTYPE_RAW, 0, 0)
    assert struct.unpack_from("<II", blocks[2].body, 12) == (len(V6), len(V6))
    assert struct.unpack_from("<II", blocks[3].body, 12) == (len(V4), len(V4))


def test_oversized_comment_is_cut_on_a_character_boundary() -> None:
    buffer = io.BytesIO()
    with PcapngWriter(buffer) as writer:
        writer.write_packet(T0, V4, len(V4), ["é" * 40000])
    (code, value), *_ = parse_blocks(buffer.getvalue())[2].options
    assert code == 1 and len(value) <= 0xFFFF
    assert value.decode("utf-8") == "é" * (len(value) // 2)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot write pcapng file"):
        PcapngWriter(str(tmp_path / "missing-dir" / "x.pcapng"))
    with PcapngWriter(io.BytesIO()) as writer, pytest.raises(ValueError):
        writer.write_packet(-1, V4, len(V4))
    with pytest.raises(ValueError):
        writer.write_packet(T0, V4, len(V4))  # closed


@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
def test_tshark_reads_packets_and_comments(tmp_path: Path) -> None:
    assert TSHARK is not None
    path = tmp_path / "drops.pcapng"
    write_sample(path)
    fields = [
        "frame.interface_id",
        "frame.comment",
        "frame.len",
        "frame.cap_len",
        "frame.time_epoch",
        "ip.src",
        "ip.dst",
        "ip.checksum.status",
        "ipv6.src",
        "ipv6.dst",
        "udp.srcport",
        "udp.checksum.status",
        "eth.type",
        "_ws.malformed",
    ]
    result = subprocess.run(
        [TSHARK, "-r", str(path), "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE"]
        + ["-T", "json", "--no-duplicate-keys"]
        + [argument for name in fields for argument in ("-e", name)],
        capture_output=True,
        text=True,
        check=True,
    )
    frames = [packet["_source"]["layers"] for packet in json.loads(result.stdout)]
    assert len(frames) == 4
    first, truncated, plain, ethernet_frame = frames

    assert first["frame.comment"] == ["drop: NETFILTER_DROP — règle #7 (ip filter INPUT)", "netns 4026532177"]
    assert first["frame.time_epoch"] == ["1700000000.123456789"]
    assert (first["ip.src"], first["ip.dst"], first["udp.srcport"]) == (
        ["198.18.0.1"],
        ["198.18.0.2"],
        ["40000"],
    )
    assert first["frame.len"] == first["frame.cap_len"] == [str(len(V4))]
    assert first["ip.checksum.status"] == ["1"] and first["udp.checksum.status"] == ["1"]  # 1 = good

    assert truncated["frame.comment"] == ["truncated capture"]
    assert (truncated["frame.len"], truncated["frame.cap_len"]) == ([str(len(V6))], ["48"])
    assert truncated["ipv6.src"] == ["2001:db8::1"]
    assert truncated["frame.time_epoch"] == ["1700000000.123457789"]

    assert "frame.comment" not in plain
    assert plain["frame.time_epoch"] == ["1700000002.123456789"]

    assert ethernet_frame["frame.interface_id"] == ["1"]
    assert ethernet_frame["eth.type"] == ["0x86dd"]
    assert ethernet_frame["ipv6.dst"] == ["2001:db8::2"]
    assert ethernet_frame["udp.checksum.status"] == ["1"]
    assert ethernet_frame["frame.comment"] == ["on veth0"]
    assert not any("_ws.malformed" in frame for frame in frames)
