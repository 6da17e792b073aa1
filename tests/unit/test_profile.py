"""profile without the kernel: configs, stacks merged by name, folded lines, the SVG flame graph's layout and
the speedscope document, and user frames named from ELF symbols (a PIE built here, mapped as the kernel
would map it)."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from netsleuth.diagnostics.profile import DIAGNOSTIC
from netsleuth.diagnostics.profile.flamegraph import build_tree, flamegraph_svg
from netsleuth.diagnostics.profile.records import StackRecord
from netsleuth.diagnostics.profile.session import ProfileDiagnostic, merge_stacks
from netsleuth.diagnostics.profile.speedscope import speedscope_document
from netsleuth.errors import UsageError
from netsleuth.kernel.context import KernelContext
from netsleuth.kernel.user_symbols import ElfSymbols, Mapping, ProcessMaps, UserSymbolizer, parse_maps

SVG = "{http://www.w3.org/2000/svg}"


def test_config_bounds_and_softirq_names() -> None:
    config = DIAGNOSTIC.config_from_json({"hz": "999", "comm": "nginx", "softirq": "net_rx"})
    assert (config.hz, config.comm, config.kernel_stacks_only) == (999, "nginx", True)
    context = KernelContext()
    try:
        session = ProfileDiagnostic(config, context)
        # NET_RX's place in /proc/softirqs on every kernel since 2.6, resolved when the session opens.
        assert (session._softirq, session._vector) == ("NET_RX", 3)
        # A task filter with --softirq selects the interrupted task: the run says so with its figures.
        (note,) = session.notes()
        with pytest.raises(UsageError, match="is not a softirq of this kernel"):
            ProfileDiagnostic(DIAGNOSTIC.config_from_json({"softirq": "BOGUS"}), context)
    finally:
        context.close()
    assert note.startswith("with --softirq NET_RX, --comm select the tasks the NET_RX softirq interrupted")
    assert DIAGNOSTIC.config_from_json({"softirq": "NET_RX"}).softirq_note() is None
    for values, words in (
        ({"hz": 0}, "hz must be a whole number from 1 to 10000"),
        ({"hz": 20000}, "hz must be a whole number from 1 to 10000"),
        ({"pid": "x"}, "is not a process id"),
        # It only counts and reports at the end: nothing to sample, and always a summary.
        ({"sample": 2}, "sample is not an option of profile"),
        ({"summary": True}, "summary is not an option of profile"),
    ):
        with pytest.raises(UsageError, match=words):
            DIAGNOSTIC.config_from_json(values)


def stack(frames: tuple[str, ...], count: int, pid: int = 7) -> StackRecord:
    return StackRecord(
        pid=pid,
        comm=frames[0],
        count=count,
        frames=frames,
        in_softirq=False,
        kernel_lost=False,
        user_lost=False,
    )


def test_stacks_with_the_same_names_merge_and_fold() -> None:
    merged = merge_stacks(
        [
            stack(("app", "main", "work"), 5),
            stack(("app", "main", "work"), 3),  # another return address inside `work`
            stack(("app", "main", "idle_loop"), 2),
            stack(("app", "main", "work"), 1, pid=8),
        ]
    )
    assert [(s.pid, s.count, s.folded) for s in merged] == [
        (7, 8, "app;main;work 8"),
        (7, 2, "app;main;idle_loop 2"),
        (8, 1, "app;main;work 1"),
    ]
    assert stack(("a;b", "c"), 1).folded == "a:b;c 1"  # ';' separates frames: never inside one


def test_flame_graph_widths_follow_samples_and_the_svg_parses() -> None:
    stacks = [(("app", "main", "work", "inner_[k]"), 75), (("app", "main", "idle"), 25)]
    tree = build_tree(stacks)
    assert tree.value == 100 and tree.children["app"].children["main"].children["work"].value == 75
    root = ElementTree.fromstring(flamegraph_svg(stacks, "test", "100 samples"))
    frames = {
        group.get("data-n"): (float(group.get("data-w") or 0), int(group.get("data-d") or 0))
        for group in root.iter(f"{SVG}g")
        if group.get("class") == "f"
    }
    assert frames["all"] == (1.0, 0)
    assert frames["main"] == (1.0, 2)
    assert frames["work"] == (0.75, 3) and frames["idle"] == (0.25, 3)
    assert frames["inner_[k]"] == (0.75, 4)
    titles = [title.text for title in root.iter(f"{SVG}title")]
    assert "work (75 samples, 75.00%)" in titles
    assert root.find(f"{SVG}script") is not None


def test_speedscope_document_shares_frames() -> None:
    document = speedscope_document([(("app", "main", "work"), 3), (("app", "main", "idle"), 1)], "p")
    assert [frame["name"] for frame in document["shared"]["frames"]] == ["app", "main", "work", "idle"]
    (profile,) = document["profiles"]
    assert profile["type"] == "sampled" and profile["samples"] == [[0, 1, 2], [0, 1, 3]]
    assert profile["weights"] == [3, 1] and profile["endValue"] == 4
    json.dumps(document)


MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234 /opt/app/bin/app
55d0c0a01000-55d0c0a02000 r-xp 00001000 08:01 1234 /opt/app/bin/app
7f0000000000-7f0000100000 r-xp 00028000 08:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7fff00000000-7fff00002000 r-xp 00000000 00:00 0 [vdso]
"""


def test_maps_keep_executable_mappings() -> None:
    assert parse_maps(MAPS) == [
        Mapping(0x55D0C0A01000, 0x55D0C0A02000, 0x1000, "/opt/app/bin/app", 1234),
        Mapping(0x7F0000000000, 0x7F0000100000, 0x28000, "/usr/lib/x86_64-linux-gnu/libc.so.6", 99),
        Mapping(0x7FFF00000000, 0x7FFF00002000, 0, "[vdso]", 0),
    ]


def test_pie_addresses_resolve_through_program_headers(tmp_path: Path) -> None:
    source = tmp_path / "pie.c"
    source.write_text(
        "__attribute__((noinline)) int netsleuth_unit_fn(int x) { return x * 3 + 1; }\n"
        "int main(int argc, char **argv) { return netsleuth_unit_fn(argc); }\n"
    )
    binary = tmp_path / "pie"
    subprocess.run(["gcc", "-O1", "-pie", "-fPIE", "-o", str(binary), str(source)], check=True)
    symbols = ElfSymbols.load(str(binary))
    assert symbols.build_id and len(symbols.build_id) == 40
    nm = subprocess.run(["nm", str(binary)], capture_output=True, text=True, check=True).stdout
    vaddr = next(int(line.split()[0], 16) for line in nm.splitlines() if line.endswith(" netsleuth_unit_fn"))
    # Where the kernel put the text segment: find its PT_LOAD and map it at a random page-aligned base.
    text = next(seg for seg in symbols.segments if seg[2] <= vaddr < seg[2] + seg[1])
    base = 0x5600_0000_0000
    start = base + (text[2] & ~0xFFF)
    mapping = Mapping(start, start + 0x10000, text[0] & ~0xFFF, str(binary), 1)
    address = start + (vaddr - (text[2] & ~0xFFF)) + 2
    maps = ProcessMaps.__new__(ProcessMaps)
    maps.pid, maps.root, maps.mappings, maps._starts = 1, "", [mapping], [mapping.start]
    symbolizer = UserSymbolizer()
    symbolizer._maps[1] = maps
    assert symbolizer.frame(1, address) == "netsleuth_unit_fn"
    assert symbolizer.frame(2, address) == f"[unknown] 0x{address:x}"
