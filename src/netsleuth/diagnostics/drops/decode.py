"""Ring-buffer records and map entries of the drops program as Python values: `RawDrop`, `RawDropGroup`.

Loaded once a drops run has attached (netsleuth.diagnostics.drops.session), not on its way there: decoding
is the first thing done with what the kernel sends, and defining these types costs a start milliseconds.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass

from netsleuth._generated.drops_abi import DROPS_MAX_FRAMES, DropEvent
from netsleuth._generated.shared_abi import PacketTupleC
from netsleuth.diagnostics.packet_abi import decode_tuple
from netsleuth.diagnostics.struct_layout import flat_struct, frozen_record
from netsleuth.packet import PacketTuple

__all__ = [
    "EVENT_SIZE",
    "RawDrop",
    "RawDropGroup",
    "RecordDecoder",
    "decode_event",
    "decode_record",
    "decode_records",
]

EVENT_SIZE = ctypes.sizeof(DropEvent)
_EVENT_SIZE = EVENT_SIZE


@dataclass(frozen=True)
class RawDrop:
    """One drop as the kernel described it, before names are attached."""

    monotonic_ns: int
    location: int
    reason: int
    netns: int
    pid: int  # the current task's when in_task; 0 in softirq/irq
    tid: int
    in_task: bool
    kthread: bool  # the current task is a kernel thread (ksoftirqd, a NAPI thread...)
    comm: str
    sock_ino: int
    sk_state: int | None
    ifindex: int
    ifname: str
    skb_len: int
    cpu: int
    packet: PacketTuple
    frames: tuple[int, ...] = ()
    packet_bytes: bytes = b""


@dataclass(frozen=True)
class RawDropGroup:
    """One in-kernel group (reason x location x netns) with its first drop as the example."""

    reason: int
    location: int
    netns: int
    count: int
    bytes: int
    example: RawDrop


def decode_event(event: DropEvent, frames: tuple[int, ...] = (), packet_bytes: bytes = b"") -> RawDrop:
    in_task = bool(event.in_task)
    return RawDrop(
        monotonic_ns=event.time_ns,
        location=event.location,
        reason=event.reason,
        netns=event.netns,
        pid=event.pid,
        tid=event.tid,
        in_task=in_task,
        kthread=bool(event.kthread),
        comm=event.comm.decode(errors="replace") if in_task else "",
        sock_ino=event.sock_ino,
        sk_state=None if event.sk_state == 0xFF else event.sk_state,
        ifindex=event.ifindex,
        ifname=event.ifname.decode(errors="replace"),
        skb_len=event.skb_len,
        cpu=event.cpu,
        packet=decode_tuple(event.tuple, event.tuple.l3_len or event.skb_len),
        frames=frames,
        packet_bytes=packet_bytes,
    )


def decode_record(record: bytes) -> RawDrop:
    """A ring-buffer record: struct drop_event, then nr_frames u64 addresses, then caplen packet bytes."""
    return decode_records([record])[0]


# The event as one struct.unpack_from (netsleuth.diagnostics.struct_layout): field positions by name.
_FLAT = flat_struct(DropEvent)
_UNPACK = _FLAT.unpack_from
_TUPLE_START = _FLAT.offset["tuple"]
_TUPLE_END = _TUPLE_START + ctypes.sizeof(PacketTupleC)
(_TIME, _LOCATION, _SOCK_INO, _REASON, _NETNS, _PID, _TID, _IFINDEX, _SKB_LEN, _CPU, _CAPLEN, _NR_FRAMES) = (
    _FLAT.index[name]
    for name in (
        "time_ns",
        "location",
        "sock_ino",
        "reason",
        "netns",
        "pid",
        "tid",
        "ifindex",
        "skb_len",
        "cpu",
        "caplen",
        "nr_frames",
    )
)
_L3_LEN = _FLAT.index["tuple.l3_len"]
_IN_TASK, _KTHREAD, _SK_STATE, _COMM, _IFNAME = (
    _FLAT.index[name] for name in ("in_task", "kthread", "sk_state", "comm", "ifname")
)
_FRAMES = {count: struct.Struct(f"<{count}Q").unpack_from for count in range(DROPS_MAX_FRAMES + 1)}
_CACHE_LIMIT = 65536


class RecordDecoder:
    """Decodes ring-buffer records in batches. A storm repeats the same few packets, names and devices, so
    the decoded packet tuple (a frozen PacketTuple, shared by every drop with the same header bytes and
    length), comm and device names are remembered by their raw bytes; everything else is one
    struct.unpack_from per record. The result is exactly `decode_event` of the same bytes."""

    def __init__(self) -> None:
        self._packets: dict[tuple[bytes, int], PacketTuple] = {}
        self._texts: dict[bytes, str] = {}

    def _packet(self, record: bytes, length: int) -> PacketTuple:
        key = (record[_TUPLE_START:_TUPLE_END], length)
        packet = self._packets.get(key)
        if packet is None:
            if len(self._packets) >= _CACHE_LIMIT:
                self._packets.clear()  # a scan of many addresses: start over rather than grow
            packet = decode_tuple(PacketTupleC.from_buffer_copy(key[0]), length)
            self._packets[key] = packet
        return packet

    def _text(self, raw: bytes) -> str:
        text = self._texts.get(raw)
        if text is None:
            if len(self._texts) >= _CACHE_LIMIT:
                self._texts.clear()
            # As ctypes reads a char array: up to the first NUL.
            text = raw.split(b"\0", 1)[0].decode(errors="replace")
            self._texts[raw] = text
        return text

    def decode(self, records: list[bytes]) -> list[RawDrop]:
        decoded: list[RawDrop] = []
        append = decoded.append
        text = self._text
        packet_of = self._packet
        for record in records:
            v = _UNPACK(record)
            skb_len = v[_SKB_LEN]
            nr_frames = v[_NR_FRAMES]
            in_task = bool(v[_IN_TASK])
            sk_state = v[_SK_STATE]
            frames_end = _EVENT_SIZE + 8 * nr_frames
            caplen = v[_CAPLEN]
            append(
                frozen_record(
                    RawDrop,
                    {
                        "monotonic_ns": v[_TIME],
                        "location": v[_LOCATION],
                        "reason": v[_REASON],
                        "netns": v[_NETNS],
                        "pid": v[_PID],
                        "tid": v[_TID],
                        "in_task": in_task,
                        "kthread": bool(v[_KTHREAD]),
                        "comm": text(v[_COMM]) if in_task else "",
                        "sock_ino": v[_SOCK_INO],
                        "sk_state": None if sk_state == 0xFF else sk_state,
                        "ifindex": v[_IFINDEX],
                        "ifname": text(v[_IFNAME]),
                        "skb_len": skb_len,
                        "cpu": v[_CPU],
                        "packet": packet_of(record, v[_L3_LEN] or skb_len),
                        "frames": _FRAMES[nr_frames](record, _EVENT_SIZE) if nr_frames else (),
                        "packet_bytes": record[frames_end : frames_end + caplen] if caplen else b"",
                    },
                )
            )
        return decoded


_DECODER = RecordDecoder()


def decode_records(records: list[bytes]) -> list[RawDrop]:
    """A batch of ring-buffer records (see `decode_record`), decoded in one pass."""
    return _DECODER.decode(records)
