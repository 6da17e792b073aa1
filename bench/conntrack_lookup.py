"""Benchmark: what `conn`'s NAT join costs per read. A namespace's conntrack table is filled with N entries
(DNAT-shaped, inserted over ctnetlink into a test namespace only), then kernel/conntrack.py reads it two ways:
a lookup of the two tuples one waiting drop gives (what `conn` does) and a full dump (what an agent ships at
the end of a session). Prints the median of `--runs` of each, per table size, and their ratio; removes
everything it made.

    sudo .venv/bin/python bench/conntrack_lookup.py [--sizes 100 10000 50000] [--runs 5]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from netsleuth.diagnostics.nat_join import FlowTuple
from netsleuth.kernel.conntrack import ConntrackReader


def _fill(netns: str, start: int, count: int) -> None:
    """`count` entries 198.18.x.y:port -> 198.18.70.2:80 whose reply comes from 198.18.71.2:8080 (a DNAT's
    shape; the kernel sets the status bits itself)."""
    from pyroute2 import NFCTSocket
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    with NFCTSocket(netns=f"/run/netns/{netns}", flags=0) as ct:
        for index in range(start, start + count):
            client = str(ipaddress.ip_address("198.18.128.0") + index // 50000)
            sport = 10000 + index % 50000
            ct.entry(
                "add",
                timeout=300,
                tuple_orig=NFCTAttrTuple(
                    saddr=client, daddr="198.18.70.2", proto=socket.IPPROTO_TCP, sport=sport, dport=80
                ),
                tuple_reply=NFCTAttrTuple(
                    saddr="198.18.71.2", daddr=client, proto=socket.IPPROTO_TCP, sport=8080, dport=sport
                ),
            )


def _median(function: object, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10000, 50000])
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    netns = f"nsctbench{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        filled = 0
        print(f"{'entries':>8}  {'lookup (2 tuples)':>18}  {'dump':>10}  dump/lookup")
        for size in sorted(options.sizes):
            _fill(netns, filled, size - filled)
            filled = size
            with ConntrackReader(namespaces=[netns], watch_destroyed=False) as reader:
                reader.lookup([])  # opens the namespace's socket outside the timing
                syn = FlowTuple("tcp", ("198.18.128.0", 10000), ("198.18.71.2", 8080))
                both = [syn, syn.reversed()]
                lookup = _median(lambda: reader.lookup(both), options.runs)  # noqa: B023 (used at once)
                found = reader.lookup(both)
                assert len(found) == 1 and found[0].dnat, found
                dump = _median(reader.entries, max(1, options.runs // 2))
                dumped = len(reader.entries())
                assert dumped == size, (dumped, size, reader.problems)
            print(f"{size:>8}  {lookup * 1e3:>15.2f} ms  {dump * 1e3:>7.0f} ms  {dump / lookup:>10.0f}x")
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
