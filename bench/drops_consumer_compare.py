"""The `drops --json` consumer's delivered events per CPU-second in two source trees, in the same run.

What a drops run does with each poll of a storm, offline (no kernel, no traffic, so a shared machine's other
work shows as little as it can): the records taken off a ring laid out in memory as the kernel's is, by the
tree's own reader, the batch made of them (decoded and named once per kind of drop), its JSON Lines
(netsleuth.render.jsonl's path: the batch's own lines), written to a file. Storms of three shapes: one kind
of drop (one sender, the user's storm), 16 kinds mixed, and every drop its own kind (a port scan: each drop
decoded, named and encoded whole). Each tree runs in its own process (`PYTHONPATH=<tree>/src`), rounds
alternating between the trees; the median of each is kept.

`--callgrind` also counts instructions per event under valgrind (a run of N events minus a run of none:
imports and setup cancel out), which a busy machine does not change.

    python bench/drops_consumer_compare.py --baseline /tmp/before [--events N] [--rounds N] [--callgrind]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHAPES = ("one kind", "16 kinds", "every drop its own kind")
_BATCH = 6000  # records per poll: 1 MB of the ring, as a storm's polls are


def _consumer_api() -> tuple[Any, Any, Any]:
    """(DropEnricher, DropBatcher, decode_records) of the tree on sys.path: the drops package (issue 21), or
    the modules a tree before it had."""
    try:
        from netsleuth.diagnostics.drops.batch import DropBatcher
        from netsleuth.diagnostics.drops.decode import decode_records
        from netsleuth.diagnostics.drops.enrich import DropEnricher
    except ImportError:
        from netsleuth.diagnostics.drop_batch import DropBatcher  # type: ignore[import-not-found,no-redef]
        from netsleuth.diagnostics.drops_decode import (  # type: ignore[import-not-found,no-redef]
            decode_records,
        )
        from netsleuth.diagnostics.drops_enrich import DropEnricher  # type: ignore[import-not-found,no-redef]
    return DropEnricher, DropBatcher, decode_records


def storm(shape: str, count: int) -> list[bytes]:
    """`count` drop records of a UDP storm, 3 µs apart: one sender to one port, 16 senders and ports mixed,
    or every record to its own port."""
    import ctypes

    from netsleuth._generated.drops_abi import DropEvent

    kinds = 1 if shape == SHAPES[0] else 16 if shape == SHAPES[1] else count
    bodies = []
    for kind in range(kinds):
        event = DropEvent()
        event.location = 0xFFFFFFFF81200099
        event.reason = 6
        event.netns = 4026531840
        event.pid = event.tid = 4000 + kind % 16
        event.in_task = 1
        event.comm = b"udpflood"
        event.sk_state = 0xFF
        event.skb_len = 44
        event.cpu = kind % 2
        tup = event.tuple
        tup.family, tup.l4proto, tup.has_ports = 4, socket.IPPROTO_UDP, 1
        tup.sport, tup.dport, tup.l3_len = 40000 + kind % 16, 9 + kind, 44
        ctypes.memmove(tup.saddr, socket.inet_aton(f"198.18.0.{1 + kind % 16}"), 4)
        ctypes.memmove(tup.daddr, socket.inet_aton("198.18.1.2"), 4)
        bodies.append(bytes(event)[8:])
    start = 1_800_000_000_000_000_000
    return [
        (start + 3000 * index).to_bytes(8, "little")
        + (bodies[index % kinds] if kinds < count else bodies[index])
        for index in range(count)
    ]


class _Ring:
    """The tree's own ring-buffer reader (netsleuth.bpf.ringbuf._MappedRing) over plain memory laid out as
    the kernel's ring is (each record after an 8-byte header of its length and page offset, padded to 8
    bytes; the data twice in a row), so what it costs to take a poll's records off the ring is measured
    too, as in a real run: each poll's records are copied in (the kernel's share) and read out with
    `_take_blob` as a poll does."""

    SIZE = 1 << 23  # bpf/emit.h NS_RINGBUF_BYTES

    def __init__(self) -> None:
        from netsleuth.bpf.ringbuf import _MappedRing

        reader = _MappedRing.__new__(_MappedRing)
        self._memory = bytearray(2 * self.SIZE)
        data = memoryview(self._memory)
        reader._mask = self.SIZE - 1
        reader._data = data
        reader._words = data.cast("I")
        reader._consumer_pos = memoryview(bytearray(8)).cast("Q")
        reader._producer_pos = memoryview(bytearray(8)).cast("Q")
        self._reader = reader

    @staticmethod
    def laid_out(records: list[bytes]) -> bytes:
        parts: list[bytes] = []
        at = 0
        for record in records:
            size = len(record)
            padding = b"\x5a" * ((-size) % 8)  # stale bytes, not zeros
            parts += [size.to_bytes(4, "little"), (at // 4096).to_bytes(4, "little"), record, padding]
            at += 8 + size + len(padding)
        return b"".join(parts)

    def read(self, laid_out: bytes) -> list[Any]:
        """The poll's records as the reader hands them over (one or more takes of at most 1 MiB)."""
        from netsleuth.bpf.ringbuf import _MAX_BYTES

        reader = self._reader
        self._memory[: len(laid_out)] = laid_out
        reader._consumer_pos[0] = 0
        reader._producer_pos[0] = len(laid_out)
        taken: list[Any] = []
        while True:
            blob, bounds = reader._take_blob(_MAX_BYTES)
            if not bounds:
                return taken
            taken.append((blob, bounds))


def child(shape: str, events: int) -> dict[str, float]:
    """One tree's consumer on one storm: events per CPU-second of this process (and per wall second)."""
    from netsleuth.kernel.kallsyms import Kallsyms
    from netsleuth.kernel.reasons import DropReasons

    drop_enricher, drop_batcher, decode_records = _consumer_api()
    symbols = tempfile.NamedTemporaryFile("w", suffix=".kallsyms")  # noqa: SIM115
    symbols.write("ffffffff81000000 T _stext\nffffffff81200000 T ip_local_deliver_finish\n")
    symbols.flush()
    reasons = DropReasons({6: "NETFILTER_DROP"}, "bench")
    enricher = drop_enricher(reasons, explain_firewall=False, kallsyms=Kallsyms(symbols.name))
    enricher.prepare()
    batcher = drop_batcher(decode_records, enricher.enrich_many, lambda: enricher.context.wall_offset_ns)
    records = storm(shape, events)
    ring = _Ring()
    polls = [ring.laid_out(records[at : at + _BATCH]) for at in range(0, events, _BATCH)]
    with tempfile.TemporaryFile() as out:
        cpu, wall = time.process_time(), time.perf_counter()
        for laid_out in polls:
            for blob, bounds in ring.read(laid_out):
                out.write(batcher.batch_blob(blob, bounds).json_blob())
        out.flush()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        size = out.tell()
    enricher.close()
    symbols.close()
    return {"per_cpu_s": events / cpu if cpu else 0.0, "per_s": events / wall, "bytes": size}


def _run(
    tree: Path, shape: str, events: int, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "PYTHONHASHSEED": "0"}
    argv = [*prefix, sys.executable, str(Path(__file__).resolve()), "--child", shape, "--events", str(events)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True, cwd=tree)


def instructions(tree: Path, shape: str, events: int) -> float:
    """Instructions per event under callgrind: a run of `events` minus a run of none."""
    counts = []
    for count in (events, 0):
        with tempfile.TemporaryDirectory() as directory:
            out = Path(directory) / "callgrind.out"
            _run(tree, shape, count, ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"))
            totals = [
                line for line in out.read_text().splitlines() if line.startswith(("summary:", "totals:"))
            ]
            counts.append(int(totals[-1].split()[1]))
    return (counts[0] - counts[1]) / events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="the other source tree (a checkout before the change)")
    parser.add_argument("--events", type=int, default=120_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callgrind", type=int, metavar="EVENTS", help="also count instructions per event")
    parser.add_argument("--child", choices=SHAPES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.events)))
        return 0
    if args.baseline is None:
        parser.error("--baseline TREE is required")
    trees = {"before": args.baseline.resolve(), "after": REPO}
    print(f"load average at start: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
    print(
        f"  before: {trees['before']} ({_head(trees['before'])})\n  after:  {trees['after']} ({_head(REPO)})"
    )
    for shape in SHAPES:
        rates: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                rates[name].append(json.loads(_run(tree, shape, args.events).stdout)["per_cpu_s"])
        before, after = (statistics.median(rates[name]) for name in trees)
        spread = {name: f"{min(values):,.0f}-{max(values):,.0f}" for name, values in rates.items()}
        print(
            f"{shape:>24}: delivered events per CPU-second, median of {args.rounds}: before {before:,.0f} "
            f"({spread['before']}), after {after:,.0f} ({spread['after']}): {after / before:.2f}x"
        )
        if args.callgrind:
            counts = {name: instructions(tree, shape, args.callgrind) for name, tree in trees.items()}
            print(
                f"{'':>24}  instructions per event (callgrind, {args.callgrind:,} events): before "
                f"{counts['before']:,.0f}, after {counts['after']:,.0f}: "
                f"{counts['after'] / counts['before']:.2f}x"
            )
    print(f"load average at end: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
    return 0


def _head(tree: Path) -> str:
    found = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return found.stdout.strip() or "?"


if __name__ == "__main__":
    raise SystemExit(main())
