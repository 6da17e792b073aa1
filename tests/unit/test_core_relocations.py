"""The committed objects' CO-RE relocations, checked offline against Debian 12's own 6.1 kernels for amd64 and
arm64 (the types their BTF gives them, tests/fixtures/kernel/btf/, recorded by record_debian_btf.py) and the
running kernel's. One set of objects serves both architectures: `make check-bpf` builds every object with
-D__TARGET_ARCH_x86 and -D__TARGET_ARCH_arm64 and requires both to be the committed bytes.

If this fails after a change to bpf/: either that kernel lacks what the new code reads (guard it with
bpf_core_field_exists and add it to ALLOWED with the reason), or the fixture predates the new field (re-run
`tests/fixtures/kernel/record_debian_btf.py` and `... --arch arm64`, which download Debian's 6.1 images and
regenerate them).
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
DEBIAN_6_1_ARM64 = "6.1.0-56-cloud-arm64"
# Each architecture's Debian 12 kernel, by Debian architecture name.
DEBIAN_KERNELS = {"amd64": DEBIAN_6_1, "arm64": DEBIAN_6_1_ARM64}
OBJECTS = {
    path.name.removesuffix(".bpf.o"): path for path in (REPO / "src/netsleuth/_generated").glob("*.bpf.o")
}

# Relocations allowed not to resolve, each guarded in the C so the instruction is dead code there.
ALLOWED = {
    # tcp.bpf.c sock_flags_word(): reads sock.sk_flags only when bpf_core_field_exists(skc_flags) says the
    # flags have not moved into sock_common; on 6.1 and 6.18 they have, so this read is eliminated.
    ("byte_off", "struct sock.sk_flags"),
    # drops.bpf.c asks the kernel's BTF what skb:kfree_skb offers (a question whose answer is "no" on 6.1):
    # SKB_CONSUMED is a reason from 6.3 on (KERNEL_REASON reads its value only where it exists), rx_sk came
    # with 6.11 (has_rx_sk()).
    ("enumval_exists", "enum skb_drop_reason___ns::SKB_CONSUMED___ns"),
    ("enumval_value", "enum skb_drop_reason___ns::SKB_CONSUMED___ns"),
    ("field_exists", "struct trace_event_raw_kfree_skb___ns.rx_sk"),
    # drops.bpf.c leaves netsleuth's own QUEUE_PURGE drops out (bpf/own_sockets.bpf.h): KERNEL_REASON asks
    # whether the kernel has that reason, which 6.1 does not, and the comparison is then with ~0, never true.
    ("enumval_exists", "enum skb_drop_reason___ns::SKB_DROP_REASON_QUEUE_PURGE___ns"),
    ("enumval_value", "enum skb_drop_reason___ns::SKB_DROP_REASON_QUEUE_PURGE___ns"),
}
# Tracepoints of programs loaded only where the kernel has them (the loader asks its BTF first).
OPTIONAL_TRACEPOINTS = {
    "sock_send_length": "drops' own-socket marker, 6.3+ (DropsSession._can_mark_own)",
}


def test_the_objects_are_there() -> None:
    assert set(OBJECTS) >= {"drops", "tcp"}
    for release in DEBIAN_KERNELS.values():
        assert (KERNEL_FIXTURES / "btf" / f"{release}.min.btf").stat().st_size < 16_000  # not a kernel's 4 MB


def test_the_arm64_btf_is_arm64s() -> None:
    # Recorded from arm64's own kernel, not a copy of amd64's: char is unsigned there (the AAPCS64 ABI).
    dumps = {
        arch: subprocess.run(
            ["bpftool", "btf", "dump", "file", str(KERNEL_FIXTURES / "btf" / f"{release}.min.btf")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for arch, release in DEBIAN_KERNELS.items()
    }
    assert "INT 'char' size=1 bits_offset=0 nr_bits=8 encoding=SIGNED" in dumps["amd64"]
    assert "INT 'char' size=1 bits_offset=0 nr_bits=8 encoding=(none)" in dumps["arm64"]


@pytest.mark.parametrize("arch", sorted(DEBIAN_KERNELS))
@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_relocations_resolve_on_debian_6_1(name: str, arch: str) -> None:
    btf = KERNEL_FIXTURES / "btf" / f"{DEBIAN_KERNELS[arch]}.min.btf"
    unresolved = unresolved_relocations(btf, OBJECTS[name])
    assert {(relo.kind, relo.target) for relo in unresolved} <= ALLOWED, unresolved


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_relocations_resolve_on_this_kernel(name: str) -> None:
    if not VMLINUX_BTF.exists():
        pytest.skip("kernel without BTF (/sys/kernel/btf/vmlinux)")  # a failure in CI (tests/conftest.py)
    unresolved = unresolved_relocations(VMLINUX_BTF, OBJECTS[name])
    assert {(relo.kind, relo.target) for relo in unresolved} <= ALLOWED, unresolved


@pytest.mark.parametrize("arch", sorted(DEBIAN_KERNELS))
@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_every_attached_tracepoint_exists_on_debian_6_1(name: str, arch: str) -> None:
    arity = json.loads((KERNEL_FIXTURES / f"tracepoints-{DEBIAN_KERNELS[arch]}.json").read_text())["arity"]
    # Classic tracepoints are named group/event; syscall events have no btf_trace_ prototype (they are made
    # by CONFIG_FTRACE_SYSCALLS on every kernel since 2.6.33), so only the others are looked up.
    tracepoints = {
        section.rsplit("/", 1)[1]
        for section in program_sections(OBJECTS[name])
        if section.startswith(("raw_tp/", "tp_btf/", "tracepoint/"))
        and not section.startswith("tracepoint/syscalls/")
    }
    assert tracepoints <= set(arity), f"record these tracepoints too: {tracepoints - set(arity)}"
    assert all(arity[tracepoint] is not None for tracepoint in tracepoints - set(OPTIONAL_TRACEPOINTS))


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
    assert {
        (relo.kind, relo.target) for relo in unresolved_relocations(drops_only, OBJECTS["drops"])
    } <= ALLOWED
