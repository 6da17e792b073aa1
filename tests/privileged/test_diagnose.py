"""`netsleuth diagnose` end to end: for each real scenario the right cause must come first."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from tests.netlab import Lab
from tests.privileged.conftest import Pair
from tests.tracerun import diagnose_verdicts

CONNECT = """
import socket, sys
for _ in range(int(sys.argv[3])):
    s = socket.socket()
    s.settimeout(float(sys.argv[4]) if len(sys.argv) > 4 else 1.0)
    try:
        s.connect((sys.argv[1], int(sys.argv[2])))
    except OSError:
        pass
"""
UDP_FLOOD = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[3])):
    s.sendto(b"x" * 200, (sys.argv[1], int(sys.argv[2])))
"""
UDP_SINK = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
sys.stdin.read()
"""
NEVER_ACCEPTS = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(1)
print("ready", flush=True)
sys.stdin.read()
"""


def diagnose(netns: str, traffic: Any, duration: float = 4.0) -> list[dict[str, Any]]:
    return diagnose_verdicts("--netns", netns, traffic=traffic, duration=duration)


def test_firewall_drop_is_the_first_verdict_with_its_rule(pair: Pair) -> None:
    pair.b.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "80", "-j", "DROP")
    verdicts = diagnose(
        pair.b.name, lambda: pair.a.run(sys.executable, "-c", CONNECT, pair.b4, "80", "1", "2")
    )
    first = verdicts[0]
    assert first["category"] == "firewall" and first["rank"] == 1 and first["cause_code"] == "firewall_drop"
    assert first["evidence"]["netfilter"]["rule"] == "-A INPUT -p tcp -m tcp --dport 80 -j DROP"
    assert '"-A INPUT -p tcp -m tcp --dport 80 -j DROP"' in first["cause"]
    assert any("iptables -t filter -D INPUT 1" in step for step in first["fix"])


def test_closed_port_flood_is_no_listener_with_resets(pair: Pair) -> None:
    verdicts = diagnose(pair.b.name, lambda: pair.a.run(sys.executable, "-c", CONNECT, pair.b4, "9099", "50"))
    first = verdicts[0]
    assert first["category"] == "no-listener" and first["cause_code"] == "no_listener"
    assert first["evidence"]["drops"] == 50 and first["evidence"]["reason"] == "NO_SOCKET"
    assert first["evidence"]["resets_sent"] == 50
    assert "nothing listens on tcp port 9099 of 198.18.0.2" in first["cause"]


def test_listen_queue_overflow_names_the_owner(pair: Pair) -> None:
    server = pair.b.popen(
        [sys.executable, "-c", NEVER_ACCEPTS, "7070"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == b"ready\n"

        # Connections complete into the accept queue until it is full; later ones are dropped. Started once
        # diagnose is attached: overflows before its window (a slow start on a busy machine) are not its.
        def connect() -> None:
            clients = [
                pair.a.popen([sys.executable, "-c", CONNECT, pair.b4, "7070", "1", "3"]) for _ in range(8)
            ]
            for client in clients:
                client.wait(20)

        verdicts = diagnose(pair.b.name, connect)
    finally:
        server.kill()
        server.wait()
    first = verdicts[0]
    assert first["category"] == "listen-overflow" and first["severity"] == "critical"
    assert first["cause_code"] == "listen_overflow"  # the same code as doctor's finding and tcp queues
    assert first["evidence"]["process"]["pid"] == server.pid and first["evidence"]["listen_overflows"] > 0
    assert f"[{server.pid}] listening on port 7070" in first["cause"]


def test_udp_receive_buffer_overflow_names_the_receiver(pair: Pair) -> None:
    sink = pair.b.popen(
        [sys.executable, "-c", UDP_SINK, "5454"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert sink.stdout is not None and sink.stdout.readline() == b"ready\n"
        verdicts = diagnose(
            pair.b.name, lambda: pair.a.run(sys.executable, "-c", UDP_FLOOD, pair.b4, "5454", "500")
        )
    finally:
        sink.kill()
        sink.wait()
    first = verdicts[0]
    assert first["category"] == "udp-rcvbuf" and first["severity"] == "critical"
    assert first["cause_code"] == "rcvbuf"
    assert first["evidence"]["process"]["pid"] == sink.pid
    assert f"[{sink.pid}] on udp port 5454" in first["cause"]


def test_vxlan_mtu_misconfiguration_is_found(pair: Pair) -> None:
    # No `dev`: the kernel would cap the MTU at the underlay minus 50; via the route it takes 1500.
    pair.b.run("ip", "link", "add", "vx0", "type", "vxlan", "id", "42", "remote", pair.a4, "dstport", "4789")
    pair.b.run("ip", "link", "set", "vx0", "mtu", "1500", "up")
    verdicts = diagnose(pair.b.name, lambda: None, duration=2.0)
    first = verdicts[0]
    assert first["category"] == "path:tunnel-mtu"
    assert any("mtu 1450" in step for step in first["fix"])


def test_quiet_namespace_has_nothing_above_info() -> None:
    lab = Lab()
    try:
        quiet = lab.host("quiet")
        verdicts = diagnose(quiet.name, lambda: None, duration=2.0)
    finally:
        lab.close()
    assert all(verdict["severity"] == "info" for verdict in verdicts), verdicts


def test_bad_duration_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "netsleuth", "diagnose", "--duration", "0"], capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1
