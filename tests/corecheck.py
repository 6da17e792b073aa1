"""Do the committed objects' CO-RE relocations hold on another kernel? Two checks against that kernel's BTF:

- offline (`unresolved_relocations`): `bpftool -d gen min_core_btf` runs libbpf's own relocation code
  (bpf_core_calc_relo_insn) for every relocation of every program and logs "no matching targets found" for
  each one the BTF cannot satisfy. A field-existence check that finds nothing is its purpose; anything else
  would be patched into an invalid instruction that only dead code may contain.
- in the kernel (`load_raw_tp_relocated`): libbpf relocates the raw_tp programs against that BTF
  (bpf_object_open_opts.btf_custom_path) and the running kernel's verifier loads them; a relocation that
  failed outside dead code is refused there ("invalid func unknown#195896080", libbpf's poison call).
  raw_tp programs read kernel memory with bpf_probe_read_kernel, so the verifier accepts another kernel's
  offsets; tp_btf programs are checked against the running kernel's types and are left out.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from netsleuth.bpf import _libbpf
from netsleuth.bpf.errors import VerifierError, last_errno_error

__all__ = ["Relocation", "load_raw_tp_relocated", "program_sections", "unresolved_relocations"]

_LOG_SIZE = 1 << 20
# libbpf: prog 'raw_tp/kfree_skb': relo #9: <byte_off> [72] struct sk_buff.data (0:10 @ offset 48)
# libbpf: prog 'tp_btf/kfree_skb': relo #5: <enumval_exists> [92] enum skb_drop_reason::SKB_CONSUMED = 1
# libbpf: prog 'tp_btf/kfree_skb': relo #1: <type_id> [94] struct sk_buff
_RELO = re.compile(r"prog '([^']+)': relo #(\d+): <(\w+)> \[\d+\] (.+?)(?: \(.*| = .*)?$")
_UNRESOLVED = re.compile(r"prog '([^']+)': relo #(\d+): no matching targets found")


@dataclass(frozen=True, order=True)
class Relocation:
    program: str  # section name, e.g. raw_tp/kfree_skb
    kind: str  # byte_off, field_exists, ...
    target: str  # e.g. struct sock.sk_flags


def unresolved_relocations(btf: Path, bpf_object: Path) -> list[Relocation]:
    """Every relocation of `bpf_object` that `btf` cannot satisfy, as libbpf itself decides."""
    with tempfile.TemporaryDirectory() as scratch:
        result = subprocess.run(
            ["bpftool", "-d", "gen", "min_core_btf", str(btf), f"{scratch}/out.btf", str(bpf_object)],
            capture_output=True,
            text=True,
        )
    if result.returncode != 0:
        raise RuntimeError(f"bpftool gen min_core_btf failed on {bpf_object.name}: {result.stderr[-2000:]}")
    described: dict[tuple[str, str], Relocation] = {}
    unresolved: list[Relocation] = []
    for line in result.stderr.splitlines():
        if match := _RELO.search(line):
            key = (match[1], match[2])
            described.setdefault(key, Relocation(match[1], match[3], match[4]))
        elif match := _UNRESOLVED.search(line):
            unresolved.append(described[(match[1], match[2])])
    if not described:
        raise RuntimeError(f"bpftool printed no relocations for {bpf_object.name}: is it a CO-RE object?")
    return sorted(unresolved)


def load_raw_tp_relocated(btf: Path, bpf_object: Path) -> list[str]:
    """Relocate the raw_tp programs against `btf` and load them into the running kernel; returns their
    section names. Raises VerifierError (with the verifier's log) when the kernel refuses them."""
    lib = _libbpf.lib()
    opts = _libbpf.ObjectOpenOpts(sz=ctypes.sizeof(_libbpf.ObjectOpenOpts), btf_custom_path=str(btf).encode())
    with _libbpf.capture_messages() as messages:
        handle = lib.bpf_object__open_file(str(bpf_object).encode(), ctypes.byref(opts))
    if not handle:
        raise last_errno_error(f"cannot open {bpf_object.name}", messages)
    try:
        loaded: list[str] = []
        buffers: list[ctypes.Array[ctypes.c_char]] = []
        program = lib.bpf_object__next_program(handle, None)
        while program:
            section = lib.bpf_program__section_name(program).decode()
            wanted = section.startswith("raw_tp/")
            lib.bpf_program__set_autoload(program, wanted)
            if wanted:
                loaded.append(section)
                buffer = ctypes.create_string_buffer(_LOG_SIZE)
                buffers.append(buffer)
                lib.bpf_program__set_log_buf(program, buffer, _LOG_SIZE)
            program = lib.bpf_object__next_program(handle, program)
        with _libbpf.capture_messages() as messages:
            result = lib.bpf_object__load(handle)
            number = ctypes.get_errno()
        if result != 0:
            log = "\n".join(buffer.value.decode(errors="replace") for buffer in buffers).strip()
            raise VerifierError(
                f"{bpf_object.name} relocated against {btf.name} was refused", number, log, messages
            )
        return loaded
    finally:
        lib.bpf_object__close(handle)


def program_sections(bpf_object: Path) -> list[str]:
    """The section names (e.g. raw_tp/kfree_skb) of every program in the object; opening needs no root."""
    lib = _libbpf.lib()
    with _libbpf.capture_messages() as messages:
        handle = lib.bpf_object__open_file(str(bpf_object).encode(), None)
    if not handle:
        raise last_errno_error(f"cannot open {bpf_object.name}", messages)
    try:
        sections: list[str] = []
        program = lib.bpf_object__next_program(handle, None)
        while program:
            sections.append(lib.bpf_program__section_name(program).decode())
            program = lib.bpf_object__next_program(handle, program)
        return sections
    finally:
        lib.bpf_object__close(handle)
