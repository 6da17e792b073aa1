"""Fast reading of BPF records: a `struct.Struct` built from a generated ctypes mirror, and frozen records
made without their dataclass `__init__`.

Reading a ctypes structure field by field costs a Python attribute lookup and a conversion per field per
event; under a drop storm that is most of the consumer's time. `flat_struct` turns the generated mirror
(netsleuth._generated.*_abi, the ABI of the object actually loaded) into one `struct.Struct` whose
`unpack_from` returns every field at once; nested structures are flattened (`tuple.saddr`), byte arrays are
`bytes`, padding is skipped. The layout is computed from the mirror's own offsets, so it cannot drift from
the generated ABI.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, TypeVar

__all__ = ["FlatStruct", "flat_struct", "frozen_record"]

# Little-endian codes of the scalar ctypes the generator emits (BPF targets are little-endian here).
_CODES: dict[type[Any], str] = {
    ctypes.c_uint8: "B",
    ctypes.c_int8: "b",
    ctypes.c_uint16: "H",
    ctypes.c_int16: "h",
    ctypes.c_uint32: "I",
    ctypes.c_int32: "i",
    ctypes.c_uint64: "Q",
    ctypes.c_int64: "q",
    ctypes.c_char: "c",
}
_BYTES = (ctypes.c_uint8, ctypes.c_char)


class FlatStruct:
    """A ctypes structure as one `struct.Struct`; `index[name]` is a field's position in the unpacked
    tuple (nested fields by dotted name; an array of numbers is that many values from there on), and
    `offset[name]` its byte offset (for slicing raw regions)."""

    def __init__(self, structure: type[ctypes.Structure]) -> None:
        codes: list[str] = []
        self.index: dict[str, int] = {}
        self.offset: dict[str, int] = {}
        end = self._add(structure, "", 0, codes)
        self.struct = struct.Struct("<" + "".join(codes))
        if self.struct.size != ctypes.sizeof(structure) or end > self.struct.size:
            raise AssertionError(f"{structure.__name__}: flat layout does not match its ctypes size")
        self.size = self.struct.size
        self.unpack_from = self.struct.unpack_from

    def _add(self, structure: type[ctypes.Structure], prefix: str, base: int, codes: list[str]) -> int:
        position = base
        for name, field_type, *_ in structure._fields_:
            descriptor = getattr(structure, name)
            start = base + descriptor.offset
            if start < position:
                raise AssertionError(f"{structure.__name__}.{name}: overlapping field")
            if start > position:
                codes.append(f"{start - position}x")
            full = prefix + name
            self.offset[full] = start
            if isinstance(field_type, type) and issubclass(field_type, ctypes.Structure):
                position = self._add(field_type, full + ".", start, codes)
                continue
            if isinstance(field_type, type) and issubclass(field_type, ctypes.Array):
                element: Any = field_type._type_
                length: int = getattr(field_type, "_length_")  # noqa: B009 (typeshed types it as a method)
                self.index[full] = self._count(codes)
                if element in _BYTES:
                    codes.append(f"{length}s")
                else:  # an array of numbers: that many values, from index[full] on
                    codes.append(_CODES[element] * length)
            else:
                self.index[full] = self._count(codes)
                codes.append(_CODES[field_type])
            position = start + ctypes.sizeof(field_type)
        size = base + ctypes.sizeof(structure)
        if size > position:
            codes.append(f"{size - position}x")
        return size

    @staticmethod
    def _count(codes: list[str]) -> int:
        """How many values the codes so far unpack to (padding `Nx` gives none, `Ns` one, `QQQ` three)."""
        return sum(0 if code.endswith("x") else 1 if code.endswith("s") else len(code) for code in codes)


def flat_struct(structure: type[ctypes.Structure]) -> FlatStruct:
    return FlatStruct(structure)


RecordT = TypeVar("RecordT")
_new = object.__new__
_set = object.__setattr__


def frozen_record(cls: type[RecordT], values: dict[str, Any]) -> RecordT:
    """An instance of the frozen dataclass `cls` holding `values` (every field, already of its type),
    without `__init__`: a frozen dataclass sets each field through object.__setattr__, ~6x slower than
    handing it its attribute dict. Only for plain frozen dataclasses (no __post_init__, no slots)."""
    record = _new(cls)
    _set(record, "__dict__", values)
    return record
