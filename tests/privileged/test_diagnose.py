"""`netsleuth diagnose` end to end: for each real scenario the right cause must come first."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.netlab import Host, Lab, wait_for
from tests.privileged.conftest import Pair
from tests.tracerun import diagnose_verdicts

REPO = Path(__file__).resolve().parents[2]

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


# Connections opened all at once when a line comes on stdin (the process is started, and Python loaded,
# before diagnose attaches), held open until stdin closes.
CONNECT_AT_ONCE = """
import socket, sys
print("ready", flush=True)
sys.stdin.readline()
held = []
for _ in range(int(sys.argv[3])):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((sys.argv[1], int(sys.argv[2])))
    held.append(s)
print("sent", flush=True)
sys.stdin.read()
"""


def _listen_overflows(host: Host) -> int:
    lines = host.run("cat", "/proc/net/netstat").stdout.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True))["ListenOverflows"])
    raise AssertionError("no TcpExt in /proc/net/netstat")


def test_listen_queue_overflow_names_the_owner(pair: Pair) -> None:
    server = pair.b.popen(
        [sys.executable, "-c", NEVER_ACCEPTS, "7070"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    # Eight connections to a backlog of one: two complete into the accept queue, the others overflow it.
    # Sent at once inside the window (a client process each, started after attaching on a busy machine,
    # once sent two and no more inside it: a full queue and no overflow yet, a warning).
    clients = pair.a.popen(
        [sys.executable, "-c", CONNECT_AT_ONCE, pair.b4, "7070", "8"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == b"ready\n"
        assert clients.stdout is not None and clients.stdout.readline() == b"ready\n"
        before = _listen_overflows(pair.b)

        def connect() -> None:
            assert clients.stdin is not None and clients.stdout is not None
            clients.stdin.write(b"go\n")
            clients.stdin.flush()
            assert clients.stdout.readline() == b"sent\n"
            wait_for(lambda: _listen_overflows(pair.b) > before, 10, "the accept queue to overflow")

        verdicts = diagnose(pair.b.name, connect)
    finally:
        for process in (clients, server):
            process.kill()
            process.wait()
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


RCU_BARRIER = Path("/sys/module/rcutree/parameters/do_rcu_barrier")


def flush_rcu_callbacks() -> None:
    """Run every pending RCU callback now (rcu_barrier): the netlink sockets the test's own `iptables` closed
    are freed (and their unread replies purged) before diagnose watches, not up to 10 s later as lazy RCU
    would. An action, not a setting: nothing to restore."""
    assert RCU_BARRIER.exists(), "this kernel has no rcutree.do_rcu_barrier"
    RCU_BARRIER.write_text("1\n")


@contextlib.contextmanager
def dns_behind_an_input_drop() -> Iterator[Host]:
    """A client namespace whose resolver (timeout:1 attempts:2) asks a real DNS server next door, and an
    INPUT rule that drops the answers. IPv4 only: no router solicitations or MLD reports in the window."""
    lab = Lab()
    try:
        client, server = lab.host("c"), lab.host("s")
        for host in (client, server):
            host.run(
                "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", "net.ipv6.conf.all.disable_ipv6=1"
            )
        lab.link(client, server, ["198.18.0.1/24"], ["198.18.0.2/24"])
        netns_etc = Path("/etc/netns") / client.name
        with tempfile.TemporaryDirectory(prefix="netsleuth-dns-") as scratch:
            ready, stats = Path(scratch) / "ready", Path(scratch) / "stats.json"
            argv = ["--address", "198.18.0.2", "--ready-file", str(ready), "--stats-file", str(stats)]
            dns_server = server.popen([sys.executable, "-m", "tests.dns_server", *argv], cwd=str(REPO))
            netns_etc.mkdir(parents=True)
            try:
                (netns_etc / "resolv.conf").write_text(
                    "nameserver 198.18.0.2\noptions timeout:1 attempts:2\n"
                )
                wait_for(ready.exists, 20, "the DNS server to listen")
                client.run("getent", "ahostsv4", "found.ok.test")  # ARP resolved, the path works
                client.run("iptables", "-A", "INPUT", "-p", "udp", "--sport", "53", "-j", "DROP")
                flush_rcu_callbacks()
                yield client
            finally:
                (netns_etc / "resolv.conf").unlink(missing_ok=True)
                netns_etc.rmdir()
                dns_server.kill()
                dns_server.wait()
    finally:
        lab.close()


def test_a_dns_firewall_fault_is_one_verdict_in_ten_runs() -> None:
    """An INPUT rule drops a server's DNS answers; getent retries and times out. Ten diagnose runs in a row
    each give exactly one verdict - the rule, with the DNS timeouts, the dropped retries and the firewall
    drops as its evidence - not also a dns-drop, a firewall verdict, or a QUEUE_PURGE of the replies
    netsleuth's own firewall reads (iptables-nft-save) left unread, in this run or the one before."""
    runs = []
    with dns_behind_an_input_drop() as client:
        for run in range(10):

            def lookup(name: str = f"lost{run}.ok.test") -> None:
                client.run("getent", "ahostsv4", name, check=False)

            runs.append(diagnose_verdicts("--netns", client.name, traffic=lookup, duration=5))
    delete = f"ip netns exec {client.name} iptables -t filter -D INPUT 1   # if DNS answers should pass"
    for verdicts in runs:
        kinds = [(verdict["category"], verdict["cause"]) for verdict in verdicts]
        assert [kind for kind, _ in kinds] == ["dns-timeout-firewall"], kinds
        (verdict,) = verdicts
        assert verdict["cause_code"] == "firewall_drop" and verdict["severity"] == "critical"
        assert verdict["fix"][0] == delete
        evidence = verdict["evidence"]
        # getent asked twice (attempts:2) and both answers were dropped: one timeout, two drops, one rule.
        assert evidence["timeouts"] == 1 and evidence["dns_drops"] == 2
        assert evidence["firewall"]["drops"] == 2
        assert evidence["firewall"]["netfilter"]["rule"] == "-A INPUT -p udp -m udp --sport 53 -j DROP"
