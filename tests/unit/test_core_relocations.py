"""The committed objects' CO-RE relocations, checked offline against Debian 12's own 6.1 kernel (the types
its BTF gives them, tests/fixtures/kernel/btf/, recorded by record_debian_btf.py) and the running kernel's.

If this fails after a change to bpf/: either that kernel lacks what the new code reads (guard it with
bpf_core_field_exists and add it to ALLOWED with the reason), or the fixture predates the new field (re-run
`tests/fixtures/kernel/record_debian_btf.py`, which downloads Debian's 6.1 image and regenerates it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from netsleuth.bpf.btf import VMLINUX_BTF
from tests.corecheck import program_sections, unresolved_relocations

REPO = Path(__file__).resolve().parents[2]
KERNEL_FIXTURES = REPO / "tests" / "fixtures" / "kernel"
DEBIAN_6_1 = "6.1.0-56-cloud-amd64"
DEBIAN_6_1_BTF = KERNEL_FIXTURES / "btf" / f"{DEBIAN_6_1}.min.btf"
OBJECTS = {
    path.name.removesuffix(".bpf.o"): path for path in (REPO / "src/netsleuth/_generated").glob("*.bpf.o")
}

# Relocations allowed not to resolve, each guarded in the C so the instruction is dead code there.
ALLOWED = {
    # tcp.bpf.c sock_flags_word(): reads sock.sk_flags only when bpf_core_field_exists(skc_flags) says the
    # flags have not moved into sock_common; on 6.1 and 6.18 they have, so this read is eliminated.
    ("byte_off", "struct sock.sk_flags"),
}


def test_the_objects_are_there() -> None:
    assert set(OBJECTS) >= {"drops", "tcp"}
    assert DEBIAN_6_1_BTF.stat().st_size < 16_000  # a minimal BTF, not a kernel's 4 MB


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_relocations_resolve_on_debian_6_1(name: str) -> None:
    unresolved = unresolved_relocations(DEBIAN_6_1_BTF, OBJECTS[name])
    assert {(relo.kind, relo.target) for relo in unresolved} <= ALLOWED, unresolved


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_relocations_resolve_on_this_kernel(name: str) -> None:
    if not VMLINUX_BTF.exists():
        pytest.skip("kernel without BTF (/sys/kernel/btf/vmlinux)")  # a failure in CI (tests/conftest.py)
    unresolved = unresolved_relocations(VMLINUX_BTF, OBJECTS[name])
    assert {(relo.kind, relo.target) for relo in unresolved} <= ALLOWED, unresolved


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_every_attached_tracepoint_exists_on_debian_6_1(name: str) -> None:
    arity = json.loads((KERNEL_FIXTURES / f"tracepoints-{DEBIAN_6_1}.json").read_text())["arity"]
    # Classic tracepoints are named group/event; syscall events have no btf_trace_ prototype (they are made
    # by CONFIG_FTRACE_SYSCALLS on every kernel since 2.6.33), so only the others are looked up.
    tracepoints = {
        section.rsplit("/", 1)[1]
        for section in program_sections(OBJECTS[name])
        if section.startswith(("raw_tp/", "tp_btf/", "tracepoint/"))
        and not section.startswith("tracepoint/syscalls/")
    }
    assert tracepoints <= set(arity), f"record these tracepoints too: {tracepoints - set(arity)}"
    assert all(arity[tracepoint] is not None for tracepoint in tracepoints)


def test_the_check_catches_a_kernel_without_the_types(tmp_path: Path) -> None:
    # A BTF holding only what drops needs lacks tcp_sock & co: the tcp object's reads of them must show up.
    drops_only = tmp_path / "drops-only.btf"
    subprocess.run(
        ["bpftool", "gen", "min_core_btf", str(DEBIAN_6_1_BTF), str(drops_only), str(OBJECTS["drops"])],
        check=True,
        capture_output=True,
    )
    targets = {relo.target for relo in unresolved_relocations(drops_only, OBJECTS["tcp"])}
    assert "struct inet_connection_sock.icsk_retransmits" in targets
    assert not {(relo.kind, relo.target) for relo in unresolved_relocations(drops_only, OBJECTS["drops"])}
