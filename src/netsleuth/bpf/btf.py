"""Read-only BTF access through libbpf: enums of the running kernel, type sizes, tracepoint arities.

The enums that change between kernels (skb_drop_reason, tcp states, reset reasons) are always read here from
/sys/kernel/btf/vmlinux, never from a table in our source.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import msgspec

from netsleuth.bpf import _libbpf
from netsleuth.bpf.errors import MissingFeature
from netsleuth.errors import EnvironmentProblem

__all__ = ["VMLINUX_BTF", "Btf", "BtfRecord", "vmlinux_btf"]

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
BTF_KIND_STRUCT = 4
BTF_KIND_DATASEC = 15
BTF_KIND_VAR = 14


class _BtfType(ctypes.Structure):
    _fields_ = (("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32), ("size_or_type", ctypes.c_uint32))


class _BtfEnum(ctypes.Structure):
    _fields_ = (("name_off", ctypes.c_uint32), ("val", ctypes.c_int32))


class _BtfEnum64(ctypes.Structure):
    _fields_ = (("name_off", ctypes.c_uint32), ("val_lo32", ctypes.c_uint32), ("val_hi32", ctypes.c_uint32))


class _BtfVarSecinfo(ctypes.Structure):
    _fields_ = (("type", ctypes.c_uint32), ("offset", ctypes.c_uint32), ("size", ctypes.c_uint32))


class BtfRecord(msgspec.Struct, frozen=True):
    """One BTF type as stored (include/uapi/linux/btf.h struct btf_type), for readers of layouts.

    `body` is the address of what follows the header (members, array info, enum values...), valid while the
    Btf is; `kflag` is the kind flag (bitfield offsets in members, signedness of enums).
    """

    type_id: int
    kind: int
    name: str
    vlen: int
    kflag: bool
    size_or_type: int
    body: int


def _kind(info: int) -> int:
    return (info >> 24) & 0x1F


def _vlen(info: int) -> int:
    return info & 0xFFFF


class Btf:
    """A parsed BTF blob: the kernel's (`Btf.vmlinux()`), a file's, or a loaded object's (borrowed)."""

    def __init__(self, handle: int, owned: bool = True) -> None:
        self._lib = _libbpf.lib()
        self._handle: int | None = handle
        self._owned = owned

    @classmethod
    def vmlinux(cls, path: Path = VMLINUX_BTF) -> Btf:
        if not path.exists():
            raise MissingFeature(
                "kernel BTF (/sys/kernel/btf/vmlinux)",
                "5.4 built with CONFIG_DEBUG_INFO_BTF=y",
                "use a distribution kernel that ships BTF (Debian 11+, Ubuntu 20.10+, RHEL 8.2+)",
            )
        lib = _libbpf.lib()
        # Raw BTF mapped: one copy instead of 4 KiB reads and two copies (netsleuth.bpf._libbpf). An ELF
        # file, or a kernel that cannot map its BTF (< 6.16), goes through btf__parse.
        with _libbpf.mapped_readonly(str(path)) as mapped:
            handle = lib.btf__new(*mapped) if mapped else None
        if not handle:
            handle = lib.btf__parse(str(path).encode(), None)
        if not handle:
            raise EnvironmentProblem(f"cannot parse kernel BTF at {path}")
        return cls(handle)

    def close(self) -> None:
        if self._handle and self._owned:
            self._lib.btf__free(self._handle)
        self._handle = None

    def __enter__(self) -> Btf:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _type(self, type_id: int) -> _BtfType:
        pointer = self._lib.btf__type_by_id(self._handle, type_id)
        return _BtfType.from_address(pointer)

    def _name(self, offset: int) -> str:
        name: bytes | None = self._lib.btf__name_by_offset(self._handle, offset)
        return name.decode() if name else ""

    def record(self, type_id: int) -> BtfRecord | None:
        """The raw type `type_id`, or None past the last type (libbpf returns NULL there)."""
        pointer = self._lib.btf__type_by_id(self._handle, type_id)
        if not pointer:
            return None
        header = _BtfType.from_address(pointer)
        return BtfRecord(
            type_id,
            _kind(header.info),
            self._name(header.name_off),
            _vlen(header.info),
            bool(header.info >> 31),
            header.size_or_type,
            pointer + ctypes.sizeof(_BtfType),
        )

    def name_at(self, offset: int) -> str:
        """A string of the BTF string section (member and enum value names)."""
        return self._name(offset)

    def find(self, name: str, kind: int) -> int | None:
        type_id: int = self._lib.btf__find_by_name_kind(self._handle, name.encode(), kind)
        return type_id if type_id > 0 else None

    def enum(self, name: str) -> dict[str, int] | None:
        """Members of `enum NAME` (32- or 64-bit) as name -> value; None when there is no such enum."""
        for kind in (_libbpf.BTF_KIND_ENUM, _libbpf.BTF_KIND_ENUM64):
            type_id = self.find(name, kind)
            if type_id is None:
                continue
            pointer = self._lib.btf__type_by_id(self._handle, type_id)
            header = _BtfType.from_address(pointer)
            members: dict[str, int] = {}
            base = pointer + ctypes.sizeof(_BtfType)
            for index in range(_vlen(header.info)):
                if kind == _libbpf.BTF_KIND_ENUM:
                    entry = _BtfEnum.from_address(base + index * ctypes.sizeof(_BtfEnum))
                    members[self._name(entry.name_off)] = entry.val & 0xFFFFFFFF
                else:
                    wide = _BtfEnum64.from_address(base + index * ctypes.sizeof(_BtfEnum64))
                    members[self._name(wide.name_off)] = wide.val_lo32 | (wide.val_hi32 << 32)
            return members
        return None

    def struct_size(self, name: str) -> int | None:
        type_id = self.find(name, BTF_KIND_STRUCT)
        if type_id is None:
            return None
        size: int = self._lib.btf__resolve_size(self._handle, type_id)
        return size if size >= 0 else None

    def tracepoint_arity(self, tracepoint: str) -> int | None:
        """How many arguments tp_btf/raw_tp programs get for `tracepoint` (not counting `void *__data`).

        The kernel declares `typedef void (*btf_trace_<name>)(void *__data, args...)` for every tracepoint
        (include/trace/bpf_probe.h); its prototype is the tracepoint's real argument list on this kernel.
        """
        typedef_id = self.find(f"btf_trace_{tracepoint}", _libbpf.BTF_KIND_TYPEDEF)
        if typedef_id is None:
            return None
        pointer_type = self._type(self._type(typedef_id).size_or_type)
        if _kind(pointer_type.info) != _libbpf.BTF_KIND_PTR:
            return None
        proto = self._type(pointer_type.size_or_type)
        if _kind(proto.info) != _libbpf.BTF_KIND_FUNC_PROTO:
            return None
        return _vlen(proto.info) - 1

    def datasec_var_offset(self, section: str, variable: str) -> int | None:
        """Offset of a global `variable` inside a data section of this (object) BTF, e.g. .rodata."""
        type_id = self.find(section, BTF_KIND_DATASEC)
        if type_id is None:
            return None
        pointer = self._lib.btf__type_by_id(self._handle, type_id)
        header = _BtfType.from_address(pointer)
        base = pointer + ctypes.sizeof(_BtfType)
        for index in range(_vlen(header.info)):
            info = _BtfVarSecinfo.from_address(base + index * ctypes.sizeof(_BtfVarSecinfo))
            if self._name(self._type(info.type).name_off) == variable:
                return int(info.offset)
        return None


@functools.cache
def vmlinux_btf() -> Btf:
    """The running kernel's BTF, parsed once per process (about 10 ms) and kept: every diagnostic reads it."""
    return Btf.vmlinux()
