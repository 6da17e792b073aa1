"""User-space addresses -> function names, from the ELF symbol tables of the files a process had mapped
(pyelftools), for the profiler's user stacks.

An address is placed in a mapping of /proc/PID/maps (start, end, file offset, path); its offset in the file is
`address - start + offset`, and the ELF's PT_LOAD program headers turn that into the virtual address the
symbol tables use (`file offset - p_offset + p_vaddr`). That one rule covers executables at a fixed address,
PIE executables and shared libraries alike, wherever they were loaded. Symbols come from .symtab when the
file has it, else .dynsym, else a debug file found by build id (/usr/lib/debug/.build-id/xx/rest.debug).
Files are read through /proc/PID/root, so a process in a container or another mount namespace is read from
its own filesystem. Each file is parsed once (cached by device and inode).
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["ElfSymbols", "Mapping", "ProcessMaps", "UserSymbolizer", "parse_maps"]

_DEBUG_ROOTS = (Path("/usr/lib/debug/.build-id"),)
_STT_FUNC, _STT_GNU_IFUNC = 2, 10  # elf(5) st_info & 0xf


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int
    path: str
    inode: int = 0

    @property
    def is_file(self) -> bool:
        return self.path.startswith("/") and self.inode != 0


def parse_maps(text: str) -> list[Mapping]:
    """The executable mappings of /proc/PID/maps (proc(5): address perms offset dev inode path)."""
    mappings = []
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5 or "x" not in fields[1]:
            continue
        start, end = (int(part, 16) for part in fields[0].split("-"))
        path = fields[5].strip() if len(fields) == 6 else ""
        mappings.append(Mapping(start, end, int(fields[2], 16), path, int(fields[4])))
    return mappings


@dataclass
class ElfSymbols:
    """The function symbols of one ELF file, sorted by address, and how its file offsets map to them."""

    path: str
    build_id: str | None = None
    addresses: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # (p_offset, p_filesz, p_vaddr)

    @classmethod
    def load(cls, path: str, debug_roots: Iterable[Path] = _DEBUG_ROOTS) -> ElfSymbols:
        from elftools.common.exceptions import ELFError

        symbols = cls(path)
        try:
            with open(path, "rb") as stream:
                symbols._read(stream, debug_roots)
        except (OSError, ELFError, ValueError):
            pass  # no symbols: frames in it show as module+offset
        return symbols

    def _read(self, stream: BinaryIO, debug_roots: Iterable[Path]) -> None:
        from elftools.elf.elffile import ELFFile
        from elftools.elf.sections import SymbolTableSection

        elf = ELFFile(stream)
        self.segments = [
            (segment["p_offset"], segment["p_filesz"], segment["p_vaddr"])
            for segment in elf.iter_segments()
            if segment["p_type"] == "PT_LOAD"
        ]
        self.build_id = _build_id(elf)
        table = elf.get_section_by_name(".symtab")
        if not isinstance(table, SymbolTableSection) and self.build_id:
            debug = _debug_file(self.build_id, debug_roots)
            if debug is not None:
                with open(debug, "rb") as debug_stream:
                    debug_elf = ELFFile(debug_stream)
                    debug_table = debug_elf.get_section_by_name(".symtab")
                    if isinstance(debug_table, SymbolTableSection):
                        self._add(debug_table, debug_elf)
                        self._sort()
                        return
        if not isinstance(table, SymbolTableSection):
            table = elf.get_section_by_name(".dynsym")
        if isinstance(table, SymbolTableSection):
            self._add(table, elf)
        self._sort()

    def _add(self, table: Any, elf: Any) -> None:
        """The function symbols of a symbol table section. pyelftools finds the section and its string table;
        the entries are decoded in bulk with struct (Elf64_Sym/Elf32_Sym, elf(5)): pyelftools' per-symbol
        parsing takes seconds on a library with 10^5 symbols, and a host-wide profile meets many."""
        data = table.data()
        strings = table.stringtable.data()
        order = "<" if elf.little_endian else ">"
        if elf.elfclass == 64:
            entries = struct.iter_unpack(order + "IBBHQQ", data[: len(data) // 24 * 24])
            fields = ((name, info, value, size) for name, info, _other, _shndx, value, size in entries)
        else:
            entries = struct.iter_unpack(order + "IIIBBH", data[: len(data) // 16 * 16])
            fields = ((name, info, value, size) for name, value, size, info, _other, _shndx in entries)
        for name_offset, info, value, size in fields:
            if info & 0xF not in (_STT_FUNC, _STT_GNU_IFUNC) or not value:
                continue
            end = strings.find(b"\0", name_offset)
            self.addresses.append(value)
            self.ends.append(value + max(size, 1))
            self.names.append(strings[name_offset : end if end >= 0 else None].decode(errors="replace"))

    def _sort(self) -> None:
        order = sorted(range(len(self.addresses)), key=self.addresses.__getitem__)
        self.addresses = [self.addresses[i] for i in order]
        self.ends = [self.ends[i] for i in order]
        self.names = [self.names[i] for i in order]

    def vaddr_of(self, file_offset: int) -> int | None:
        for p_offset, p_filesz, p_vaddr in self.segments:
            if p_offset <= file_offset < p_offset + p_filesz:
                return file_offset - p_offset + p_vaddr
        return None

    def symbol_at(self, vaddr: int) -> str | None:
        index = bisect.bisect_right(self.addresses, vaddr) - 1
        if index < 0:
            return None
        # A symbol of size 0 or a gap between functions: the nearest symbol below is still the best name,
        # within a page (beyond that it is probably not this function).
        if vaddr < self.ends[index] or vaddr - self.addresses[index] < 4096:
            return self.names[index]
        return None


def _build_id(elf: Any) -> str | None:
    from elftools.elf.sections import NoteSection

    section = elf.get_section_by_name(".note.gnu.build-id")
    if not isinstance(section, NoteSection):
        return None
    for note in section.iter_notes():
        if note["n_type"] == "NT_GNU_BUILD_ID":
            return str(note["n_desc"])
    return None


def _debug_file(build_id: str, roots: Iterable[Path]) -> Path | None:
    for root in roots:
        candidate = root / build_id[:2] / f"{build_id[2:]}.debug"
        if candidate.exists():
            return candidate
    return None


class ProcessMaps:
    """One process's executable mappings, read while it runs (a process that has exited cannot be read)."""

    def __init__(self, pid: int, proc_root: str = "/proc") -> None:
        self.pid = pid
        self.root = os.path.join(proc_root, str(pid), "root")
        try:
            with open(os.path.join(proc_root, str(pid), "maps"), encoding="utf-8", errors="replace") as maps:
                self.mappings = parse_maps(maps.read())
        except OSError:
            self.mappings = []
        self._starts = [mapping.start for mapping in self.mappings]

    def find(self, address: int) -> Mapping | None:
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0 and address < self.mappings[index].end:
            return self.mappings[index]
        return None


class UserSymbolizer:
    """Frames of user stacks as `function` (or `module+0xoffset` when the file has no symbol there)."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._proc_root = proc_root
        self._maps: dict[int, ProcessMaps] = {}
        self._files: dict[tuple[str, int], ElfSymbols] = {}

    def remember(self, pid: int) -> None:
        """Read the process's maps now, while it runs (the profiler calls this for each new pid it sees)."""
        if pid and pid not in self._maps:
            maps = ProcessMaps(pid, self._proc_root)
            if maps.mappings:
                self._maps[pid] = maps

    def known(self, pid: int) -> bool:
        return pid in self._maps

    def _elf(self, maps: ProcessMaps, mapping: Mapping) -> ElfSymbols:
        key = (mapping.path, mapping.inode)
        symbols = self._files.get(key)
        if symbols is None:
            # Through the process's root: its own filesystem (a container's), even if the path is ours too.
            path = maps.root + mapping.path
            symbols = ElfSymbols.load(path if os.path.exists(path) else mapping.path)
            self._files[key] = symbols
        return symbols

    def frame(self, pid: int, address: int) -> str:
        maps = self._maps.get(pid)
        mapping = maps.find(address) if maps is not None else None
        if maps is None or mapping is None:
            return f"[unknown] 0x{address:x}"
        module = os.path.basename(mapping.path) or mapping.path or "[anon]"
        if not mapping.is_file:
            return f"[{module.strip('[]')}]"
        file_offset = address - mapping.start + mapping.offset
        symbols = self._elf(maps, mapping)
        vaddr = symbols.vaddr_of(file_offset)
        name = symbols.symbol_at(vaddr) if vaddr is not None else None
        return name if name else f"{module}+0x{file_offset:x}"
