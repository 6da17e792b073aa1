"""Benchmark: `netsleuth doctor --interval 1` in a namespace holding 100 veth pairs (200 interfaces) must
finish within interval + 1 s. Prints the wall time of three runs against that budget; removes everything.

    sudo .venv/bin/python bench/doctor_veth.py [--pairs 100] [--interval 1] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def _run(*argv: str, input_text: str | None = None) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, input=input_text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    netns = f"nsbench{os.getpid()}"
    _run("ip", "netns", "add", netns)
    try:
        batch = "".join(
            f"link add vb{pair}a type veth peer name vb{pair}b\n"
            f"link set vb{pair}a up\nlink set vb{pair}b up\n"
            for pair in range(options.pairs)
        )
        _run("ip", "-n", netns, "-batch", "-", input_text=batch)
        budget = options.interval + 1.0
        argv = [
            sys.executable,
            "-m",
            "netsleuth",
            "doctor",
            "--netns",
            netns,
            "--interval",
            str(options.interval),
        ]
        walls = []
        for _ in range(options.runs):
            start = time.monotonic()
            subprocess.run([*argv, "--json"], check=True, capture_output=True)
            walls.append(time.monotonic() - start)
        print(f"doctor on {2 * options.pairs} veth interfaces, --interval {options.interval:g}")
        for number, wall in enumerate(walls, 1):
            verdict = "ok" if wall <= budget else "OVER"
            print(f"  run {number}: {wall:.2f} s wall  (budget {budget:.2f} s, {verdict})")
        print(f"  worst {max(walls):.2f} s = interval + {max(walls) - options.interval:.2f} s")
        return 0 if max(walls) <= budget else 1
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)


if __name__ == "__main__":
    sys.exit(main())
