"""Servers and connections that were there before the trace (issue 13, item 1): a trace learns the TCP sockets
that exist when it starts (bpf/tcp_existing.bpf.c walks them in every namespace), so a listener's overflow,
a connection's side and its owner are known from the first event. Every socket here is made, and in use,
before netsleuth starts."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.netlab import Host, wait_for
from tests.privileged.conftest import Pair
from tests.privileged.tcp_helpers import HeldClient, Server
from tests.tracerun import TraceRun

_OPEN_MANY = """
import socket, sys, time
sockets = []
for _ in range(int(sys.argv[3])):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect((sys.argv[1], int(sys.argv[2])))
    except BlockingIOError:
        pass
    sockets.append(s)
print('OPENED', flush=True)
time.sleep(60)
"""


@contextmanager
def _connections(host: Host, address: str, port: int, count: int) -> Iterator[None]:
    """`count` connections (SYNs) from `host`, held open until the block ends."""
    process = host.popen(
        [sys.executable, "-c", _OPEN_MANY, address, str(port), str(count)], stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == b"OPENED"
        yield
    finally:
        process.kill()
        process.wait()


def _ss_queue(host: Host, state: str, port: int) -> int:
    """Recv-Q of the first socket in `state` on local `port` (a listener's accept queue, else unread bytes).
    With a state filter ss prints no State column: Recv-Q comes first."""
    fields = host.run("ss", "-Htn", "state", state, f"sport = :{port}").stdout.split()
    return int(fields[0]) if fields else -1


def _typed(trace: TraceRun, kind: str) -> list[dict[str, Any]]:
    return [record for record in trace.records() if record.get("type") == kind]


def test_overflow_on_a_listener_older_than_the_trace(pair: Pair) -> None:
    port = 7121
    with (
        Server(pair.b, pair.b4, port, "never_accept") as server,
        _connections(pair.a, pair.b4, port, 2),
    ):
        # listen(1): two handshakes fill its accept queue, before the trace exists.
        wait_for(lambda: _ss_queue(pair.b, "listening", port) == 2, 10, "a full queue")
        with TraceRun("tcp", "queues", "--netns", pair.b.name) as trace:
            trace.wait_ready()
            with _connections(pair.a, pair.b4, port, 3):
                trace.wait_records(lambda r: r.get("what") == "accept_queue_overflow")
            assert trace.stop() == 0
            overflow = next(r for r in _typed(trace, "queue") if r["what"] == "accept_queue_overflow")
            summary = trace.summary()
    assert overflow["state"] == "LISTEN" and overflow["sport"] == port and overflow["saddr"] == pair.b4
    assert overflow["backlog"] == 1 and overflow["queued"] == 2
    # The owner comes from the socket's inode, which the walk found: the process that listens.
    assert overflow["pid"] == server.pid and overflow["owner"] == "socket"
    assert f"python3[{server.pid}] to accept()" in overflow["text"]
    assert summary["netstat"]["ListenOverflows"] >= 1


def test_life_of_a_connection_older_than_the_trace(pair: Pair) -> None:
    port = 7122
    with Server(pair.b, pair.b4, port, "drain", "300") as server, HeldClient(pair.a, pair.b4, port) as client:
        server.wait_line("ACCEPTED")
        with TraceRun("tcp", "life", "--port", str(port)) as life:
            life.wait_ready()
            client.send(1000)
            client.close(graceful=True)
            life.wait_records(lambda r: r.get("type") == "life", 2)
            assert life.stop() == 0
            lives = _typed(life, "life")
    client_life = next(r for r in lives if r["sport"] == client.local_port)
    server_life = next(r for r in lives if r["sport"] == port)
    assert client_life["side"] == "client" and client_life["pid"] == client.pid
    assert server_life["side"] == "server" and server_life["pid"] == server.pid
    assert server_life["netns_name"] == pair.b.name
    # Born before the trace: the duration counts from the trace's start and says so.
    assert client_life["born_before_trace"] is True and server_life["born_before_trace"] is True
    assert client_life["bytes_acked"] == 1000 + 2 and client_life["bytes_received"] == 300 + 1


def test_resets_of_a_connection_older_than_the_trace(pair: Pair) -> None:
    port = 7123
    with Server(pair.b, pair.b4, port, "hold") as server, HeldClient(pair.a, pair.b4, port) as client:
        server.wait_line("ACCEPTED")
        client.send(1000)  # never read: the server's exit aborts the connection with an RST
        wait_for(lambda: _ss_queue(pair.b, "established", port) == 1000, 10, "unread")
        with TraceRun("resets", "--port", str(port)) as trace:
            trace.wait_ready()
            server.process.kill()
            server.process.wait()
            trace.wait_records(lambda r: r.get("type") == "reset" and r["direction"] == "received")
            assert trace.stop() == 0
            resets = _typed(trace, "reset")
    sent = next(r for r in resets if r["direction"] == "sent")
    received = next(r for r in resets if r["direction"] == "received")
    assert sent["side"] == "server" and sent["sport"] == port and sent["pid"] == server.pid
    assert received["side"] == "client" and received["sport"] == port and received["pid"] == client.pid
    # Its age is not known (it was opened before the trace): none is claimed.
    assert sent["age_s"] is None and received["age_s"] is None
