"""Decoding ring-buffer records and choosing the owning process, on hand-built records (no kernel)."""

from __future__ import annotations

import ctypes
import dataclasses
import socket
from pathlib import Path

from netsleuth._generated.drops_abi import DropEvent
from netsleuth.diagnostics.drops.decode import decode_record
from netsleuth.diagnostics.drops.enrich import DropEnricher
from netsleuth.diagnostics.drops.view import drop_line
from netsleuth.kernel.kallsyms import Kallsyms
from netsleuth.kernel.reasons import load_drop_reasons

FIXTURES = Path(__file__).parents[1] / "fixtures"
KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81100000 T handle_softirqs
ffffffff81100400 T net_rx_action
ffffffff81200000 T tcp_v4_rcv
ffffffff81200800 T ip_local_deliver_finish
ffffffff81300000 T __x64_sys_sendto
ffffffff81300100 T sk_skb_reason_drop
ffffffff81300400 T udp_queue_rcv_one_skb
"""


def make_event(
    *,
    in_task: int,
    pid: int = 0,
    comm: bytes = b"",
    sock_ino: int = 0,
    frames: tuple[int, ...] = (),
    packet: bytes = b"",
) -> bytes:
    event = DropEvent()
    event.time_ns = 5_000_000_000
    event.location = 0xFFFFFFFF81200099
    event.reason = 2
    event.netns = 4026531840
    event.pid = pid
    event.in_task = in_task
    event.comm = comm
    event.sock_ino = sock_ino
    event.sk_state = 0xFF
    event.ifname = b"veth0"
    event.skb_len = 60
    event.nr_frames = len(frames)
    event.caplen = len(packet)
    event.tuple.family = 4
    event.tuple.l4proto = socket.IPPROTO_TCP
    event.tuple.has_ports = 1
    event.tuple.sport, event.tuple.dport = 40000, 80
    event.tuple.tcp_flags = 0x02
    event.tuple.l3_len = 60
    ctypes.memmove(event.tuple.saddr, socket.inet_aton("198.18.0.1"), 4)
    ctypes.memmove(event.tuple.daddr, socket.inet_aton("198.18.0.2"), 4)
    return bytes(event) + b"".join(frame.to_bytes(8, "little") for frame in frames) + packet


def enricher(tmp_path: Path) -> DropEnricher:
    kallsyms_file = tmp_path / "kallsyms"
    kallsyms_file.write_text(KALLSYMS)
    reasons = load_drop_reasons(Path("/nonexistent"), [FIXTURES / "reasons" / "kfree_skb_format_6.1.txt"])
    return DropEnricher(reasons, want_stack=True, kallsyms=Kallsyms(str(kallsyms_file)))


def test_record_layout_round_trips() -> None:
    frames = (0xFFFFFFFF81300150, 0xFFFFFFFF81200099, 0xFFFFFFFF81100410)
    raw = decode_record(
        make_event(in_task=1, pid=7, comm=b"curl", frames=frames, packet=b"\x45" + b"\0" * 19)
    )
    assert raw.packet.saddr == "198.18.0.1" and raw.packet.dport == 80 and raw.packet.tcp_flags == 2
    assert raw.frames == frames and raw.packet_bytes[:1] == b"\x45" and len(raw.packet_bytes) == 20
    assert raw.in_task is True and raw.comm == "curl" and raw.sk_state is None


def test_softirq_never_blames_the_interrupted_task(tmp_path: Path) -> None:
    # The kernel said softirq: whatever task was interrupted is not reported.
    frames = (0xFFFFFFFF81300150, 0xFFFFFFFF81200099, 0xFFFFFFFF81100410, 0xFFFFFFFF81300010)
    raw = decode_record(make_event(in_task=0, pid=99, comm=b"innocent", frames=frames))
    record = enricher(tmp_path).enrich(raw)
    assert record.owner == "kernel" and record.pid is None
    # The stack starts at the dropping function, not at our program or kfree_skb.
    assert isinstance(record.stack, tuple) and record.stack[0] == "tcp_v4_rcv+0x99"
    assert record.reason == "NO_SOCKET" and record.location == "tcp_v4_rcv+0x99"


def test_process_context_is_the_sender(tmp_path: Path) -> None:
    frames = (0xFFFFFFFF81200099, 0xFFFFFFFF81300010)
    record = enricher(tmp_path).enrich(
        decode_record(make_event(in_task=1, pid=1234, comm=b"sender", frames=frames))
    )
    assert (record.pid, record.comm, record.owner) == (1234, "sender", "task")


def test_a_kernel_thread_is_not_an_owner(tmp_path: Path) -> None:
    # ksoftirqd runs softirqs on its own task stack: "in task" but nobody's process.
    raw = dataclasses.replace(decode_record(make_event(in_task=1, pid=15, comm=b"ksoftirqd/1")), kthread=True)
    record = enricher(tmp_path).enrich(raw)
    assert record.owner == "kernel" and record.pid is None


def test_socket_owner_is_used_in_softirq(tmp_path: Path) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        import os

        inode = os.fstat(receiver.fileno()).st_ino
        raw = decode_record(make_event(in_task=0, sock_ino=inode))
        record = enricher(tmp_path).enrich(raw)
        assert record.owner == "socket" and record.pid == os.getpid()
    finally:
        receiver.close()


def test_json_contract_and_text_line(tmp_path: Path) -> None:
    record = enricher(tmp_path).enrich(decode_record(make_event(in_task=0)))
    data = record.to_json()
    for key in (
        "type",
        "time",
        "reason",
        "location",
        "family",
        "proto",
        "saddr",
        "daddr",
        "sport",
        "dport",
        "pid",
        "comm",
        "netns",
        "ifname",
        "stack",
    ):
        assert key in data, key
    assert (data["type"], data["family"], data["proto"], data["tcp_flags"]) == ("drop", 4, "tcp", "SYN")
    line = drop_line(record)
    assert (
        "NO_SOCKET  tcp 198.18.0.1:40000 > 198.18.0.2:80 [SYN]  len 60  at tcp_v4_rcv+0x99  dev veth0" in line
    )
