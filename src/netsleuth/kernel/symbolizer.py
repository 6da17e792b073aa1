"""`func+0xoff` → source file:line with the inline chain, the way the kernel's scripts/faddr2line does it.

Why by name and offset, not by address: with KASLR the running kernel's addresses differ from the ones in
the vmlinux ELF. faddr2line therefore looks the function up in the ELF's own symbol table, adds the offset
and asks addr2line about that address; the result does not depend on where the kernel was loaded. We do
the same, with `llvm-symbolizer --output-style=JSON --inlining` (its documented machine interface, one JSON
object per input line) kept running as a long-lived subprocess, and a small ELF64 .symtab reader instead of
`readelf`/`nm`.

Static functions can share a name (faddr2line's example: `raw_ioctl` in drivers/char/raw.c and in
net/ipv4/raw.c). Like faddr2line we keep only the symbols whose extent covers the offset and whose size
matches the size kallsyms reports; when that still leaves several, the address's rank among same-named
kallsyms symbols picks the ELF symbol of the same rank (KASLR shifts the whole image, so order is kept),
and otherwise the lookup reports every candidate instead of guessing.

Limitation: only the core kernel (vmlinux) is handled; a module's addresses would need that module's own
debug file (its .ko is a relocatable object with section-relative addresses).
"""

from __future__ import annotations

import atexit
import bisect
import functools
import json
import mmap
import os
import platform
import shutil
import struct
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.kernel.kallsyms import Kallsyms, default_kallsyms

__all__ = [
    "SourceCandidate",
    "SourceFrame",
    "SourceLookup",
    "SourceSymbolizer",
    "default_source_symbolizer",
    "find_debug_vmlinux",
    "find_llvm_symbolizer",
    "symbolize_address",
]

# llvm-symbolizer grew --output-style=JSON in LLVM 13.
_MINIMUM_LLVM = 13
_CACHE_LIMIT = 8192


@dataclass(frozen=True, slots=True)
class SourceFrame:
    """One level of the inline chain. `inlined` is True when this code was inlined into the next frame."""

    function: str
    file: str
    line: int
    column: int
    inlined: bool

    def text(self) -> str:
        """`function at file:line`, faddr2line's notation (the column is left out, as there)."""
        return f"{self.function} at {self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class SourceCandidate:
    """One ELF symbol that `func+off` may mean: its ELF address + offset, and the source chain there."""

    address: int
    symbol_size: int
    frames: tuple[SourceFrame, ...]


@dataclass(frozen=True, slots=True)
class SourceLookup:
    """The answer for `function+offset`: no candidate (unknown to this ELF), one, or several (ambiguous)."""

    function: str
    offset: int
    candidates: tuple[SourceCandidate, ...]

    @property
    def ambiguous(self) -> bool:
        return len(self.candidates) > 1

    @property
    def frames(self) -> tuple[SourceFrame, ...]:
        """The inline chain, innermost first, when the answer is unique; empty otherwise."""
        return self.candidates[0].frames if len(self.candidates) == 1 else ()


def find_debug_vmlinux(release: str | None = None, root: str = "/") -> str | None:
    """The first vmlinux with DWARF for kernel `release` (default: the running one) among the places distros
    and kernel builds put it, or None. Files without .debug_info (a stripped /boot/vmlinux) are skipped."""
    release = release or platform.release()
    candidates = (
        f"usr/lib/debug/boot/vmlinux-{release}",  # Debian/Ubuntu linux-image-*-dbg(sym)
        f"usr/lib/debug/boot/vmlinux-{release}.debug",  # SUSE kernel-*-debuginfo
        f"usr/lib/debug/lib/modules/{release}/vmlinux",  # Fedora/RHEL kernel-debuginfo
        f"usr/lib/debug/lib/modules/{release}/vmlinux.debug",
        f"usr/lib/debug/usr/lib/modules/{release}/vmlinux",
        f"usr/lib/debug/vmlinux-{release}",
        f"usr/lib/debug/vmlinux-{release}.debug",
        f"boot/vmlinux-{release}",
        f"lib/modules/{release}/build/vmlinux",  # a kernel built from source, `make modules_install`
        f"lib/modules/{release}/vmlinux",
    )
    for relative in candidates:
        path = os.path.join(root, relative)
        if os.path.isfile(path) and _has_debug_info(path):
            return path
    return None


def find_llvm_symbolizer() -> str | None:
    """`llvm-symbolizer` on PATH, else the newest versioned one (Debian's llvm-N packages install
    llvm-symbolizer-N and /usr/lib/llvm-N/bin/llvm-symbolizer)."""
    found = shutil.which("llvm-symbolizer")
    if found:
        return found
    for version in range(30, _MINIMUM_LLVM - 1, -1):
        found = shutil.which(f"llvm-symbolizer-{version}")
        if found:
            return found
        path = f"/usr/lib/llvm-{version}/bin/llvm-symbolizer"
        if os.access(path, os.X_OK):
            return path
    return None


# --- ELF64 symbol table reader (System V gABI, "Object Files" chapter) ---------------------------------

_ELF_MAGIC = b"\x7fELF"
_ELFCLASS64 = 2
_ELFDATA2LSB, _ELFDATA2MSB = 1, 2
_SHT_SYMTAB, _SHT_DYNSYM = 2, 11
_SHF_EXECINSTR = 0x4
_SHN_LORESERVE, _SHN_XINDEX = 0xFF00, 0xFFFF
_STT_NOTYPE, _STT_FUNC, _STT_GNU_IFUNC = 0, 2, 10
_SYMBOL_SIZE = 24  # sizeof(Elf64_Sym)


_Result = TypeVar("_Result")


@dataclass(frozen=True, slots=True)
class _ElfSection:
    name: str
    type: int
    flags: int
    address: int
    offset: int
    size: int
    link: int


@dataclass(frozen=True, slots=True)
class _ElfFunction:
    address: int
    span: int  # distance to the next code symbol or the section end, as faddr2line computes from `nm -n`


class _ElfImage:
    """Section headers and code symbols of one ELF64 file, read through mmap (a debug vmlinux is ~1 GB)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._order = "<"
        self._by_name: dict[bytes, list[tuple[int, int]]] | None = None  # read on first use
        self._starts: dict[int, list[int]] = {}
        self._read(self._parse)

    def _read(self, reader: Callable[[mmap.mmap], _Result]) -> _Result:
        try:
            with (
                open(self.path, "rb") as elf_file,
                mmap.mmap(elf_file.fileno(), 0, access=mmap.ACCESS_READ) as data,
            ):
                return reader(data)
        except (OSError, ValueError, IndexError, struct.error) as error:
            # ValueError: mmap of an empty file; IndexError/struct.error: a truncated or corrupt file.
            reason = (
                error.strerror if isinstance(error, OSError) and error.strerror else "truncated or corrupt"
            )
            raise UsageError(f"cannot read ELF file {self.path}: {reason}") from error

    def _parse(self, data: mmap.mmap) -> None:
        path = self.path
        if data[:4] != _ELF_MAGIC:
            raise UsageError(f"{path} is not an ELF file")
        if data[4] != _ELFCLASS64 or data[5] not in (_ELFDATA2LSB, _ELFDATA2MSB):
            raise UsageError(f"{path} is not a 64-bit ELF file; only 64-bit kernels are supported")
        order = self._order = "<" if data[5] == _ELFDATA2LSB else ">"
        header = struct.unpack_from(order + "HHIQQQIHHHHHH", data, 16)
        shoff, shentsize, shnum, shstrndx = header[5], header[10], header[11], header[12]
        if shoff == 0:
            raise UsageError(f"{path} has no section headers")
        section_format = struct.Struct(order + "IIQQQQIIQQ")
        first = section_format.unpack_from(data, shoff)
        # Extended numbering: counts that do not fit in 16 bits live in section 0 (gABI "Sections").
        shnum = shnum or first[5]
        if shstrndx == _SHN_XINDEX:
            shstrndx = first[6]
        raw = [section_format.unpack_from(data, shoff + index * shentsize) for index in range(shnum)]
        names_offset, names_size = raw[shstrndx][4], raw[shstrndx][5]
        names = bytes(data[names_offset : names_offset + names_size])
        self.sections = [
            _ElfSection(
                name=names[fields[0] : names.find(b"\0", fields[0])].decode(errors="replace"),
                type=fields[1],
                flags=fields[2],
                address=fields[3],
                offset=fields[4],
                size=fields[5],
                link=fields[6],
            )
            for fields in raw
        ]

    def has_debug_info(self) -> bool:
        return any(section.name in (".debug_info", ".zdebug_info") for section in self.sections)

    def _read_functions(self, data: mmap.mmap) -> None:
        order = self._order
        tables = [s for s in self.sections if s.type == _SHT_SYMTAB] or [
            s for s in self.sections if s.type == _SHT_DYNSYM
        ]
        if not tables:
            self._by_name, self._starts = {}, {}
            return
        table = tables[0]
        strings_section = self.sections[table.link]
        strings = bytes(data[strings_section.offset : strings_section.offset + strings_section.size])
        symbols = bytes(data[table.offset : table.offset + table.size])
        # Symbols in sections at or above SHN_LORESERVE would need SHT_SYMTAB_SHNDX; a linked vmlinux has
        # far fewer sections, so they are skipped rather than decoded.
        code_sections = {
            index
            for index, section in enumerate(self.sections)
            if section.flags & _SHF_EXECINSTR and 0 < index < _SHN_LORESERVE
        }
        by_name: dict[bytes, list[tuple[int, int]]] = {}  # name → [(section, address)]
        starts: dict[int, set[int]] = {}  # section → symbol addresses in it
        for name_offset, info, _other, section, value, _size in struct.iter_unpack(
            order + "IBBHQQ", symbols[: len(symbols) - len(symbols) % _SYMBOL_SIZE]
        ):
            if section not in code_sections or (info & 0xF) not in (_STT_NOTYPE, _STT_FUNC, _STT_GNU_IFUNC):
                continue
            name = strings[name_offset : strings.find(b"\0", name_offset)]
            # `$x`/`$d` are ARM mapping symbols and `.L` local labels; scripts/kallsyms.c drops both too.
            if not name or name.startswith((b"$", b".L")):
                continue
            by_name.setdefault(name, []).append((section, value))
            starts.setdefault(section, set()).add(value)
        self._by_name = by_name
        # Each section's symbol addresses, sorted, ending with the section's end: a symbol's extent is the
        # distance to the next higher entry (what faddr2line derives from `nm -n`).
        self._starts = {
            section: sorted(addresses | {self.sections[section].address + self.sections[section].size})
            for section, addresses in starts.items()
        }

    def functions_named(self, name: str) -> list[_ElfFunction]:
        """The code symbols called `name`, by address, each with its extent."""
        if self._by_name is None:
            self._read(self._read_functions)
        assert self._by_name is not None
        functions = []
        for section, address in sorted(self._by_name.get(name.encode(), []), key=lambda entry: entry[1]):
            starts = self._starts[section]
            following = bisect.bisect_right(starts, address)
            end = starts[following] if following < len(starts) else address
            functions.append(_ElfFunction(address, end - address))
        return functions


def _has_debug_info(path: str) -> bool:
    try:
        return _ElfImage(path).has_debug_info()
    except UsageError:
        return False


# --- llvm-symbolizer ----------------------------------------------------------------------------------


class SourceSymbolizer:
    """File:line (+ inline chain) for `func+off` in one ELF with DWARF, typically a debug vmlinux.

    The ELF is read and llvm-symbolizer started on the first lookup; answers are cached. Close it (or use it
    as a context manager) to stop the subprocess.
    """

    def __init__(self, elf_path: str, llvm_symbolizer: str | None = None) -> None:
        self.elf_path = elf_path
        executable = llvm_symbolizer or find_llvm_symbolizer()
        if executable is None or not os.access(executable, os.X_OK):
            raise EnvironmentProblem(
                "llvm-symbolizer was not found; install llvm (`apt-get install llvm`) to turn drop locations "
                "into source lines"
            )
        self._executable = executable
        if not os.path.isfile(elf_path):
            raise UsageError(f"cannot read ELF file {elf_path}: no such file")
        self._image: _ElfImage | None = None
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.RLock()
        self._lookups: dict[tuple[str, int, int | None, tuple[int, int] | None], SourceLookup] = {}
        self._chains: dict[int, tuple[SourceFrame, ...]] = {}
        self._source_prefix = ""
        self._closed = False

    # Lifecycle

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop llvm-symbolizer (EOF on its stdin ends it; kill it if it lingers)."""
        with self._lock:
            self._closed = True
            process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    # Lookups

    def lookup(
        self, function: str, offset: int, size: int | None = None, rank: tuple[int, int] | None = None
    ) -> SourceLookup:
        """Every source location `function+offset` may mean in this ELF.

        `size` is the symbol size from kallsyms (the `/0x..` of `func+off/size`); `rank` is (index, count) of
        this symbol among the running kernel's same-named symbols. Both only serve to disambiguate.
        """
        key = (function, offset, size, rank)
        with self._lock:
            cached = self._lookups.get(key)
            if cached is not None:
                return cached
            answer = SourceLookup(
                function,
                offset,
                tuple(
                    SourceCandidate(
                        symbol.address + offset, symbol.span, self._chain(symbol.address + offset)
                    )
                    for symbol in self._candidates(function, offset, size, rank)
                ),
            )
            if len(self._lookups) >= _CACHE_LIMIT:
                self._lookups.pop(next(iter(self._lookups)))
            self._lookups[key] = answer
            return answer

    def symbolize(self, function: str, offset: int, size: int | None = None) -> list[SourceFrame]:
        """The inline chain (innermost first) at `function+offset`; empty when unknown or ambiguous (see
        `lookup` for every candidate)."""
        return list(self.lookup(function, offset, size).frames)

    def symbolize_address(self, address: int, kallsyms: Kallsyms) -> list[SourceFrame]:
        """The inline chain for a running-kernel address, through its kallsyms name and offset."""
        symbol = kallsyms.resolve(address)
        if symbol is None or symbol.module is not None:
            return []
        same_name = kallsyms.symbols_named(symbol.name)
        ranks = [index for index, other in enumerate(same_name) if other.address == symbol.address]
        rank = (ranks[0], len(same_name)) if ranks else None
        return list(self.lookup(symbol.name, symbol.offset, symbol.size, rank).frames)

    def _candidates(
        self, function: str, offset: int, size: int | None, rank: tuple[int, int] | None
    ) -> list[_ElfFunction]:
        every = self._elf().functions_named(function)
        # faddr2line keeps offset == size too: a return address just past a call to a noreturn function at
        # the end of a function points there.
        covering = [symbol for symbol in every if 0 <= offset <= symbol.span]
        if size is not None:
            # faddr2line drops symbols whose size differs from the one given. The ELF may hold symbols that
            # kallsyms leaves out (and so different extents); keep everything rather than nothing then.
            covering = [symbol for symbol in covering if symbol.span == size] or covering
        if len(covering) > 1 and rank is not None and rank[1] == len(every) and every[rank[0]] in covering:
            covering = [every[rank[0]]]
        return covering

    def _elf(self) -> _ElfImage:
        if self._image is None:
            self._image = _ElfImage(self.elf_path)
        return self._image

    def _chain(self, address: int) -> tuple[SourceFrame, ...]:
        cached = self._chains.get(address)
        if cached is None:
            cached = self._parse_answer(self._ask(address))
            if len(self._chains) >= _CACHE_LIMIT:
                self._chains.pop(next(iter(self._chains)))
            self._chains[address] = cached
        return cached

    def _ask(self, address: int) -> dict[str, Any]:
        if self._closed:
            raise RuntimeError("SourceSymbolizer used after close()")
        process = self._process or self._start()
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(f"{address:#x}\n")
            process.stdin.flush()
            line = process.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        try:
            answer = json.loads(line) if line else None
        except json.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            self._process = None
            process.kill()
            process.wait()
            raise EnvironmentProblem(
                f"{self._executable} stopped answering about {self.elf_path}; netsleuth needs "
                f"llvm-symbolizer from LLVM {_MINIMUM_LLVM} or newer (for `--output-style=JSON`)"
            )
        return answer

    def _start(self) -> subprocess.Popen[str]:
        try:
            self._process = subprocess.Popen(
                [self._executable, "--output-style=JSON", "--inlining", f"--obj={self.elf_path}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # warnings about DWARF quirks; never block on a full pipe
                text=True,
                bufsize=1,
            )
        except OSError as error:
            raise EnvironmentProblem(f"cannot run {self._executable}: {error.strerror}") from error
        self._source_prefix = self._find_source_prefix()
        return self._process

    def _find_source_prefix(self) -> str:
        """The build directory to strip from file names. faddr2line's trick: start_kernel() lives in
        init/main.c, so whatever precedes that in its file name is the source tree's root."""
        start_kernel = self._elf().functions_named("start_kernel")
        if start_kernel:
            frames = self._parse_answer(self._ask(start_kernel[0].address), strip=False)
            if frames and frames[-1].file.endswith("init/main.c"):
                return frames[-1].file[: -len("init/main.c")]
        return ""

    def _parse_answer(self, answer: dict[str, Any], strip: bool = True) -> tuple[SourceFrame, ...]:
        symbols = answer.get("Symbol")
        if "Error" in answer or not isinstance(symbols, list):
            return ()
        entries = [entry for entry in symbols if isinstance(entry, dict)]
        # llvm-symbolizer prints an all-empty entry (FunctionName "", Line 0) for an address without DWARF.
        if not any(entry.get("FunctionName") or entry.get("Line") for entry in entries):
            return ()
        prefix = self._source_prefix if strip else ""
        return tuple(
            SourceFrame(
                function=str(entry.get("FunctionName") or "??"),
                file=_strip_prefix(str(entry.get("FileName") or "??"), prefix),
                line=int(entry.get("Line") or 0),
                column=int(entry.get("Column") or 0),
                # The JSON lists the innermost frame first; each one but the last was inlined into the next.
                inlined=position < len(entries) - 1,
            )
            for position, entry in enumerate(entries)
        )


def _strip_prefix(path: str, prefix: str) -> str:
    # faddr2line: sed "s; $dir_prefix\(\./\)*; ;"
    if not prefix or not path.startswith(prefix):
        return path
    relative = path[len(prefix) :]
    while relative.startswith("./"):
        relative = relative[2:]
    return relative or path


@functools.cache
def default_source_symbolizer() -> SourceSymbolizer | None:
    """A shared symbolizer for the running kernel's debug vmlinux, or None when the machine has none (or
    lacks llvm-symbolizer: source lines are an extra, never a reason to fail)."""
    path = find_debug_vmlinux()
    if path is None:
        return None
    try:
        symbolizer = SourceSymbolizer(path)
    except EnvironmentProblem:
        return None
    atexit.register(symbolizer.close)
    return symbolizer


def symbolize_address(address: int, kallsyms: Kallsyms | None = None) -> list[SourceFrame]:
    """The inline chain for a running-kernel address using the default debug vmlinux; empty when there is
    no debug vmlinux or the address is not in the core kernel."""
    symbolizer = default_source_symbolizer()
    if symbolizer is None:
        return []
    return symbolizer.symbolize_address(address, kallsyms or default_kallsyms())
