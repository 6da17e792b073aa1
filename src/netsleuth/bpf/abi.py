"""The runtime side of the generated kernel ABI (src/netsleuth/_generated/*_abi.py, written by
netsleuth.bpf.abigen from the objects' BTF): base classes the generated modules use, and the load-time check
that a ctypes mirror still matches the struct of the object being loaded, member by member.
"""

from __future__ import annotations

import ctypes
import enum
from typing import Any, Generic, NamedTuple, TypeVar

from netsleuth.bpf import btf_layout
from netsleuth.bpf.btf import Btf
from netsleuth.bpf.errors import BpfError

__all__ = ["KernelEnum", "Program", "RodataVar", "check_mirror", "check_rodata_value"]

T = TypeVar("T")

_OUT_OF_STEP = "the object and the Python code are out of step (run `make bpf`)"


class KernelEnum(enum.IntEnum):
    """A C enum of a netsleuth object. `bit` is its mask bit: configs select kinds with `1 << kind`."""

    @property
    def bit(self) -> int:
        return 1 << self.value


class Program(NamedTuple):
    """One program of an object, from its ELF section name (e.g. "tp_btf/kfree_skb")."""

    section: str
    attach: str  # tp_btf, raw_tp...
    tracepoint: str  # the hook's name without its category: kfree_skb, tcp_send_reset
    name: str = ""  # the program's C name, what libbpf finds it by


def check_mirror(btf: Btf, c_name: str, mirror: type[ctypes.Structure], object_name: str) -> None:
    """Refuse a mirror whose struct is missing from the object, or whose members differ in name, order,
    offset or size (nested structs too): decoding with it would read the wrong bytes without an error."""
    members = btf_layout.struct_members(btf, c_name)
    if members is None:
        raise BpfError(f"BPF object {object_name} has no struct {c_name} ({mirror.__name__}): {_OUT_OF_STEP}")
    fields: list[tuple[Any, ...]] = [tuple(entry) for entry in mirror._fields_]
    where = f"struct {c_name} ({mirror.__name__})"
    for index in range(max(len(members), len(fields))):
        if index >= len(fields):
            raise BpfError(
                f"{where} has a member {members[index].name} in {object_name} that the Python mirror lacks: "
                + _OUT_OF_STEP
            )
        name, ctype = fields[index][0], fields[index][1]
        if index >= len(members):
            raise BpfError(
                f"{where} has no member {name} in {object_name} (the Python mirror has it): {_OUT_OF_STEP}"
            )
        member = members[index]
        if member.name != name:
            raise BpfError(
                f"{where} member {index} is {member.name} in {object_name} but {name} in the Python mirror "
                f"(renamed or reordered): {_OUT_OF_STEP}"
            )
        descriptor = getattr(mirror, name)
        if (member.offset, member.size) != (descriptor.offset, descriptor.size):
            raise BpfError(
                f"{where} member {name} is {member.size} bytes at offset {member.offset} in {object_name} "
                f"but {descriptor.size} bytes at offset {descriptor.offset} in the Python mirror: "
                + _OUT_OF_STEP
            )
        nested = _nested_struct(ctype)
        if isinstance(member.ctype, btf_layout.StructType) and nested is not None:
            check_mirror(btf, member.ctype.name, nested, object_name)
    if btf.struct_size(c_name) != ctypes.sizeof(mirror):
        raise BpfError(
            f"{where} is {btf.struct_size(c_name)} bytes in {object_name} but {ctypes.sizeof(mirror)} in the "
            f"Python mirror: {_OUT_OF_STEP}"
        )


def _nested_struct(ctype: Any) -> type[ctypes.Structure] | None:
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Structure):
        return ctype
    return None


class RodataVar(Generic[T]):
    """One `const volatile` global of an object's .rodata, with the ctypes type its value must have."""

    def __init__(self, name: str, ctype: type[T]) -> None:
        self.name = name
        self.ctype = ctype

    def __repr__(self) -> str:
        return f"RodataVar({self.name!r})"


def check_rodata_value(variable: RodataVar[Any], value: Any) -> None:
    """A value written to a .rodata variable must be of its generated type (not merely as large)."""
    if not isinstance(value, variable.ctype):
        raise BpfError(
            f"rodata variable {variable.name} holds a {variable.ctype.__name__}, not a {type(value).__name__}"
        )
