"""The small BPF programs under tests/privileged/bpf/, compiled for a test with the clang `make bpf` uses.

They include only UAPI headers (<linux/bpf.h>, <bpf/bpf_helpers.h>), no vmlinux.h: each tests one loader
mechanism (perf buffers, the ring buffer fallback, failing loads), not a diagnostic.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["SOURCES", "compile_test_programs"]

SOURCES = Path(__file__).resolve().parent / "bpf"


def compile_test_programs(directory: Path) -> dict[str, Path]:
    """Compile every tests/privileged/bpf/*.bpf.c into `directory`; returns name -> object path."""
    multiarch = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True, check=True)
    objects: dict[str, Path] = {}
    for source in sorted(SOURCES.glob("*.bpf.c")):
        output = directory / source.name.replace(".bpf.c", ".bpf.o")
        subprocess.run(
            ["clang", "-target", "bpf", "-O2", "-g", f"-I/usr/include/{multiarch.stdout.strip()}",
             "-c", str(source), "-o", str(output)],
            check=True,
        )  # fmt: skip
        objects[source.name.removesuffix(".bpf.c")] = output
    return objects
