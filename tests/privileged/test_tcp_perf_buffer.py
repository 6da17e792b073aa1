"""The tcp object without a ring buffer (kernels before 5.8), forced on this kernel: its events travel through
per-CPU perf buffers (`ns_use_perfbuf` of bpf/emit.bpf.h, the ring buffer map retired before load), arrive
the same as through the ring buffer, and every one the kernel could not store is counted LOST by the program
exactly as the kernel reports it to the consumer (PERF_RECORD_LOST)."""

from __future__ import annotations

import collections
import os
import socket
import time
from collections.abc import Iterator

import pytest

from netsleuth._generated.tcp_abi import EventKind
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.diagnostics.tcp.program import RawTcpEvent, TcpSession, TcpSessionConfig
from netsleuth.diagnostics.totals import EventTotals


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(128)
    try:
        yield server
    finally:
        server.close()


def _connections(server: socket.socket, count: int) -> None:
    """`count` whole connections on loopback: connect, accept, close both ends."""
    for _ in range(count):
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        client.close()
        accepted.close()


def _connection_on_every_cpu(server: socket.socket) -> None:
    """One connection from each CPU in turn. On loopback a connection's transitions are traced on the CPU
    that makes it, and the kernel reports a CPU's perf-buffer losses only with that CPU's next record: left
    to the scheduler, this thread can stay on one CPU while the other's losses wait unreported."""
    allowed = os.sched_getaffinity(0)
    try:
        for cpu in sorted(allowed):
            os.sched_setaffinity(0, {cpu})
            _connections(server, 1)
    finally:
        os.sched_setaffinity(0, allowed)


def _session(port: int, perf: bool) -> TcpSession:
    return TcpSession(
        TcpSessionConfig(PacketFilter(port=port), emit=frozenset({EventKind.STATE}), perf_buffer=perf)
    )


def _collect(session: TcpSession, events: list[RawTcpEvent], timeout: float = 10.0) -> EventTotals:
    """Drain until every emitted event has arrived (transitions can still come in from softirq after the
    traffic: the last ACKs, TIME_WAIT)."""
    deadline = time.monotonic() + timeout
    while True:
        events.extend(session.poll(50))
        totals = session.totals()[EventKind.STATE]
        if len(events) >= totals.emitted or time.monotonic() > deadline:
            events.extend(session.catch_up())  # the run goes on: the loss test sends more
            return session.totals()[EventKind.STATE]


def _shape(event: RawTcpEvent) -> tuple[object, ...]:
    return (event.kind, event.old_state, event.state, event.lport, event.rport, event.sk)


def test_the_same_events_through_either_buffer(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    with _session(port, perf=False) as ring, _session(port, perf=True) as perf:
        ring.start()
        perf.start()
        assert (ring.buffer, perf.buffer) == ("ring", "perf")
        _connections(listener, 20)
        ring_events: list[RawTcpEvent] = []
        perf_events: list[RawTcpEvent] = []
        ring_totals = _collect(ring, ring_events)
        perf_totals = _collect(perf, perf_events)
        # The two programs run on the same transitions: wait until both have counted the same ones.
        deadline = time.monotonic() + 10
        while ring_totals.matched != perf_totals.matched and time.monotonic() < deadline:
            ring_totals, perf_totals = _collect(ring, ring_events), _collect(perf, perf_events)
        assert perf.perf_lost == 0 and ring.perf_lost is None
    assert perf_totals.matched == ring_totals.matched >= 20 * 6
    assert perf_totals.emitted == len(perf_events) == ring_totals.emitted == len(ring_events)
    assert perf_totals.lost == 0
    # Per-CPU buffers may reorder events of different CPUs; the events themselves are the same.
    assert collections.Counter(map(_shape, perf_events)) == collections.Counter(map(_shape, ring_events))


def test_perf_buffer_losses_are_counted_exactly(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    with _session(port, perf=True) as perf:
        perf.start()
        # ~9 transitions of ~250 bytes per connection, not read while they happen: far beyond 256 KiB per CPU.
        _connections(listener, 1500)
        events: list[RawTcpEvent] = perf.catch_up()
        # The kernel reports a CPU's losses before the next record that fits there: one more connection on
        # every CPU.
        _connection_on_every_cpu(listener)
        totals = _collect(perf, events)
        deadline = time.monotonic() + 10
        while perf.perf_lost != totals.lost and time.monotonic() < deadline:
            _connection_on_every_cpu(listener)
            totals = _collect(perf, events)
        assert totals.lost > 0
        assert perf.perf_lost == totals.lost
    assert totals.emitted == len(events)
    assert totals.matched == totals.emitted + totals.lost + totals.sampled
    assert totals.sampled == 0  # no back-pressure sampling without a fill level to ask
