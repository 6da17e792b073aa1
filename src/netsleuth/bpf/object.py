"""A BPF object's life in explicit phases: open -> configure (.rodata) -> load -> attach -> close.

Everything that depends on the running kernel happens at load (CO-RE relocations against its BTF). Links are
owned by this process and never pinned, so a crash or kill leaves nothing attached.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Collection
from pathlib import Path
from types import TracebackType
from typing import Any

from netsleuth.bpf import _libbpf
from netsleuth.bpf.abi import RodataVar, check_mirror, check_rodata_value
from netsleuth.bpf.btf import Btf
from netsleuth.bpf.errors import BpfError, VerifierError, last_errno_error
from netsleuth.bpf.maps import BpfMap
from netsleuth.errors import EnvironmentProblem

__all__ = ["BpfObject", "generated_object_path"]

_LOG_SIZE = 4 << 20
_PERCPU_TYPES = {5, 6, 10}  # BPF_MAP_TYPE_PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH


def generated_object_path(name: str) -> Path:
    """The committed, prebuilt object shipped inside the package (netsleuth/_generated/<name>.bpf.o)."""
    # Beside this package's modules, as importlib.resources.files("netsleuth") would say for an installed
    # package, without importing importlib.resources (zipfile, tempfile...) on the way to attaching.
    path = Path(__file__).resolve().parents[1] / "_generated" / f"{name}.bpf.o"
    if not path.exists():
        raise EnvironmentProblem(
            f"the BPF object {path} is missing from the installation; reinstall netsleuth"
        )
    return path


def _log_buffer(size: int) -> ctypes.Array[ctypes.c_char]:
    """A verifier log buffer in anonymous mmap pages: libbpf hands it to the kernel only when a load fails
    (it retries with log_level 1), and untouched pages cost nothing. A ctypes buffer is zero-filled up front:
    4 MiB of page faults, several milliseconds of every start. The array keeps the mapping alive."""
    return (ctypes.c_char * size).from_buffer(mmap.mmap(-1, size))


class BpfObject:
    """One .bpf.o. Use as a context manager so programs, links and maps are released on every exit path."""

    def __init__(self, path: Path) -> None:
        self._lib = _libbpf.lib()
        self.path = path
        self._links: list[tuple[str, int]] = []
        self._log_buffers: dict[str, ctypes.Array[ctypes.c_char]] = {}
        self._loaded = False
        with _libbpf.capture_messages() as messages:
            self._handle: int | None = self._lib.bpf_object__open_file(str(path).encode(), None)
        if not self._handle:
            raise last_errno_error(f"cannot open BPF object {path.name}", messages)

    @classmethod
    def open_generated(cls, name: str) -> BpfObject:
        return cls(generated_object_path(name))

    # -- configure -------------------------------------------------------------------------------------
    def btf(self) -> Btf:
        """The object's own BTF (borrowed: freed with the object)."""
        return Btf(self._lib.bpf_object__btf(self._handle), owned=False)

    def _map_pointer(self, name: str) -> int:
        pointer = self._lib.bpf_object__find_map_by_name(self._handle, name.encode())
        if not pointer:
            raise BpfError(f"BPF object {self.path.name} has no map {name}")
        return int(pointer)

    def _section_map(self, section: str) -> int:
        pointer = self._lib.bpf_object__next_map(self._handle, None)
        while pointer:
            name: bytes = self._lib.bpf_map__name(pointer)
            if name.decode().endswith(section):
                return int(pointer)
            pointer = self._lib.bpf_object__next_map(self._handle, pointer)
        raise BpfError(f"BPF object {self.path.name} has no {section} section")

    def set_rodata(
        self, variable: RodataVar[Any] | str, value: ctypes.Structure | ctypes._SimpleCData[Any]
    ) -> None:
        """Write a `const volatile` global before load; the verifier then sees it as a constant. netsleuth's
        own objects name it by their generated `<Name>Rodata` attribute, whose type the value must have (an
        object outside the package, a plug-in's, by its name)."""
        if self._loaded:
            raise BpfError("read-only configuration must be set before load")
        if isinstance(variable, RodataVar):
            check_rodata_value(variable, value)
            variable = variable.name
        btf = self.btf()
        offset = btf.datasec_var_offset(".rodata", variable)
        if offset is None:
            raise BpfError(f"BPF object {self.path.name} has no read-only variable {variable}")
        c_name = getattr(type(value), "c_name", None)
        if c_name and isinstance(value, ctypes.Structure):
            self.check_struct(c_name, type(value))
        size = ctypes.c_size_t()
        data = self._lib.bpf_map__initial_value(self._section_map(".rodata"), ctypes.byref(size))
        if not data or offset + ctypes.sizeof(value) > size.value:
            raise BpfError(f"cannot write {variable} into {self.path.name}'s .rodata")
        ctypes.memmove(data + offset, ctypes.addressof(value), ctypes.sizeof(value))

    def check_struct(self, c_name: str, mirror: type[ctypes.Structure]) -> None:
        """The Python mirror of a C struct must be the object's struct: present, with every member's name,
        order, offset and size the same (netsleuth.bpf.abi.check_mirror); else a BpfError naming the field."""
        check_mirror(self.btf(), c_name, mirror, self.path.name)

    check_struct_size = check_struct  # the name callers used while only sizes were compared

    def reuse_map(self, name: str, fd: int) -> None:
        """Before load: map `name` becomes the existing map `fd` (another object's), so both objects' programs
        share it; libbpf checks at load that the definitions agree."""
        if self._loaded:
            raise BpfError("a map can be shared only before load")
        if self._lib.bpf_map__reuse_fd(self._map_pointer(name), fd) != 0:
            raise last_errno_error(f"cannot share map {name} with {self.path.name}")

    def set_max_entries(self, name: str, entries: int) -> None:
        """Before load: map `name` holds at most `entries` (a ring buffer: bytes, a power of two pages). A map
        a run leaves unused is made as small as it can be: hash maps are preallocated, and a 64 Ki-entry one
        takes a millisecond or two of the start to create."""
        if self._loaded:
            raise BpfError("a map can be resized only before load")
        if self._lib.bpf_map__set_max_entries(self._map_pointer(name), entries) != 0:
            raise last_errno_error(f"cannot resize map {name} of {self.path.name}")

    def set_autoload(self, program: str, enabled: bool) -> None:
        self._lib.bpf_program__set_autoload(self._program(program), enabled)

    def _program(self, name: str) -> int:
        pointer = self._lib.bpf_object__find_program_by_name(self._handle, name.encode())
        if not pointer:
            raise BpfError(f"BPF object {self.path.name} has no program {name}")
        return int(pointer)

    # -- load ------------------------------------------------------------------------------------------
    def load(self, programs: list[str]) -> None:
        """Load (verify) the object; `programs` are the ones whose verifier log we keep for errors."""
        for name in programs:
            buffer = _log_buffer(_LOG_SIZE)
            self._log_buffers[name] = buffer
            self._lib.bpf_program__set_log_buf(self._program(name), buffer, _LOG_SIZE)
        with _libbpf.capture_messages() as messages:  # this load's warnings only, even with other threads
            result = self._lib.bpf_object__load(self._handle)
            number = ctypes.get_errno()
        if result != 0:
            log = "\n".join(buffer.value.decode(errors="replace") for buffer in self._log_buffers.values())
            base = last_errno_error(f"the kernel refused to load {self.path.name}")
            raise VerifierError(str(base), number, log.strip(), messages)
        self._loaded = True
        self._log_buffers.clear()

    # -- attach ----------------------------------------------------------------------------------------
    def attach(self, program: str) -> None:
        with _libbpf.capture_messages() as messages:
            link = self._lib.bpf_program__attach(self._program(program))
        if not link:
            raise last_errno_error(f"cannot attach {program}", messages)
        self._links.append((program, int(link)))

    def attach_cgroup(self, program: str, cgroup_fd: int) -> None:
        """A cgroup program through a BPF link (not bpf_prog_attach): it goes away with this process."""
        with _libbpf.capture_messages() as messages:
            link = self._lib.bpf_program__attach_cgroup(self._program(program), cgroup_fd)
        if not link:
            raise last_errno_error(f"cannot attach {program} to the cgroup", messages)
        self._links.append((program, int(link)))

    def link_fd(self, program: str) -> int:
        """The fd of the link that attached `program` (for an iterator: what bpf_iter_create() takes)."""
        for name, link in self._links:
            if name == program:
                return int(self._lib.bpf_link__fd(link))
        raise BpfError(f"{program} is not attached")

    def program_fd(self, program: str) -> int:
        return int(self._lib.bpf_program__fd(self._program(program)))

    def attached_programs(self) -> list[str]:
        return [name for name, _ in self._links]

    def map(self, name: str) -> BpfMap:
        pointer = self._map_pointer(name)
        fd = self._lib.bpf_map__fd(pointer)
        if fd < 0:
            raise BpfError(f"map {name} is not created yet: load the object first")
        info = _map_type(fd)
        return BpfMap(
            name,
            fd,
            self._lib.bpf_map__key_size(pointer),
            self._lib.bpf_map__value_size(pointer),
            per_cpu=info in _PERCPU_TYPES,
        )

    # -- close -----------------------------------------------------------------------------------------
    def detach_all(self, keep: Collection[str] = ()) -> None:
        """Destroy every link but those of the programs named in `keep` (full names)."""
        kept = [(name, link) for name, link in self._links if name in keep]
        while self._links:
            name, link = self._links.pop()
            if name not in keep:
                self._lib.bpf_link__destroy(link)
        self._links = kept

    def close(self) -> None:
        self.detach_all()
        if self._handle:
            self._lib.bpf_object__close(self._handle)
        self._handle = None

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _map_type(fd: int) -> int:
    # struct bpf_map_info starts with __u32 type (include/uapi/linux/bpf.h).
    buffer = ctypes.create_string_buffer(96)
    length = ctypes.c_uint32(len(buffer))
    if _libbpf.lib().bpf_obj_get_info_by_fd(fd, buffer, ctypes.byref(length)) != 0:
        return 0
    return int.from_bytes(buffer.raw[:4], "little")
