"""Btf.vmlinux reads raw BTF through a read-only mapping (one copy) and anything else through btf__parse:
both must give libbpf the same types as btf__parse alone."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from netsleuth.bpf import _libbpf
from netsleuth.bpf.btf import VMLINUX_BTF, Btf

_FIXTURE = Path(__file__).parents[1] / "fixtures" / "kernel" / "btf" / "6.1.0-56-cloud-amd64.min.btf"
_ELF_OBJECT = Path(__file__).parents[2] / "src" / "netsleuth" / "_generated" / "drops.bpf.o"


def _parsed(path: Path) -> Btf:
    return Btf(_libbpf.lib().btf__parse(str(path).encode(), None))


def _types(btf: Btf) -> list[tuple[int, str, int]]:
    records = []
    type_id = 1
    while (record := btf.record(type_id)) is not None:
        records.append((record.kind, record.name, record.vlen))
        type_id += 1
    return records


def test_raw_btf_file_is_mapped_and_reads_as_parsed() -> None:
    with _libbpf.mapped_readonly(str(_FIXTURE)) as mapped:
        assert mapped is not None
        address, size = mapped
        assert size == _FIXTURE.stat().st_size
        assert ctypes.string_at(address, 2) == _FIXTURE.read_bytes()[:2]  # the BTF magic, 0xeb9f
    with Btf.vmlinux(_FIXTURE) as loaded, _parsed(_FIXTURE) as parsed:
        assert _types(loaded) == _types(parsed)
        assert loaded.struct_size("sk_buff") == parsed.struct_size("sk_buff") == 232


def test_elf_object_falls_back_to_btf_parse() -> None:
    with Btf.vmlinux(_ELF_OBJECT) as loaded, _parsed(_ELF_OBJECT) as parsed:
        assert _types(loaded) == _types(parsed)
        assert loaded.struct_size("drops_config") is not None


def test_unmappable_files_are_none(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with _libbpf.mapped_readonly(str(empty)) as mapped:
        assert mapped is None
    with _libbpf.mapped_readonly(str(tmp_path / "absent")) as mapped:
        assert mapped is None


def test_running_kernel_btf_reads_as_parsed() -> None:
    if not VMLINUX_BTF.exists():
        pytest.skip("this kernel has no BTF")
    with Btf.vmlinux() as loaded, _parsed(VMLINUX_BTF) as parsed:
        assert loaded.enum("skb_drop_reason") == parsed.enum("skb_drop_reason")
        assert loaded.tracepoint_arity("kfree_skb") == parsed.tracepoint_arity("kfree_skb")
        assert loaded.struct_size("sk_buff") == parsed.struct_size("sk_buff")
