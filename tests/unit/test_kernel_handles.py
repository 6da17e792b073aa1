"""A map, program or config field renamed in C fails `make test` instead of silently opening a filter.

Each test renames something in a copy of bpf/, compiles that object with the flags of `make bpf`, and runs
what `make bpf` runs on it (netsleuth.bpf.abigen) - then shows the check that catches it: the generator
refuses an object without the shared filter's maps or fields; the generated config struct takes no field it
does not have and fill_filter_config fails closed; a diagnostic whose programs are gone fails at import; a map
the Python code uses is no attribute of the regenerated class, and mypy (`make typecheck`) fails.
(`make check-bpf` fails first on the stale committed object; these are what fails once it is rebuilt.)
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from netsleuth.bpf import abigen
from netsleuth.bpf.errors import BpfError
from netsleuth.diagnostics.filter_maps import fill_filter_config
from netsleuth.diagnostics.filters import PacketFilter

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "src" / "netsleuth" / "_generated"
CLANG = os.environ.get("CLANG", "clang")


def _build(tmp_path: Path, name: str, renames: list[tuple[str, str, str]]) -> Path:
    """bpf/NAME.bpf.c compiled from a copy of bpf/ with each (file, old, new) replaced everywhere, beside
    copies of the other committed objects; returns their directory."""
    sources = tmp_path / "bpf"
    shutil.copytree(REPO / "bpf", sources)
    for file, old, new in renames:
        text = (sources / file).read_text()
        assert old in text, f"{old!r} is not in bpf/{file}: update this test"
        (sources / file).write_text(text.replace(old, new))
    objects = tmp_path / "objects"
    objects.mkdir()
    for committed in GENERATED.glob("*.bpf.o"):
        shutil.copy(committed, objects)
    command = [CLANG, "-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86", "-Iinclude", "-I."]
    subprocess.run(
        [*command, "-c", f"{name}.bpf.c", "-o", str(objects / f"{name}.bpf.o")], cwd=sources, check=True
    )
    return objects


def _unchecked(name: str) -> list[abigen.ModuleSpec]:
    """The spec of module `name` without the generator's filter check."""
    return [dataclasses.replace(spec, filter="") for spec in abigen.MODULES if spec.name == name]


def test_a_renamed_filter_map_is_refused_by_the_generator(tmp_path: Path) -> None:
    objects = _build(tmp_path, "drops", [("filter_maps.bpf.h", "netns_filter", "netns_set_v2")])
    with pytest.raises(abigen.AbiError, match=r"drops.bpf.o has no map netns_filter: every object with the"):
        abigen.generate(objects)


def test_a_renamed_config_field_is_refused_and_never_leaves_its_filter_open(tmp_path: Path) -> None:
    objects = _build(
        tmp_path,
        "drops",
        [
            ("drops.h", "__u32 netns;\t\t   /* netns inode to keep */", "__u32 netns_inode;"),
            ("drops.bpf.c", "ns_netns_matches(cfg.netns,", "ns_netns_matches(cfg.netns_inode,"),
        ],
    )
    with pytest.raises(abigen.AbiError, match=r"struct drops_config has no netns: the packet filter"):
        abigen.generate(objects)
    # Past the generator (its check off), the struct itself refuses the old name, and filling the filter
    # fails closed - with or without a --netns - rather than skip the field it cannot find.
    module = types.ModuleType("renamed_drops_abi")
    exec(abigen.generate(objects, _unchecked("drops_abi"))["drops_abi.py"], module.__dict__)
    cfg = module.DropsConfigC()
    with pytest.raises(AttributeError):
        cfg.netns = 4026531840
    for packet_filter in (PacketFilter(netns=4026531840), PacketFilter()):
        with pytest.raises(BpfError, match=r"struct drops_config has no netns: the filter cannot be applied"):
            fill_filter_config(cfg, packet_filter)


def _write_module(tmp_path: Path, objects: Path, name: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(abigen.generate(objects)[f"{name}.py"])
    return path


def test_a_renamed_program_fails_every_import_of_its_diagnostic(tmp_path: Path) -> None:
    objects = _build(
        tmp_path, "softirq", [("softirq.bpf.c", "SIRQ_ENTRY(sirq_raise,", "SIRQ_ENTRY(sirq_up,")]
    )
    module = _write_module(tmp_path, objects, "softirq_abi")
    load = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('netsleuth._generated.softirq_abi', sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules[spec.name] = module\n"
        "spec.loader.exec_module(module)\n"
        "import netsleuth.diagnostics.softirq.session\n"
    )
    run = subprocess.run([sys.executable, "-c", load, str(module)], capture_output=True, text=True)
    assert run.returncode != 0
    assert "softirq.bpf.o has no program sirq_raise_b, sirq_raise_r" in run.stderr


def test_a_renamed_map_the_python_code_uses_fails_the_typecheck(tmp_path: Path) -> None:
    objects = _build(tmp_path, "snoop", [("snoop.bpf.c", "snoop_stats", "snoop_counters")])
    module = _write_module(tmp_path, objects, "snoop_abi")
    # `make test` runs `make typecheck` first: start from its cache, so only what the rename touches is
    # checked again (a copy: the shadowed module must not enter the tree's own cache).
    cache = tmp_path / "mypy_cache"
    if (REPO / ".mypy_cache").is_dir():
        shutil.copytree(REPO / ".mypy_cache", cache)
    session = REPO / "src" / "netsleuth" / "diagnostics" / "snoop" / "session.py"
    shadowed = GENERATED / "snoop_abi.py"
    mypy = [sys.executable, "-m", "mypy", "--cache-dir", str(cache)]
    run = subprocess.run(
        [*mypy, "--shadow-file", str(shadowed), str(module), str(session)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert 'has no attribute "snoop_stats"' in run.stdout
    assert "    snoop_counters = MapAttr(" in module.read_text()
