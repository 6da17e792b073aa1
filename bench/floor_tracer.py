"""Attach bench/kfree_skb_floor.bpf.c (built by bench/drops_storm.py) and hold it until SIGINT or SIGTERM.

    python bench/floor_tracer.py OBJECT READY_FILE

READY_FILE is created once the program is attached (as netsleuth's --ready-file)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from netsleuth.bpf.object import BpfObject

PROGRAM = "kfree_skb_floor"


def main() -> int:
    object_path, ready = Path(sys.argv[1]), Path(sys.argv[2])
    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with BpfObject(object_path) as program:
        program.load([PROGRAM])
        program.attach(PROGRAM)
        ready.touch()
        while not stop:
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
