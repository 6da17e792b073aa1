"""Where the `drops --json` consumer's time goes, in microseconds per event, stage by stage.

Offline stages run on records built like a storm's (one kind of drop, each at its own time): the plain
path (decode every record, enrich the batch, encode each) against the batch path
(netsleuth.diagnostics.drops.batch: group by kind, enrich one of each, cut its line around the time, then
each drop's time text and the joined lines), and the write of the lines to a file. With --ring (root) a
storm goes through a real ring buffer, read by libbpf's per-record callback and by the mapped reader
(netsleuth.bpf.ringbuf): CPU time of the reading thread per record.

    python bench/drops_consumer_stages.py [--events N] [--ring] [--count N]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from netsleuth._generated.drops_abi import DropEvent  # noqa: E402
from netsleuth.diagnostics.drops.batch import DropBatcher  # noqa: E402
from netsleuth.diagnostics.drops.decode import decode_records  # noqa: E402
from netsleuth.diagnostics.drops.enrich import DropEnricher  # noqa: E402
from netsleuth.kernel.reasons import load_drop_reasons  # noqa: E402
from netsleuth.spec.records import encode  # noqa: E402


def _kernel_address(name: str) -> int:
    """A real function's address, so symbol lookups cost what they cost in a real run (0 if hidden)."""
    for line in Path("/proc/kallsyms").read_text().splitlines():
        address, _kind, symbol = line.split()[:3]
        if symbol == name:
            return int(address, 16)
    return 0


def storm_records(count: int) -> list[bytes]:
    """A UDP storm's records: one sender, one rule, one CPU; times 3 µs apart."""
    event = DropEvent()
    event.location = _kernel_address("nf_hook_slow") + 0x7C
    event.reason = 6
    event.netns = 4026531840
    event.pid = event.tid = os.getpid()
    event.in_task = 1
    event.comm = b"udpflood"
    event.sk_state = 0xFF
    event.ifname = b""
    event.skb_len = 44
    event.tuple.family, event.tuple.l4proto, event.tuple.has_ports = 4, socket.IPPROTO_UDP, 1
    event.tuple.sport, event.tuple.dport, event.tuple.l3_len = 40000, 9, 44
    ctypes.memmove(event.tuple.saddr, socket.inet_aton("198.18.0.1"), 4)
    ctypes.memmove(event.tuple.daddr, socket.inet_aton("198.18.0.2"), 4)
    body = bytes(event)[8:]
    start = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return [(start + 3000 * index).to_bytes(8, "little") + body for index in range(count)]


def per_event(what: Callable[[], object], events: int, rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        what()
        best = min(best, time.perf_counter() - started)
    return best / events * 1e6


def offline(events: int, batch_size: int) -> None:
    enricher = DropEnricher(load_drop_reasons(), explain_firewall=False)
    enricher.prepare()
    records = storm_records(events)
    batches = [records[i : i + batch_size] for i in range(0, events, batch_size)]
    batcher = DropBatcher(decode_records, enricher.enrich_many, lambda: enricher.context.wall_offset_ns)

    def plain() -> None:
        for batch in batches:
            b"".join(encode(record) + b"\n" for record in enricher.enrich_many(decode_records(batch)))

    grouped = [batcher.batch(batch) for batch in batches]
    blobs = [batch.json_blob() for batch in grouped]
    with tempfile.TemporaryDirectory() as directory:
        out = open(Path(directory) / "lines", "wb")  # noqa: SIM115

        def write() -> None:
            out.seek(0)
            for blob in blobs:
                out.write(blob)
            out.flush()

        stages = [
            ("plain path: decode + enrich + encode, each", plain),
            ("batch: group by kind, enrich one of each", lambda: [batcher.batch(b) for b in batches]),
            ("batch lines: time text + one %-format", lambda: [b.json_blob() for b in grouped]),
            ("write the lines to a file", write),
        ]
        line = len(blobs[0]) / len(grouped[0])
        print(f"offline, {events:,} storm records in batches of {batch_size:,}, {line:.0f} bytes a line:")
        for name, stage in stages:
            print(f"  {name:56} {per_event(stage, events):6.2f} µs/event")
        out.close()


def ring(count: int) -> None:
    from tests.netlab import Lab

    import netsleuth.bpf.ringbuf as ringbuf
    from bench.udp_storm import build_sender, storm
    from netsleuth.diagnostics.drops.program import DropsProgramConfig, DropsSession
    from netsleuth.diagnostics.filters import PacketFilter

    lab = Lab()
    work = Path(tempfile.mkdtemp(prefix="netsleuth-stages-"))
    try:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, ["198.18.0.1/24"], ["198.18.0.2/24"])
        a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "9", "-j", "DROP")
        sender = build_sender(work)
        print(f"ring buffer read, storms of {count:,} drops (CPU time of the reading thread):")
        for mapped in (False, True):
            ringbuf._TSO = mapped  # which reader RingBuffer picks
            with DropsSession(
                DropsProgramConfig(packet_filter=PacketFilter(netns=a.inode)), load_drop_reasons()
            ) as s:
                s.start()
                done = threading.Event()
                read: list[float] = [0, 0.0]

                def consume(
                    session: DropsSession = s, stop: threading.Event = done, read: list[float] = read
                ) -> None:
                    spent = time.thread_time()
                    while not stop.is_set():
                        read[0] += len(session.poll_records(50))
                        # Let records gather, as behind a storm: the cost per record read in bulk, not
                        # that of one wakeup per record a caught-up reader pays (sleep is not CPU time).
                        time.sleep(0.005)
                    read[0] += len(session.drain_records())
                    read[1] = time.thread_time() - spent

                thread = threading.Thread(target=consume)
                thread.start()
                storm(a.argv, sender, "198.18.0.2", count)
                time.sleep(0.3)
                done.set()
                thread.join()
                totals = s.totals()
            name = "mapped reader (bulk)" if mapped else "libbpf callback per record"
            print(
                f"  {name:56} {read[1] / max(read[0], 1) * 1e6:6.2f} µs/event "
                f"({read[0]:,} read, sampled {totals.sampled:,}, lost {totals.lost:,})"
            )
    finally:
        lab.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=6000, help="records per poll (1 MB of the ring)")
    parser.add_argument("--ring", action="store_true", help="also time the ring buffer readers (root)")
    parser.add_argument("--count", type=int, default=500_000, help="drops per storm for --ring")
    args = parser.parse_args()
    offline(args.events, args.batch)
    if args.ring:
        ring(args.count)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
