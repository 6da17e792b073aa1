"""`netsleuth drops` end to end: real programs on the running kernel, real traffic between namespaces."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.netlab import wait_for
from tests.privileged.conftest import Pair
from tests.tracerun import TraceRun, bpftool_netsleuth_programs, netsleuth_argv, programs_held_by

UDP_SEND = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET, socket.SOCK_DGRAM)\n"
    "for _ in range(int(sys.argv[3])):\n"
    "    try: s.sendto(b'x'*32, (sys.argv[1], int(sys.argv[2])))\n"
    "    except OSError: pass\n"
)
TCP_CONNECT = (
    "import socket,sys\ns=socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)\n"
    "s.settimeout(2)\ntry: s.connect((sys.argv[1], int(sys.argv[2])))\nexcept OSError: pass\n"
)


def udp(host: Any, dst: str, port: int, count: int = 1) -> None:
    host.run(sys.executable, "-c", UDP_SEND, dst, str(port), str(count))


def tcp_connect(host: Any, dst: str, port: int) -> None:
    host.run(sys.executable, "-c", TCP_CONNECT, dst, str(port))


def test_output_firewall_drop_names_the_rule(pair: Pair) -> None:
    pair.a.run(
        "iptables",
        "-A",
        "OUTPUT",
        "-p",
        "udp",
        "--dport",
        "9",
        "-j",
        "ACCEPT",
        "-m",
        "comment",
        "--comment",
        "not this",
    )
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "5301", "-j", "DROP")
    with TraceRun("drops", "--netns", pair.a.name) as trace:
        trace.wait_ready()
        udp(pair.a, pair.b4, 5301)
        trace.wait_records(lambda r: r.get("reason") == "NETFILTER_DROP")
        assert trace.stop() == 0
        drop = next(r for r in trace.drops() if r["reason"] == "NETFILTER_DROP")
    assert drop["proto"] == "udp" and drop["daddr"] == pair.b4 and drop["dport"] == 5301
    # nf_hook_slow frees it on older kernels; 6.x nf_tables frees it in nft_do_chain with the verdict.
    assert drop["location"].split("+")[0] in ("nf_hook_slow", "nft_do_chain", "ipt_do_table")
    assert drop["netns"] == pair.a.inode and drop["netns_name"] == pair.a.name
    # The sender's own task dropped it (OUTPUT runs in the sending syscall).
    assert drop["owner"] == "task" and drop["comm"].startswith("python")
    netfilter = drop["netfilter"]
    assert netfilter["hook"] == "output"
    assert netfilter["table"] == "filter" and netfilter["chain"] == "OUTPUT"
    assert netfilter["rule"] == "-A OUTPUT -p udp -m udp --dport 5301 -j DROP"
    assert netfilter["rule_number"] == 2


def test_input_firewall_drop_names_the_rule(pair: Pair) -> None:
    pair.b.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "8080", "-j", "DROP")
    with TraceRun("drops", "--netns", pair.b.name, "--reason", "NETFILTER_DROP") as trace:
        trace.wait_ready()
        tcp_connect(pair.a, pair.b4, 8080)
        trace.wait_records(lambda r: r.get("type") == "drop")
        trace.stop()
        drop = trace.drops()[0]
    assert drop["proto"] == "tcp" and drop["dport"] == 8080 and drop["tcp_flags"] == "SYN"
    assert drop["saddr"] == pair.a4 and drop["ifname"] == "veth0"
    assert drop["netfilter"]["hook"] == "input"
    assert drop["netfilter"]["rule"] == "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"
    # Received in softirq and no socket owns a dropped SYN: nobody's process is blamed.
    assert drop["owner"] == "kernel" and drop["pid"] is None


ALTERNATE_SEND = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    for port in (5401, 5402):\n"
    "        try: s.sendto(b'x'*32, ('127.0.0.1', port))\n"
    "        except OSError: pass\n"
)


def test_one_socket_dropped_in_two_hooks_in_turn_has_each_hook_named(pair: Pair) -> None:
    """The kernel side unwinds a netfilter drop's stack (which names its hook) once per path and reuses it
    for the same packet again (bpf/drops.h struct drop_hook_path): one socket's datagrams dropped in turn by
    an OUTPUT rule (in the sending task) and an INPUT rule (in softirq, over loopback) are each named by
    their own hook, drop after drop."""
    pair.a.run("ip", "link", "set", "lo", "up")
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "5401", "-j", "DROP")
    pair.a.run("iptables", "-A", "INPUT", "-p", "udp", "--dport", "5402", "-j", "DROP")
    rounds = 500
    with TraceRun("drops", "--netns", pair.a.name, "--reason", "NETFILTER_DROP") as trace:
        trace.wait_ready()
        pair.a.run(sys.executable, "-c", ALTERNATE_SEND, str(rounds))
        trace.wait_records(lambda r: r.get("type") == "drop" and r.get("dport") == 5402, count=rounds)
        trace.stop()
        drops, summary = trace.drops(), trace.summary()
    assert len(drops) == 2 * rounds and summary["sampled"] == 0
    hooks = {(drop["dport"], drop["netfilter"]["hook"], drop["netfilter"]["rule"]) for drop in drops}
    assert hooks == {
        (5401, "output", "-A OUTPUT -p udp -m udp --dport 5401 -j DROP"),
        (5402, "input", "-A INPUT -p udp -m udp --dport 5402 -j DROP"),
    }


def test_closed_tcp_port_is_no_socket(pair: Pair) -> None:
    with TraceRun("drops", "--netns", pair.b.name, "--proto", "tcp") as trace:
        trace.wait_ready()
        tcp_connect(pair.a, pair.b4, 4444)
        trace.wait_records(lambda r: r.get("reason") == "NO_SOCKET")
        trace.stop()
        drop = next(r for r in trace.drops() if r["reason"] == "NO_SOCKET")
    assert (drop["saddr"], drop["daddr"], drop["dport"]) == (pair.a4, pair.b4, 4444)
    assert drop["location"].startswith("tcp_v4_rcv+")
    assert drop["owner"] == "kernel"


UDP_SINK = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("bound", flush=True)
sys.stdin.read()  # never reads the socket: its receive buffer overflows
"""


def test_udp_receive_buffer_overflow_blames_the_receiver(pair: Pair) -> None:
    # `ip netns exec` execs the command, so the sink's pid is the python process holding the socket.
    sink = pair.b.popen(
        [sys.executable, "-c", UDP_SINK, "5400"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert sink.stdout is not None and sink.stdout.readline().strip() == b"bound"
        with TraceRun("drops", "--netns", pair.b.name, "--reason", "SOCKET_RCVBUFF") as trace:
            trace.wait_ready()
            udp(pair.a, pair.b4, 5400, count=200)
            trace.wait_records(lambda r: r.get("type") == "drop", count=5)
            trace.stop()
            drops = trace.drops()
    finally:
        sink.kill()
        sink.wait()
    assert all(d["reason"] == "SOCKET_RCVBUFF" and d["dport"] == 5400 for d in drops)
    # The receiving process owns these drops, not the sender whose softirq delivered them.
    assert {(d["pid"], d["owner"]) for d in drops} == {(sink.pid, "socket")}
    assert drops[0]["comm"].startswith("python")


def test_ipv6_drop(pair: Pair) -> None:
    pair.b.run("ip6tables", "-A", "INPUT", "-p", "udp", "--dport", "5600", "-j", "DROP")
    with TraceRun("drops", "--netns", pair.b.name, "-6", "--proto", "udp") as trace:
        trace.wait_ready()
        udp(pair.a, pair.b6, 5600)
        trace.wait_records(lambda r: r.get("type") == "drop")
        trace.stop()
        drop = trace.drops()[0]
    assert drop["family"] == 6 and drop["saddr"] == pair.a6 and drop["daddr"] == pair.b6
    assert drop["reason"] == "NETFILTER_DROP"
    assert drop["netfilter"]["rule"] == "-A INPUT -p udp -m udp --dport 5600 -j DROP"


def _mixed_traffic(pair: Pair) -> None:
    """Drops of several kinds in netns b: UDP 5701 from a4, TCP 5702 from a4, UDP 5703 over IPv6."""
    udp(pair.a, pair.b4, 5701)
    tcp_connect(pair.a, pair.b4, 5702)
    udp(pair.a, pair.b6, 5703)
    udp(pair.a, pair.b4, 5799)  # the marker: every run waits for it, so all earlier traffic was seen


FILTER_CASES: list[tuple[list[str], set[int]]] = [
    (["--proto", "tcp"], {5702}),
    (["--proto", "udp", "-4"], {5701, 5799}),
    (["--dport", "5703"], {5703}),
    (["--port", "5702"], {5702}),
    (["--host", "2001:db8::/64"], {5703}),
    (["--src", "198.18.0.1"], {5701, 5702, 5799}),
    (["--dst", "198.18.0.0/24", "--dport", "5701"], {5701}),
    (["--reason", "NO_SOCKET", "--proto", "udp"], {5701, 5703, 5799}),
    (["--exclude-reason", "NO_SOCKET"], set()),
    (["--dev", "veth0", "--proto", "tcp"], {5702}),
    (["--dev", "nosuchdev0"], set()),
]


@pytest.mark.parametrize(
    ("filters", "expected_ports"), FILTER_CASES, ids=[" ".join(f[0]) for f in FILTER_CASES]
)
def test_filters_exclude_what_they_should(pair: Pair, filters: list[str], expected_ports: set[int]) -> None:
    # A catch-all run sees every drop, so the filtered run's silence is proof of filtering, not of missing it.
    with (
        TraceRun("drops", "--netns", pair.b.name) as everything,
        TraceRun("drops", "--netns", pair.b.name, *filters) as filtered,
    ):
        everything.wait_ready()
        filtered.wait_ready()
        _mixed_traffic(pair)
        everything.wait_records(lambda r: r.get("dport") == 5799)
        # The catch-all saw the marker; the filtered run has had the same ring buffer wake-up by now.
        filtered.stop()
        everything.stop()
        ours = {5701, 5702, 5703, 5799}  # the namespace also drops its own IPv6 chatter (MLD, RS)
        seen_all = {d["dport"] for d in everything.drops()} & ours
        seen = {d["dport"] for d in filtered.drops()} & ours
    assert seen_all == ours
    assert seen == expected_ports


WAIT_THEN_SEND = "import sys; print('ready', flush=True); sys.stdin.read()\n" + UDP_SEND


def test_pid_and_comm_filters(pair: Pair) -> None:
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "5801", "-j", "DROP")
    sender = pair.a.popen(
        [sys.executable, "-c", WAIT_THEN_SEND, pair.b4, "5801", "3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert sender.stdout is not None and sender.stdout.readline() == b"ready\n"  # exec'd: comm is final
        comm = Path(f"/proc/{sender.pid}/comm").read_text().strip()
        with (
            TraceRun("drops", "--pid", str(sender.pid), "--netns", pair.a.name) as by_pid,
            TraceRun("drops", "--comm", comm, "--netns", pair.a.name) as by_comm,
            TraceRun("drops", "--comm", "nosuchcomm", "--netns", pair.a.name) as by_other_comm,
        ):
            for trace in (by_pid, by_comm, by_other_comm):
                trace.wait_ready()
            udp(pair.a, pair.b4, 5801)  # another python process: excluded by --pid, included by --comm
            assert sender.stdin is not None
            sender.stdin.close()  # now the watched process sends its 3 datagrams
            sender.wait(10)
            by_pid.wait_records(lambda r: r.get("type") == "drop", count=3)
            by_comm.wait_records(lambda r: r.get("type") == "drop", count=4)
            for trace in (by_pid, by_comm, by_other_comm):
                trace.stop()
            assert [d["pid"] for d in by_pid.drops()] == [sender.pid] * 3
            assert by_pid.summary()["total"] == 3
            assert {d["comm"] for d in by_comm.drops()} == {comm}
            assert by_other_comm.drops() == [] and by_other_comm.summary()["total"] == 0
    finally:
        if sender.poll() is None:
            sender.kill()


def test_storm_of_a_million_drops_has_exact_totals(pair: Pair, udpflood: str) -> None:
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "5900", "-j", "DROP")
    count = 1_000_000
    with (
        TraceRun("drops", "--summary", "--netns", pair.a.name, "--dport", "5900") as summary,
        TraceRun("drops", "--netns", pair.a.name, "--dport", "5900") as stream,
    ):
        summary.wait_ready()
        stream.wait_ready()
        result = json.loads(pair.a.run(udpflood, pair.b4, "5900", str(count)).stdout)
        assert result["refused"] == count  # each refusal is exactly one NETFILTER_DROP
        summary.stop()
        stream.stop()
        totals = summary.summary()
        # A million lines, read once (as JSON): the summary and the drops printed are both in them.
        records = stream.records()
    [*_, streamed] = [record for record in records if record.get("type") == "summary"]
    printed = sum(1 for record in records if record.get("type") == "drop")
    assert totals["total"] == count and totals["lost"] == 0
    [group] = [g for g in totals["groups"] if g["reason"] == "NETFILTER_DROP"]
    assert group["count"] == count
    # Streaming: the total is exact; whatever was not printed is accounted as sampled or lost.
    assert streamed["total"] == count
    assert printed == streamed["emitted"]
    # Every printed drop names the rule: most were given the stack their path's first drop unwound.
    rules = {record["netfilter"]["rule"] for record in records if record.get("type") == "drop"}
    assert rules == {"-A OUTPUT -p udp -m udp --dport 5900 -j DROP"}
    assert streamed["emitted"] + streamed["sampled"] + streamed["lost"] == count


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_nothing_stays_attached_after_exit(pair: Pair, sig: int) -> None:
    # The programs the run holds (its fds), so other tracers running on the machine do not matter.
    with TraceRun("drops", "--netns", pair.a.name) as trace:
        trace.wait_ready()
        ours = programs_held_by(trace.process.pid)
        assert len(ours) == 1 and ours <= {prog["id"] for prog in bpftool_netsleuth_programs()}
        trace.stop(sig)
        if sig == signal.SIGINT:
            assert trace.returncode == 0
    # The kernel frees programs once the last fd closes (after an RCU grace period); links go with them.
    wait_for(
        lambda: not ours & {prog["id"] for prog in bpftool_netsleuth_programs()}, 10, "programs released"
    )
    links = json.loads(
        subprocess.run(["bpftool", "-j", "link", "show"], capture_output=True, text=True).stdout or "[]"
    )
    assert not [link for link in links if link.get("prog_id") in ours]


def test_not_root_gets_one_sentence(pair: Pair) -> None:
    result = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            *netsleuth_argv("drops", "--duration", "1"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "root" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("program", ["drops_tp_btf", "drops_raw_tp"])
def test_each_program_variant_loads_and_sees_drops(pair: Pair, program: str) -> None:
    """The raw_tp fallback (kernels that refuse tp_btf) must verify and see the same drops."""
    from netsleuth.diagnostics.drops.decode import RawDrop
    from netsleuth.diagnostics.drops.program import DropsProgramConfig, DropsSession
    from netsleuth.diagnostics.filters import PacketFilter
    from netsleuth.kernel.reasons import load_drop_reasons

    config = DropsProgramConfig(
        packet_filter=PacketFilter(netns=pair.b.inode, dport=6001), stack=True, snaplen=64
    )
    with DropsSession(config, load_drop_reasons(), programs=(program,)) as session:
        session.start()
        assert session.attach_kind == program.removeprefix("drops_")
        udp(pair.a, pair.b4, 6001, count=3)
        seen: list[RawDrop] = []

        def three_seen() -> bool:
            seen.extend(session.poll(50))
            return len(seen) >= 3

        wait_for(three_seen, 10, "3 drops")
        assert session.totals().matched == 3
    for raw in seen:
        assert raw.packet.dport == 6001 and raw.frames and raw.packet_bytes[:1] == b"\x45"


def test_pcap_of_dropped_packets_reads_in_tshark(pair: Pair, tmp_path: Path) -> None:
    pair.b.run("iptables", "-A", "INPUT", "-p", "udp", "--dport", "6100", "-j", "DROP")
    capture = tmp_path / "drops.pcapng"
    with TraceRun(
        "drops", "--netns", pair.b.name, "--dport", "6100", "--pcap", str(capture), "--snaplen", "96"
    ) as trace:
        trace.wait_ready()
        udp(pair.a, pair.b4, 6100, count=2)
        trace.wait_records(lambda r: r.get("type") == "drop", count=2)
        trace.stop()
    fields = subprocess.run(
        [
            "tshark",
            "-r",
            str(capture),
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-e",
            "ip.src",
            "-e",
            "udp.dstport",
            "-e",
            "frame.len",
            "-e",
            "frame.comment",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert len(fields) == 2
    source, port, length, comments = fields[0].split("|", 3)
    assert (source, port, length) == (pair.a4, "6100", "60")  # 20 IP + 8 UDP + 32 payload
    assert "reason=NETFILTER_DROP" in comments
    assert "rule=filter/INPUT: -A INPUT -p udp -m udp --dport 6100 -j DROP" in comments
    assert f"netns={pair.b.name}" in comments
