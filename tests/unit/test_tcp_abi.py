"""The generated mirrors of bpf/tcp.h against the committed object's BTF, and the record decoder."""

from __future__ import annotations

import ctypes

import pytest

from netsleuth._generated.tcp_abi import (
    EventKind,
    RetransKind,
    SockFlag,
    TcpConfigC,
    TcpEventC,
    TcpGroupC,
    TcpGroupKeyC,
    TcpListenerSlotsC,
    TcpRangeC,
    TcpSockInfoC,
)
from netsleuth.bpf.object import BpfObject
from netsleuth.diagnostics.tcp.program import decode_record


@pytest.mark.parametrize(
    ("c_name", "mirror"),
    [
        ("tcp_config", TcpConfigC),
        ("tcp_event", TcpEventC),
        ("tcp_group", TcpGroupC),
        ("tcp_group_key", TcpGroupKeyC),
        ("tcp_range", TcpRangeC),
        ("tcp_listener_slots", TcpListenerSlotsC),
        ("tcp_sock_info", TcpSockInfoC),
    ],
)
def test_mirror_sizes_match_the_object(c_name: str, mirror: type[ctypes.Structure]) -> None:
    with BpfObject.open_generated("tcp") as bpf_object:
        assert vars(mirror)["c_name"] == c_name
        assert bpf_object.btf().struct_size(c_name) == ctypes.sizeof(mirror)
        bpf_object.check_struct(c_name, mirror)  # every member's name, offset and size


def test_tracepoints_come_from_the_sections() -> None:
    from netsleuth._generated.tcp_abi import PROGRAMS

    assert PROGRAMS["nst_retrans_b"] == (
        "tp_btf/tcp_retransmit_skb",
        "tp_btf",
        "tcp_retransmit_skb",
        "nst_retrans_b",
    )
    assert PROGRAMS["nst_retrans_r"].attach == "raw_tp"
    assert {name[:-2] for name in PROGRAMS} == {name[:-2] for name in PROGRAMS if name.endswith("_b")}


def test_every_kind_has_a_program_and_the_object_has_them_all() -> None:
    from netsleuth.diagnostics.tcp.program import _ALL_PROGRAMS, _PROGRAM_OF

    assert set(_PROGRAM_OF) == set(EventKind)
    with BpfObject.open_generated("tcp") as bpf_object:
        for name in _ALL_PROGRAMS:
            for suffix in ("_b", "_r"):
                bpf_object.set_autoload(name + suffix, False)  # raises for an unknown program


def test_decode_record_with_frames() -> None:
    event = TcpEventC()
    event.kind = EventKind.RETRANS
    event.family = 6
    event.laddr[:] = b"\x20\x01\x0d\xb8" + bytes(11) + b"\x01"
    event.raddr[:] = b"\x20\x01\x0d\xb8" + bytes(11) + b"\x02"
    event.lport, event.rport = 41234, 443
    event.state, event.old_state = 1, 0xFF
    event.retrans_kind = RetransKind.TLP
    event.sock_flags = SockFlag.FULL | SockFlag.HAS_FILE
    event.nr_frames = 2
    event.comm = b"curl"
    event.in_task = 0
    record = (
        bytes(event) + (0xFFFFFFFF81000010).to_bytes(8, "little") + (0xFFFFFFFF81000020).to_bytes(8, "little")
    )
    raw = decode_record(record)
    assert raw.kind == EventKind.RETRANS and raw.retrans_kind == RetransKind.TLP
    assert (raw.laddr, raw.lport, raw.raddr, raw.rport) == ("2001:db8::1", 41234, "2001:db8::2", 443)
    assert raw.state == 1 and raw.old_state is None and raw.trigger is None
    assert raw.frames == (0xFFFFFFFF81000010, 0xFFFFFFFF81000020)
    assert raw.comm == ""  # the running task's name means nothing outside its own context
    assert raw.sock_flags & SockFlag.HAS_FILE


def test_decode_trigger() -> None:
    event = TcpEventC()
    event.kind = EventKind.RESET_SENT
    event.has_trigger, event.tcp_flags, event.seq, event.ack, event.payload_len = 1, 0x18, 1, 2, 30
    raw = decode_record(bytes(event))
    assert raw.trigger is not None and (raw.trigger.flags, raw.trigger.length) == (0x18, 30)
