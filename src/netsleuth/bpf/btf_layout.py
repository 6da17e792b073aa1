"""Layouts of C types as a BPF object's BTF records them: struct members with offsets and sizes, arrays,
integers, enums, map definitions.

Both the ABI generator (netsleuth.bpf.abigen, at build time) and the loader's mirror check
(netsleuth.bpf.abi, at load time) read types through here, so what is generated and what is verified are
the same reading of the same BTF.
"""

from __future__ import annotations

import ctypes

import msgspec

from netsleuth.bpf.btf import Btf, BtfRecord

__all__ = [
    "ArrayType",
    "CType",
    "EnumType",
    "IntType",
    "MapDefinition",
    "Member",
    "PointerType",
    "StructType",
    "datasec_variables",
    "describe",
    "map_definitions",
    "struct_id",
    "struct_members",
]

# include/uapi/linux/btf.h
_INT, _PTR, _ARRAY, _STRUCT, _UNION, _ENUM, _FWD, _TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
_VOLATILE, _CONST, _RESTRICT, _VAR, _DATASEC, _TYPE_TAG, _ENUM64 = 9, 10, 11, 14, 15, 18, 19
_QUALIFIERS = {_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG}
_INT_SIGNED = 1


class _Member(ctypes.Structure):
    _fields_ = (("name_off", ctypes.c_uint32), ("type", ctypes.c_uint32), ("offset", ctypes.c_uint32))


class _Array(ctypes.Structure):
    _fields_ = (("type", ctypes.c_uint32), ("index_type", ctypes.c_uint32), ("nelems", ctypes.c_uint32))


class _VarSecinfo(ctypes.Structure):
    _fields_ = (("type", ctypes.c_uint32), ("offset", ctypes.c_uint32), ("size", ctypes.c_uint32))


class IntType(msgspec.Struct, frozen=True):
    name: str  # the C spelling: "unsigned char", "char", "long long unsigned int"...
    size: int
    signed: bool


class EnumType(msgspec.Struct, frozen=True):
    name: str
    size: int
    signed: bool


class StructType(msgspec.Struct, frozen=True):
    name: str  # "" for an anonymous struct
    size: int
    union: bool = False


class ArrayType(msgspec.Struct, frozen=True):
    element: CType
    length: int

    @property
    def size(self) -> int:
        return self.element.size * self.length


class PointerType(msgspec.Struct, frozen=True):
    size: int = 8


CType = IntType | EnumType | StructType | ArrayType | PointerType


class Member(msgspec.Struct, frozen=True):
    name: str
    offset: int  # bytes from the start of the struct
    ctype: CType
    bits: int = 0  # a bitfield's width, 0 for a whole member

    @property
    def size(self) -> int:
        return self.ctype.size


class MapDefinition(msgspec.Struct, frozen=True):
    """A map declared in the object's .maps section (libbpf's BTF-defined maps)."""

    name: str
    map_type: int
    max_entries: int


def _record(btf: Btf, type_id: int) -> BtfRecord:
    record = btf.record(type_id)
    if record is None:
        raise ValueError(f"BTF type {type_id} does not exist")
    return record


def _resolve(btf: Btf, type_id: int) -> BtfRecord:
    """The type behind typedefs and qualifiers."""
    record = _record(btf, type_id)
    while record.kind in _QUALIFIERS:
        record = _record(btf, record.size_or_type)
    return record


def describe(btf: Btf, type_id: int) -> CType:
    """What a member or variable of BTF type `type_id` is, as far as a ctypes mirror needs to know."""
    record = _resolve(btf, type_id)
    if record.kind == _INT:
        encoding = ctypes.c_uint32.from_address(record.body).value
        return IntType(record.name, record.size_or_type, bool((encoding >> 24) & _INT_SIGNED))
    if record.kind in (_ENUM, _ENUM64):
        return EnumType(record.name, record.size_or_type, record.kflag)
    if record.kind in (_STRUCT, _UNION):
        return StructType(record.name, record.size_or_type, union=record.kind == _UNION)
    if record.kind == _ARRAY:
        array = _Array.from_address(record.body)
        return ArrayType(describe(btf, array.type), array.nelems)
    if record.kind == _PTR:
        return PointerType()
    raise ValueError(f"BTF type {record.name or record.type_id} (kind {record.kind}) has no ctypes mirror")


def struct_id(btf: Btf, name: str) -> int | None:
    return btf.find(name, _STRUCT)


def _raw_members(btf: Btf, record: BtfRecord) -> list[tuple[str, int, int, int]]:
    """(name, type id, byte offset, bitfield width) of a struct's members, in declaration order."""
    found = []
    for index in range(record.vlen):
        raw = _Member.from_address(record.body + index * ctypes.sizeof(_Member))
        # With the kind flag, offset holds the bitfield width in its top byte and the bit offset below.
        bit_offset = raw.offset & 0xFFFFFF if record.kflag else raw.offset
        bits = raw.offset >> 24 if record.kflag else 0
        found.append((btf.name_at(raw.name_off), int(raw.type), bit_offset // 8, bits))
    return found


def _members(btf: Btf, record: BtfRecord) -> tuple[Member, ...]:
    raw = _raw_members(btf, record)
    return tuple(Member(name, offset, describe(btf, type_id), bits) for name, type_id, offset, bits in raw)


def struct_members(btf: Btf, name: str) -> tuple[Member, ...] | None:
    """The members of `struct NAME` in declaration order, or None when the BTF has no such struct."""
    type_id = struct_id(btf, name)
    return None if type_id is None else _members(btf, _record(btf, type_id))


def datasec_variables(btf: Btf, section: str) -> list[tuple[str, int]]:
    """(name, type id) of every variable in a data section (.rodata, .maps...), in offset order."""
    section_id = btf.find(section, _DATASEC)
    if section_id is None:
        return []
    record = _record(btf, section_id)
    found = []
    for index in range(record.vlen):
        info = _VarSecinfo.from_address(record.body + index * ctypes.sizeof(_VarSecinfo))
        variable = _record(btf, info.type)
        found.append((info.offset, variable.name, variable.size_or_type))
    return [(name, type_id) for _, name, type_id in sorted(found)]


def map_definitions(btf: Btf) -> list[MapDefinition]:
    """The maps of .maps: libbpf encodes `__uint(name, N)` as a pointer to an array of N elements."""
    definitions = []
    for name, type_id in datasec_variables(btf, ".maps"):
        numbers: dict[str, int] = {}
        for member, member_type, _, _ in _raw_members(btf, _resolve(btf, type_id)):
            target = _resolve(btf, member_type)
            if target.kind == _PTR:
                pointee = _resolve(btf, target.size_or_type)
                if pointee.kind == _ARRAY:
                    numbers[member] = _Array.from_address(pointee.body).nelems
        definitions.append(MapDefinition(name, numbers.get("type", 0), numbers.get("max_entries", 0)))
    return sorted(definitions, key=lambda definition: definition.name)
