"""The drops consumer under a storm: the ring buffer read from its own mappings hands over every record the
kernel committed (through many wrap-arounds of the 8 MiB ring, exact against the kernel's counters), and
`drops --json` under a storm writes every line whole and accounts for every drop. What each event costs is
measured in bench/drops_delivery.py (a benchmark, not a timed test)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from netsleuth.bpf.ringbuf import RingBuffer
from netsleuth.diagnostics.drops.program import DropsProgramConfig, DropsSession
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.kernel.reasons import load_drop_reasons
from tests.netlab import wait_for
from tests.privileged.conftest import Pair
from tests.tracerun import TraceRun


def _flood(pair: Pair, udpflood: str, port: int, count: int) -> None:
    result = json.loads(pair.a.run(udpflood, pair.b4, str(port), str(count)).stdout)
    assert result["refused"] == count  # each refusal is exactly one NETFILTER_DROP


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "libbpf-callback"])
def test_every_committed_record_is_read_once(pair: Pair, udpflood: str, mapped: bool) -> None:
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "6310", "-j", "DROP")
    count = 300_000
    config = DropsProgramConfig(packet_filter=PacketFilter(netns=pair.a.inode, dport=6310))
    read: list[bytes] = []
    with DropsSession(config, load_drop_reasons()) as session:
        session.start()
        ring = session._programs._ring  # the session's reader, swapped for the one under test
        assert isinstance(ring, RingBuffer)
        fd = session._programs.maps.events.fd
        ring.close()
        session._programs._ring = tested = RingBuffer(fd, mapped=mapped)
        assert tested.mapped is mapped
        done = threading.Event()

        def consume() -> None:
            while not done.is_set():
                read.extend(session.poll_records(50))
            read.extend(session.drain_records())

        thread = threading.Thread(target=consume)
        thread.start()
        try:
            _flood(pair, udpflood, 6310, count)
            totals = session.totals()
            deadline = time.monotonic() + 30
            while len(read) < totals.emitted and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            done.set()
            thread.join()
        totals = session.totals()
        drops = session.decode(read)
    # Exact: every record the kernel committed was read once, nothing else; the rest is counted.
    assert totals.matched == count
    assert len(read) == totals.emitted
    assert totals.emitted + totals.sampled + totals.lost == count
    assert totals.lost == 0
    assert {drop.packet.dport for drop in drops} == {6310}
    # Bytes sent through the ring: many times its 8 MiB, so the reader went round it and across its end.
    assert sum(len(record) + 8 for record in read) > 3 * (8 << 20)
    times = [drop.monotonic_ns for drop in drops]
    assert times == sorted(times)  # one sending CPU: ring order is time order


def test_json_delivery_under_a_storm_is_whole_and_exact(pair: Pair, udpflood: str) -> None:
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "6311", "-j", "DROP")
    count = 300_000
    with TraceRun("drops", "--netns", pair.a.name, "--dport", "6311") as run:
        run.wait_ready()
        # The first drops load the names (kallsyms, namespaces, the firewall): not what is measured.
        _flood(pair, udpflood, 6311, 1000)
        run.wait_records(lambda record: record.get("type") == "drop", 1000)
        _flood(pair, udpflood, 6311, count)
        lines = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the output stops growing
            size = run.stdout_path.stat().st_size
            time.sleep(0.5)
            if run.stdout_path.stat().st_size == size:
                break
        run.stop()
        summary = run.summary()
        drops = run.drops()
    lines = len(drops)
    assert summary["total"] == count + 1000
    assert lines == summary["emitted"]
    assert summary["emitted"] + summary["sampled"] + summary["lost"] == count + 1000
    assert lines > 1000
    # Every line whole (TraceRun checked each against the drop schema) and about its own drop.
    assert {drop["dport"] for drop in drops} == {6311} and {drop["reason"] for drop in drops} == {
        "NETFILTER_DROP"
    }
    assert all(drop["netfilter"]["rule"] for drop in drops[:: max(1, lines // 100)])
    assert len({drop["time"] for drop in drops}) > lines // 2  # each drop has its own time


def test_a_run_stopped_in_a_storm_printed_every_event_it_counts_emitted(pair: Pair, udpflood: str) -> None:
    """Stopped while its drops keep coming: every event the summary counts emitted is in the output. The
    programs are detached before the last read, so none is emitted after it (with them still attached, the
    drops of the last read and of the summary were counted emitted and never printed: 24,747 printed of
    38,752 emitted in this test before)."""
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "6312", "-j", "DROP")
    with TraceRun("drops", "--netns", pair.a.name, "--dport", "6312") as run:
        run.wait_ready()
        # A paced storm (50,000 drops/s for up to a minute), still running when the run stops.
        flood = pair.a.popen([udpflood, pair.b4, "6312", "3000000", "16", "50000"], stdout=-1)
        try:
            wait_for(lambda: run.stdout_path.stat().st_size > 500_000, 60, "a thousand-odd drops printed")
            run.stop()
            still_flooding = flood.poll() is None
        finally:
            flood.kill()
            flood.wait()
        summary = run.summary()
        printed = len(run.drops())
    assert still_flooding
    assert summary["total"] == summary["emitted"] + summary["sampled"] + summary["lost"]
    assert printed == summary["emitted"], (printed, summary)
