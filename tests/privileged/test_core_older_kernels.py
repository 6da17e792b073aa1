"""The committed objects relocated for Debian 12's 6.1 kernels (their BTF, tests/fixtures/kernel/btf/, amd64's
and arm64's) and loaded by this kernel's verifier: a relocation that does not hold on 6.1 outside dead code is
refused. raw_tp programs read kernel memory with bpf_probe_read_kernel, so this x86 kernel's verifier takes
arm64's offsets too: what it checks is that libbpf resolved every live relocation for that kernel."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from netsleuth.bpf.errors import VerifierError
from tests.corecheck import load_raw_tp_relocated, program_sections
from tests.unit.test_core_relocations import DEBIAN_6_1_BTF, DEBIAN_KERNELS, KERNEL_FIXTURES, OBJECTS


@pytest.mark.parametrize("arch", sorted(DEBIAN_KERNELS))
@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_raw_tp_programs_relocated_for_6_1_pass_the_verifier(name: str, arch: str) -> None:
    raw_tp = [section for section in program_sections(OBJECTS[name]) if section.startswith("raw_tp/")]
    if not raw_tp:
        return  # e.g. a cgroup-skb object: nothing read through CO-RE offsets from a raw tracepoint
    btf = KERNEL_FIXTURES / "btf" / f"{DEBIAN_KERNELS[arch]}.min.btf"
    assert load_raw_tp_relocated(btf, OBJECTS[name]) == raw_tp


def test_a_kernel_without_the_types_is_refused_with_the_relocation_named(tmp_path: Path) -> None:
    drops_only = tmp_path / "drops-only.btf"
    subprocess.run(
        ["bpftool", "gen", "min_core_btf", str(DEBIAN_6_1_BTF), str(drops_only), str(OBJECTS["drops"])],
        check=True,
        capture_output=True,
    )
    with pytest.raises(VerifierError) as caught:
        load_raw_tp_relocated(drops_only, OBJECTS["tcp"])
    assert "failed to resolve CO-RE relocation" in caught.value.log
