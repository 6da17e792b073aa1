"""Kallsyms load time: `Kallsyms().load()` on the live /proc/kallsyms (the first symbol lookup of every run
that names drop locations or stack frames pays it once), against the floor of only reading the file.

The kernel generates /proc/kallsyms on every read (~120k+ lines), so reading it is most of the cost; the
parse is one regular expression over the whole text (netsleuth/kernel/kallsyms.py). Rounds alternate load and
read so a busy machine slows both alike; wall and CPU (process time) medians are printed. Needs root (or
kptr_restrict 0): otherwise the kernel shows every address as 0.

    python bench/kallsyms_load.py [--rounds N]

Was a wall-clock bound in tests/unit/test_kallsyms.py (under 1 s, 0.3 s on a quiet machine); the unit test
keeps what it checked besides (a live table of >10,000 symbols that round-trips an address).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from netsleuth.kernel.kallsyms import DEFAULT_KALLSYMS_PATH, Kallsyms  # noqa: E402


def _timed(work: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with open(DEFAULT_KALLSYMS_PATH) as live:
        if live.readline().startswith("0000000000000000"):
            print("kallsyms_load: /proc/kallsyms hides addresses here (needs root)", file=sys.stderr)
            return 2
    symbols = 0

    def load() -> None:
        nonlocal symbols
        table = Kallsyms()
        table.load()
        symbols = len(table)

    def read() -> None:
        Path(DEFAULT_KALLSYMS_PATH).read_bytes()

    loads, reads = [], []
    for _ in range(args.rounds):
        loads.append(_timed(load))
        reads.append(_timed(read))
    size = len(Path(DEFAULT_KALLSYMS_PATH).read_bytes())
    print(f"kallsyms_load: {symbols} text symbols from {size / 1e6:.1f} MB, {args.rounds} rounds (medians)")
    for name, runs in (("Kallsyms().load()", loads), ("read the file only (floor)", reads)):
        wall = statistics.median(run[0] for run in runs) * 1e3
        cpu = statistics.median(run[1] for run in runs) * 1e3
        print(f"  {name:<28} wall {wall:7.1f} ms   CPU {cpu:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
