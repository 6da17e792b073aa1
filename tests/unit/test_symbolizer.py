"""SourceSymbolizer against a small shared object compiled here with -g -O2.

The expected lines come from the compiler's own line table (`llvm-objdump -d -l`), never from offsets
hard-coded for one compiler version.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.kernel.kallsyms import Kallsyms
from netsleuth.kernel.symbolizer import (
    SourceFrame,
    SourceSymbolizer,
    find_debug_vmlinux,
    find_llvm_symbolizer,
)

COMPILER = shutil.which("gcc") or shutil.which("clang")
OBJDUMP = shutil.which("llvm-objdump")
NM = shutil.which("llvm-nm") or shutil.which("nm")

pytestmark = pytest.mark.skipif(
    COMPILER is None or OBJDUMP is None or NM is None or find_llvm_symbolizer() is None,
    reason="needs a C compiler and llvm (llvm-objdump, llvm-nm, llvm-symbolizer)",
)

# `net/demo.c` inside a fake source tree: `init/main.c` holds start_kernel so the build-directory prefix
# is stripped the way scripts/faddr2line strips it.
DEMO_C = """\
static inline int helper(int x)
{
\tint y = x * 3;          /* helper-first */
\ty ^= x >> 2;
\treturn y + 7;          /* helper-last */
}

__attribute__((noinline)) int leaf(int a)
{
\treturn a * a + 1;      /* leaf-body */
}

int caller(volatile int *p)
{
\tint acc = 0;
\tfor (int i = 0; i < *p; i++)
\t\tacc += helper(p[i]) + leaf(i);  /* call-site */
\treturn acc;
}
"""
# Two static functions with the same name and clearly different sizes, as in faddr2line's raw_ioctl example.
DUP_SMALL_C = """\
__attribute__((noinline)) static int dup(int x) { return x * 7 + 1; }
int use_small(int x) { return dup(x) + 2; }
"""
DUP_LARGE_C = """\
__attribute__((noinline)) static int dup(int x)
{
\tint s = 0;
\tfor (int i = 0; i < x; i++)
\t\ts += (i * x) ^ (s >> 1) ^ (s << 3);
\treturn s;
}
int use_large(int x) { return dup(x) + 3; }
"""
MAIN_C = """\
void start_kernel(void) { }
"""


@dataclass
class Built:
    elf: Path
    demo: Path
    symbols: dict[str, list[tuple[int, int]]]  # name → [(address, span to next symbol)], ascending

    def line_of(self, marker: str) -> int:
        return next(n for n, line in enumerate(self.demo.read_text().splitlines(), 1) if marker in line)


def _text_symbols(elf: Path) -> dict[str, list[tuple[int, int]]]:
    assert NM is not None
    listing = subprocess.run([NM, "-n", str(elf)], capture_output=True, text=True, check=True).stdout
    entries = [
        (int(address, 16), name)
        for address, kind, name in (line.split() for line in listing.splitlines() if len(line.split()) == 3)
        if kind in "tTwW"
    ]
    symbols: dict[str, list[tuple[int, int]]] = {}
    for index, (address, name) in enumerate(entries):
        following = [other for other, _ in entries[index + 1 :] if other > address]
        symbols.setdefault(name, []).append((address, following[0] - address if following else 0x10))
    return symbols


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    assert COMPILER is not None
    tree = tmp_path_factory.mktemp("tree")
    sources = {
        "net/demo.c": DEMO_C,
        "drivers/dup_small.c": DUP_SMALL_C,
        "net/dup_large.c": DUP_LARGE_C,
        "init/main.c": MAIN_C,
    }
    for relative, text in sources.items():
        (tree / relative).parent.mkdir(parents=True, exist_ok=True)
        (tree / relative).write_text(text)
    elf = tree / "demo.so"
    subprocess.run(
        [COMPILER, "-g", "-O2", "-shared", "-fPIC", "-nostdlib", "-o", str(elf)]
        + [str(tree / relative) for relative in sources],
        check=True,
    )
    return Built(elf, tree / "net/demo.c", _text_symbols(elf))


@pytest.fixture
def symbolizer(built: Built) -> Iterator[SourceSymbolizer]:
    with SourceSymbolizer(str(built.elf)) as instance:
        yield instance


def _line_table(elf: Path) -> Iterator[tuple[str, int, str, int]]:
    """(function, address, file, line) for every instruction, from llvm-objdump's line annotations."""
    assert OBJDUMP is not None
    listing = subprocess.run(
        [OBJDUMP, "-d", "-l", "--no-show-raw-insn", str(elf)], capture_output=True, text=True, check=True
    ).stdout
    function, file, line = "", "", 0
    for text in listing.splitlines():
        if header := re.match(r"^[0-9a-f]+ <([^>]+)>:", text):
            function = header.group(1)
        elif source := re.match(r"^; (\S+):(\d+)", text):
            file, line = source.group(1), int(source.group(2))
        elif instruction := re.match(r"^\s+([0-9a-f]+):", text):
            yield function, int(instruction.group(1), 16), file, line


def test_inlined_code_gives_the_inline_chain(built: Built, symbolizer: SourceSymbolizer) -> None:
    helper_lines = range(built.line_of("helper-first"), built.line_of("helper-last") + 1)
    caller_start = built.symbols["caller"][0][0]
    address, line = next(
        (address, line)
        for function, address, file, line in _line_table(built.elf)
        if function == "caller" and file.endswith("net/demo.c") and line in helper_lines
    )
    frames = symbolizer.symbolize("caller", address - caller_start)
    assert frames == [
        SourceFrame("helper", "net/demo.c", line, frames[0].column, inlined=True),
        SourceFrame("caller", "net/demo.c", built.line_of("call-site"), frames[1].column, inlined=False),
    ]
    assert frames[0].text() == f"helper at net/demo.c:{line}"


def test_noinline_function_is_a_single_frame(built: Built, symbolizer: SourceSymbolizer) -> None:
    frames = symbolizer.symbolize("leaf", 0)
    assert [(frame.function, frame.file, frame.line, frame.inlined) for frame in frames] == [
        ("leaf", "net/demo.c", built.line_of("leaf-body"), False)
    ]


def test_duplicate_static_names_are_reported_not_guessed(built: Built, symbolizer: SourceSymbolizer) -> None:
    (small_address, small_span), (large_address, large_span) = sorted(
        built.symbols["dup"], key=lambda symbol: symbol[1]
    )
    assert small_span < large_span
    ambiguous = symbolizer.lookup("dup", 2)
    assert ambiguous.ambiguous and ambiguous.frames == ()
    assert symbolizer.symbolize("dup", 2) == []
    files = {candidate.address: candidate.frames[-1].file for candidate in ambiguous.candidates}
    assert files == {small_address + 2: "drivers/dup_small.c", large_address + 2: "net/dup_large.c"}

    # The size kallsyms reports (`func+off/size`) picks one, as in faddr2line.
    sized = symbolizer.lookup("dup", 2, size=large_span)
    assert [candidate.address for candidate in sized.candidates] == [large_address + 2]
    assert sized.frames[-1].file == "net/dup_large.c"
    # An offset only the larger one covers is unambiguous by itself.
    assert symbolizer.symbolize("dup", small_span + 1)[-1].file == "net/dup_large.c"
    # So is the rank among same-named symbols (KASLR keeps their order).
    ranked = sorted(built.symbols["dup"])
    index = ranked.index((large_address, large_span))
    assert symbolizer.lookup("dup", 2, rank=(index, 2)).frames[-1].file == "net/dup_large.c"


def test_unknown_function_and_offset_past_the_end(built: Built, symbolizer: SourceSymbolizer) -> None:
    assert symbolizer.lookup("no_such_function", 0).candidates == ()
    leaf_span = built.symbols["leaf"][0][1]
    assert symbolizer.symbolize("leaf", leaf_span + 0x100) == []


def test_symbolize_address_through_kaslr_shifted_kallsyms(
    built: Built, symbolizer: SourceSymbolizer, tmp_path: Path
) -> None:
    # A running kernel's kallsyms: same names and order, every address moved by one random-looking slide.
    slide = 0xFFFFFFFF9A200000
    lines = [
        f"{address + slide:016x} t {name}"
        for name, entries in built.symbols.items()
        for address, _ in entries
    ]
    kallsyms_file = tmp_path / "kallsyms"
    kallsyms_file.write_text("\n".join(lines) + "\n")
    kallsyms = Kallsyms(str(kallsyms_file))

    caller_start = built.symbols["caller"][0][0]
    for offset in (0, 8, 0x10):
        assert symbolizer.symbolize_address(caller_start + slide + offset, kallsyms) == symbolizer.symbolize(
            "caller", offset
        )
    for address, _ in built.symbols["dup"]:
        frames = symbolizer.symbolize_address(address + slide + 1, kallsyms)
        assert len(frames) == 1 and frames[0].function == "dup"
    assert symbolizer.symbolize_address(0x1234, kallsyms) == []


def test_answers_are_cached(symbolizer: SourceSymbolizer) -> None:
    assert symbolizer.lookup("leaf", 1) is symbolizer.lookup("leaf", 1)


def test_close_stops_the_subprocess(built: Built) -> None:
    symbolizer = SourceSymbolizer(str(built.elf))
    symbolizer.symbolize("leaf", 0)
    process = symbolizer._process
    assert process is not None and process.poll() is None
    symbolizer.close()
    assert process.poll() is not None
    symbolizer.close()  # idempotent


def test_missing_llvm_symbolizer_says_install_llvm(built: Built) -> None:
    with pytest.raises(EnvironmentProblem, match="install llvm"):
        SourceSymbolizer(str(built.elf), llvm_symbolizer="/nonexistent/llvm-symbolizer")


def test_bad_elf_is_a_usage_error(tmp_path: Path) -> None:
    not_elf = tmp_path / "vmlinux"
    not_elf.write_bytes(b"#!/bin/sh\n")
    with pytest.raises(UsageError, match="not an ELF file"):
        SourceSymbolizer(str(not_elf)).symbolize("start_kernel", 0)
    with pytest.raises(UsageError, match="cannot read ELF file"):
        SourceSymbolizer(str(tmp_path / "absent"))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(UsageError, match="cannot read ELF file"):
        SourceSymbolizer(str(empty)).symbolize("start_kernel", 0)


def test_find_debug_vmlinux_skips_files_without_dwarf(built: Built, tmp_path: Path) -> None:
    assert COMPILER is not None
    release = "6.1.0-99-amd64"
    stripped = tmp_path / "boot" / f"vmlinux-{release}"
    stripped.parent.mkdir(parents=True)
    subprocess.run(
        [COMPILER, "-O2", "-shared", "-fPIC", "-nostdlib", "-o", str(stripped), str(built.demo)], check=True
    )
    assert find_debug_vmlinux(release, root=str(tmp_path)) is None

    debug = tmp_path / "usr" / "lib" / "debug" / "lib" / "modules" / release / "vmlinux"
    debug.parent.mkdir(parents=True)
    shutil.copy(built.elf, debug)
    assert find_debug_vmlinux(release, root=str(tmp_path)) == str(debug)
    assert find_debug_vmlinux("5.10.0-other", root=str(tmp_path)) is None
