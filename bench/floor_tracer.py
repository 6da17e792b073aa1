"""Attach empty programs of bench/floor.bpf.c (built by build_floor) and hold them until SIGINT or SIGTERM.

    python bench/floor_tracer.py OBJECT READY_FILE PROGRAM [PROGRAM ...]

READY_FILE is created once every program is attached (as netsleuth's --ready-file). Only the named programs
are loaded."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from netsleuth.bpf.object import BpfObject

REPO = Path(__file__).resolve().parents[1]
FLOOR_PROGRAMS = (
    "kfree_skb_floor",
    "sirq_raise_floor",
    "sirq_entry_floor",
    "sirq_exit_floor",
    "napi_poll_floor",
    "sirq_raise_clk",  # the _clk ones read the clock once: a softirq timer's least work
    "sirq_entry_clk",
    "sirq_exit_clk",
)


def build_floor(directory: Path) -> Path:
    """bench/floor.bpf.c, compiled with the product's flags (Makefile BPF_CFLAGS) into `directory`."""
    obj = directory / "floor.bpf.o"
    subprocess.run(
        [
            "clang", "-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86",
            f"-I{REPO / 'bpf' / 'include'}", f"-I{REPO / 'bpf'}",
            "-c", str(REPO / "bench" / "floor.bpf.c"), "-o", str(obj),
        ],
        check=True,
    )  # fmt: skip
    return obj


def floor_argv(obj: Path, ready: Path, programs: tuple[str, ...]) -> list[str]:
    """The command that holds `programs` attached (for bench.harness.Tracer)."""
    return [sys.executable, str(Path(__file__).resolve()), str(obj), str(ready), *programs]


def main() -> int:
    object_path, ready, programs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    unknown = sorted(set(programs) - set(FLOOR_PROGRAMS))
    if not programs or unknown:
        sys.exit(f"name programs of {', '.join(FLOOR_PROGRAMS)}")
    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with BpfObject(object_path) as floor:
        for name in FLOOR_PROGRAMS:
            floor.set_autoload(name, name in programs)
        floor.load(programs)
        for name in programs:
            floor.attach(name)
        ready.touch()
        while not stop:
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
