"""The generated drops ABI against the committed object's BTF, and the loader refusing a wrong mirror."""

from __future__ import annotations

import ctypes

import pytest

from netsleuth._generated.drops_abi import (
    DROPS_MAX_GROUPS,
    DROPS_MAX_SNAPLEN,
    MAP_MAX_ENTRIES,
    PROGRAMS,
    DropEvent,
    DropGroupKey,
    DropGroupValue,
    DropsConfigC,
    DropStat,
)
from netsleuth._generated.shared_abi import STAT_COUNT, LpmAddrKey, PacketTupleC
from netsleuth.bpf import abigen
from netsleuth.bpf.errors import BpfError
from netsleuth.bpf.object import BpfObject


@pytest.mark.parametrize(
    ("c_name", "mirror"),
    [
        ("drops_config", DropsConfigC),
        ("drop_event", DropEvent),
        ("drop_group_key", DropGroupKey),
        ("drop_group", DropGroupValue),
        ("packet_tuple", PacketTupleC),
        ("lpm_addr_key", LpmAddrKey),
    ],
)
def test_mirror_sizes_and_offsets_match_the_object(c_name: str, mirror: type[ctypes.Structure]) -> None:
    with BpfObject.open_generated("drops") as bpf_object:
        assert vars(mirror)["c_name"] == c_name
        assert bpf_object.btf().struct_size(c_name) == ctypes.sizeof(mirror)
        bpf_object.check_struct(c_name, mirror)  # every member's name, offset and size


def test_known_offsets_of_the_event() -> None:
    # What decoders index by hand (the frames and packet bytes follow the header).
    assert ctypes.sizeof(DropEvent) == 144
    assert DropEvent.tuple.offset == 56 and DropEvent.comm.offset == 112
    assert DropGroupValue.example.offset == 16 and DropGroupValue.example_frames.offset == 160


def test_constants_and_tables_come_from_the_object() -> None:
    assert MAP_MAX_ENTRIES["drop_groups"] == DROPS_MAX_GROUPS
    assert MAP_MAX_ENTRIES["drop_stats"] == STAT_COUNT == DropStat.COUNT == len(DropStat)
    assert DROPS_MAX_SNAPLEN == 2048
    assert PROGRAMS["drops_tp_btf"].tracepoint == PROGRAMS["drops_raw_tp"].tracepoint == "kfree_skb"
    assert (PROGRAMS["drops_tp_btf"].attach, PROGRAMS["drops_raw_tp"].attach) == ("tp_btf", "raw_tp")


def test_committed_modules_are_what_the_objects_generate() -> None:
    for name, text in abigen.generate().items():
        assert (abigen.GENERATED / name).read_text() == text, f"{name} is stale: run make bpf"


def _mirror(name: str, fields: list[tuple[str, type]]) -> type[ctypes.Structure]:
    return type(name, (ctypes.Structure,), {"_fields_": fields})


_KEY_FIELDS: list[tuple[str, type]] = [
    ("location", ctypes.c_uint64),
    ("reason", ctypes.c_uint32),
    ("netns", ctypes.c_uint32),
]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (_KEY_FIELDS[:2], "member netns in drops.bpf.o that the Python mirror lacks"),
        ([_KEY_FIELDS[0], _KEY_FIELDS[2], _KEY_FIELDS[1]], "member 1 is reason in drops.bpf.o but netns"),
        ([_KEY_FIELDS[0], ("reason", ctypes.c_uint16), _KEY_FIELDS[2]], "reason is 4 bytes at offset 8"),
        ([*_KEY_FIELDS, ("extra", ctypes.c_uint32)], "has no member extra in drops.bpf.o"),
        ([("location", ctypes.c_uint64), ("cause", ctypes.c_uint32), _KEY_FIELDS[2]], "but cause"),
    ],
    ids=["missing", "reordered", "resized", "added", "renamed"],
)
def test_a_wrong_mirror_is_refused_naming_the_field(fields: list[tuple[str, type]], message: str) -> None:
    with BpfObject.open_generated("drops") as bpf_object, pytest.raises(BpfError, match=message):
        bpf_object.check_struct("drop_group_key", _mirror("BadKey", fields))


def test_a_nested_mirror_is_checked_too() -> None:
    tuple_fields = [(name, ctype) for name, ctype in PacketTupleC._fields_ if name != "pad"]
    swapped = _mirror("Tuple", [*tuple_fields[:2], tuple_fields[3], tuple_fields[2], *tuple_fields[4:]])
    event = _mirror(
        "Event", [(name, swapped if name == "tuple" else ctype) for name, ctype in DropEvent._fields_]
    )
    with BpfObject.open_generated("drops") as bpf_object, pytest.raises(BpfError, match="packet_tuple"):
        bpf_object.check_struct("drop_event", event)


def test_a_struct_missing_from_the_object_is_refused() -> None:
    with BpfObject.open_generated("drops") as bpf_object, pytest.raises(BpfError, match="no struct tcp_"):
        bpf_object.check_struct("tcp_event", DropEvent)


def test_rodata_with_a_wrong_mirror_is_refused_before_load() -> None:
    config = _mirror("Config", [(name, ctype) for name, ctype in DropsConfigC._fields_ if name != "snaplen"])
    config.c_name = "drops_config"  # type: ignore[attr-defined]
    with BpfObject.open_generated("drops") as bpf_object, pytest.raises(BpfError, match="snaplen"):
        bpf_object.set_rodata("cfg", config())
