"""`netsleuth dns` end to end: a real DNS server (tests/dns_server.py, dnspython) in one namespace, real
resolvers (`dig`, glibc's `getent`) in another, and netsleuth's cgroup/tracepoint programs on this kernel.

Every count is compared with what the test sent or what the server says it answered.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.netlab import Host, wait_for
from tests.privileged.conftest import Pair
from tests.tracerun import TraceRun, bpftool_netsleuth_programs, netsleuth_argv

REPO = Path(__file__).resolve().parents[2]


@dataclass
class DnsLab:
    pair: Pair
    client: Host
    server: Host
    stats_file: Path
    process: subprocess.Popen[bytes]

    def server_counts(self) -> dict[str, int]:
        """Stop the server and read what it answered, by "proto RCODE"."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(10)
        counts: dict[str, int] = json.loads(self.stats_file.read_text())
        return counts


@pytest.fixture
def dns_lab(pair: Pair) -> Iterator[DnsLab]:
    with tempfile.TemporaryDirectory(prefix="netsleuth-dns-") as scratch:
        ready = Path(scratch) / "ready"
        stats = Path(scratch) / "stats.json"
        process = pair.b.popen(
            [
                sys.executable,
                "-m",
                "tests.dns_server",
                "--address",
                pair.b4,
                "--address",
                pair.b6,
                "--ready-file",
                str(ready),
                "--stats-file",
                str(stats),
            ],
            cwd=str(REPO),
        )
        try:
            wait_for(ready.exists, 20, "the DNS server to listen")
            yield DnsLab(pair, pair.a, pair.b, stats, process)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def dig(
    host: Host, server: str, name: str, qtype: str = "A", *extra: str
) -> subprocess.CompletedProcess[str]:
    return host.run("dig", "+time=2", "+tries=1", f"@{server}", name, qtype, *extra, check=False)


@contextlib.contextmanager
def search_list(lab: DnsLab) -> Iterator[None]:
    """The client's resolv.conf (bind-mounted by `ip netns exec` from /etc/netns/<name>/) with three search
    domains and ndots:5: a lookup of `api.svc` tries each domain first."""
    netns_etc = Path("/etc/netns") / lab.client.name
    netns_etc.mkdir(parents=True)
    (netns_etc / "resolv.conf").write_text(
        f"nameserver {lab.pair.b4}\nsearch a.test b.test c.test\noptions ndots:5 attempts:1\n"
    )
    try:
        yield
    finally:
        (netns_etc / "resolv.conf").unlink(missing_ok=True)
        netns_etc.rmdir()


class DnsTrace(TraceRun):
    """A TraceRun whose output outlives its temporary directory, so a test reads it after the `with`."""

    _kept: str | None = None

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> int:
        code = super().stop(sig, timeout)
        self._kept = super().stdout()
        return code

    def stdout(self) -> str:
        return self._kept if self._kept is not None else super().stdout()


def trace(lab: DnsLab, *args: str) -> DnsTrace:
    return DnsTrace("dns", "--netns", lab.client.name, *args)


def of_type(run: TraceRun, record_type: str) -> list[dict[str, Any]]:
    return [record for record in run.records() if record.get("type") == record_type]


def test_answered_a_and_aaaa_over_ipv4_and_ipv6_with_latency_and_process(dns_lab: DnsLab) -> None:
    with trace(dns_lab) as run:
        run.wait_ready()
        for server in (dns_lab.pair.b4, dns_lab.pair.b6):
            for qtype in ("A", "AAAA"):
                for _ in range(3):
                    assert dig(dns_lab.client, server, "www.ok.test", qtype).returncode == 0
        run.wait_records(lambda record: record.get("type") == "dns", count=12)
        assert run.stop() == 0
    answers = of_type(run, "dns")
    assert len(answers) == 12
    for answer in answers:
        assert answer["name"] == "www.ok.test"
        assert answer["rcode"] == "NOERROR"
        assert answer["answer_count"] == 1
        assert answer["latency_ms"] > 0
        assert answer["proto"] == "udp"
        assert answer["comm"] == "dig"  # the process, not its sending thread (isc-net-0000)
        assert answer["owner"] == "task"
        assert answer["netns"] == dns_lab.client.inode
        expected = "A 198.18.0.2" if answer["qtype"] == "A" else "AAAA 2001:db8::2"
        assert answer["answers"] == [expected]
    servers = {(answer["server"], answer["family"]) for answer in answers}
    assert servers == {(dns_lab.pair.b4, 4), (dns_lab.pair.b6, 6)}
    summary = run.summary()
    assert summary["queries"] == 12 and summary["answers"] == 12 and summary["timeouts"] == 0
    assert summary["lost"] == 0 and summary["sampled"] == 0
    assert dns_lab.server_counts() == {"udp NOERROR": 12}


def test_nxdomain_servfail_refused_counted_exactly_and_filtered_by_rcode(dns_lab: DnsLab) -> None:
    sent = {"nothing.test": 4, "servfail.test": 3, "refused.test": 2, "www.ok.test": 5}
    with trace(dns_lab, "--summary") as summary_run, trace(dns_lab, "--rcode", "SERVFAIL") as servfail_run:
        summary_run.wait_ready()
        servfail_run.wait_ready()
        for name, count in sent.items():
            for _ in range(count):
                dig(dns_lab.client, dns_lab.pair.b4, name)
        servfail_run.wait_records(lambda record: record.get("type") == "dns", count=3)
        summary_run.stop()
        servfail_run.stop()
    rows = summary_run.summary()["rows"]
    answers: dict[str, int] = {}
    for row in rows:
        for rcode, count in row["answers"].items():
            answers[rcode] = answers.get(rcode, 0) + count
    assert answers == {"NXDOMAIN": 4, "SERVFAIL": 3, "REFUSED": 2, "NOERROR": 5}
    assert sum(row["queries"] for row in rows) == 14
    shown = of_type(servfail_run, "dns")
    assert [record["name"] for record in shown] == ["servfail.test"] * 3
    # The kernel still counts every answer, shown or not; those --rcode left out are filtered, not sampled.
    assert servfail_run.summary()["answers"] == 14
    assert servfail_run.summary()["filtered"] == 11 and servfail_run.summary()["sampled"] == 0
    assert dns_lab.server_counts() == {
        "udp NXDOMAIN": 4,
        "udp SERVFAIL": 3,
        "udp REFUSED": 2,
        "udp NOERROR": 5,
    }


def test_answers_left_out_by_rcode_are_called_filtered_not_sampled(dns_lab: DnsLab) -> None:
    """`--rcode TIMEOUT` shows timeouts only: the answers it leaves out are counted as filtered, and the text
    never calls them sampled (which reads as data lost)."""
    with DnsTrace("dns", "--netns", dns_lab.client.name, "--rcode", "TIMEOUT", json_output=False) as run:
        run.wait_ready()
        for name in ("a.ok.test", "b.ok.test", "nothing.test"):
            dig(dns_lab.client, dns_lab.pair.b4, name)
        run.stop()
        stderr = run.stderr()
    assert run.returncode == 0
    assert "3 answers filtered out (--rcode/--slow), 0 shown, 0 sampled, 0 lost" in run.stdout()
    assert "sampled" not in stderr  # no loss line


def test_timeout_from_firewall_dropping_answers_names_the_rule(dns_lab: DnsLab) -> None:
    dns_lab.client.run("iptables", "-A", "INPUT", "-p", "udp", "--sport", "53", "-j", "DROP")
    with trace(dns_lab, "--timeout", "1") as run:
        run.wait_ready()
        result = dig(dns_lab.client, dns_lab.pair.b4, "lost.ok.test")
        assert "timed out" in result.stdout or result.returncode != 0
        run.wait_records(lambda record: record.get("type") == "dns_timeout", count=1)
        run.stop()
    timeouts = of_type(run, "dns_timeout")
    assert len(timeouts) == 1
    timeout = timeouts[0]
    assert timeout["name"] == "lost.ok.test"
    assert timeout["waited_ms"] >= 1000
    assert timeout["drop"]["reason"] == "NETFILTER_DROP"
    assert timeout["drop"]["direction"] == "answer"
    assert "--sport 53 -j DROP" in timeout["drop"]["rule"]
    assert "--sport 53 -j DROP" in timeout["cause"]
    assert of_type(run, "dns") == []
    assert run.summary()["timeouts"] == 1


# A client that asks without reading: its tiny receive buffer fills and the kernel drops the rest.
FLOOD_CLIENT = """
import socket, struct, sys, time
import dns.message
server, count, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
sock.connect((server, 53))
for index in range(count):
    query = dns.message.make_query("rcv.ok.test", "A")
    query.id = index + 1
    sock.send(query.to_wire())
    time.sleep(0.002)
open(ready, "w").write("sent")
input()  # hold the socket (unread) until the test has seen every answer
sock.setblocking(False)
queued = 0
while True:
    try:
        sock.recv(4096)
    except BlockingIOError:
        break
    queued += 1
print(queued)
"""


def test_timeout_from_full_receive_buffer_names_the_process(dns_lab: DnsLab, tmp_path: Path) -> None:
    sent = 40
    ready = tmp_path / "sent"
    with trace(dns_lab, "--timeout", "2") as run:
        run.wait_ready()
        client = dns_lab.client.popen(
            [sys.executable, "-c", FLOOD_CLIENT, dns_lab.pair.b4, str(sent), str(ready)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            wait_for(ready.exists, 20, "the client to send its queries")

            def all_seen() -> bool:
                records = run.records()
                return sum(1 for r in records if r.get("type") in ("dns", "dns_timeout")) >= sent

            wait_for(all_seen, 20, "every query to be answered or timed out")
            stdout, _ = client.communicate(b"\n", timeout=20)
        finally:
            if client.poll() is None:
                client.kill()
        run.stop()
    queued = int(stdout.decode().strip())
    answers = of_type(run, "dns")
    timeouts = of_type(run, "dns_timeout")
    assert 0 < queued < sent
    assert len(answers) == queued
    assert len(timeouts) == sent - queued
    for timeout in timeouts:
        assert timeout["drop"]["reason"] == "SOCKET_RCVBUFF"
        assert timeout["answer_arrived_ms"] is not None
        assert timeout["comm"] == "python3" or timeout["comm"].startswith("python")
        assert f"[{client.pid}]" in timeout["cause"]
        assert "receive buffer" in timeout["cause"]
    summary = run.summary()
    assert summary["queries"] == sent and summary["answers"] == sent
    assert summary["timeouts"] == sent - queued


def test_search_list_amplification_from_ndots(dns_lab: DnsLab) -> None:
    with search_list(dns_lab), trace(dns_lab, "--summary") as run:
        run.wait_ready()
        for _ in range(2):
            result = dns_lab.client.run("getent", "ahostsv4", "api.svc", check=False)
            assert "198.18.0.2" in result.stdout
        run.stop()
    rows = [row for row in run.summary()["rows"] if row["comm"] == "getent"]
    assert len(rows) == 2  # one per getent process
    for row in rows:
        assert row["suffix"] == "api.svc"
        # One lookup: three search-list expansions (NXDOMAIN), then the name itself; only A (ahostsv4).
        assert row["queries"] == 4
        assert row["lookups"] == 1
        assert row["search_expansions"] == 3
        assert row["amplification"] == 4.0
        assert row["answers"] == {"NXDOMAIN": 3, "NOERROR": 1}


@pytest.mark.parametrize("family", [4, 6])
def test_truncated_answer_and_tcp_retry(dns_lab: DnsLab, family: int) -> None:
    server = dns_lab.pair.b4 if family == 4 else dns_lab.pair.b6
    with trace(dns_lab) as run:
        run.wait_ready()
        result = dig(dns_lab.client, server, "big.test", "A", "+bufsize=512")
        assert "198.18.1.100" in result.stdout
        run.wait_records(lambda record: record.get("type") == "dns", count=2)
        run.stop()
    udp, tcp = of_type(run, "dns")
    assert udp["proto"] == "udp" and udp["truncated"] is True and udp["answer_count"] == 0
    assert tcp["proto"] == "tcp" and tcp["tcp_retry"] is True and tcp["answer_count"] == 100
    assert tcp["truncated"] is False
    assert udp["pid"] == tcp["pid"] and udp["family"] == tcp["family"] == family
    assert dns_lab.server_counts() == {"udp NOERROR": 1, "tcp NOERROR": 1}


def test_slow_and_name_filters(dns_lab: DnsLab) -> None:
    with trace(dns_lab, "--slow", "200", "--name", "test") as run:
        run.wait_ready()
        dig(dns_lab.client, dns_lab.pair.b4, "slow.test")
        dig(dns_lab.client, dns_lab.pair.b4, "fast.ok.test")
        run.wait_records(lambda record: record.get("type") == "dns", count=1)
        run.stop()
    shown = of_type(run, "dns")
    assert [record["name"] for record in shown] == ["slow.test"]
    assert shown[0]["latency_ms"] >= 300
    assert run.summary()["answers"] == 2


def test_nothing_stays_attached_after_exit(dns_lab: DnsLab) -> None:
    from tests.privileged.test_agent_harness import bpf_object_ids, wait_released

    with trace(dns_lab) as run:
        run.wait_ready()
        programs, links = bpf_object_ids(run.process.pid)  # ours, whatever else runs on the host
        names = {prog["name"] for prog in bpftool_netsleuth_programs("dns_") if prog["id"] in programs}
        assert names == {"dns_egress", "dns_ingress", "dns_drop_b"}
        assert len(links) == 3  # two cgroup links and the tracepoint's
        run.stop(signal.SIGTERM)
    wait_released(programs, links)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--rcode", "NOPE"], "--rcode 'NOPE' is not a DNS response code"),
        (["--slow=-3"], "--slow '-3' is not a number of milliseconds, 0 or more"),
        (["--timeout", "0"], "--timeout '0' is not a number of seconds over 0 and up to 3600"),
        (["--name", "a..b"], "is not a DNS name"),
        (["--dns-port", "70000"], "is not a port"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args: list[str], words: str) -> None:
    result = subprocess.run(netsleuth_argv("dns", *args), capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
    assert os.geteuid() == 0  # privileged suite: root is what made it past the argument checks


def _own_server_addresses() -> tuple[str, str]:
    """Two addresses no other test on this machine queries at the same time (from this process's pid, in
    198.19.0.0/16): the agent's exporter counts every namespace's DNS by server address, and other tests'
    labs ask 198.18.0.2 too."""
    index = 2 * (os.getpid() % 32768)
    return f"198.19.{index >> 8}.{index & 255}", f"198.19.{index >> 8}.{(index & 255) + 1}"


def test_agent_exports_dns_counters_by_server_and_rcode(dns_lab: DnsLab) -> None:
    from tests.privileged.test_agent_harness import AgentProcess

    # This test's own server, and a second address where nothing listens: its queries are never answered
    # (timeouts). Both on b, reached from a through b.
    answering, silent_address = _own_server_addresses()
    for address in (answering, silent_address):
        dns_lab.server.run("ip", "addr", "add", f"{address}/32", "dev", "veth0")
    dns_lab.client.run("ip", "route", "add", "198.19.0.0/16", "via", dns_lab.pair.b4)
    config = {"exporter": {"dns": {"enabled": True, "timeout": 1.0}}}
    with (
        tempfile.TemporaryDirectory(prefix="netsleuth-dns-") as scratch,
        AgentProcess(config) as agent,
    ):
        ready = Path(scratch) / "ready"
        own_server = dns_lab.server.popen(
            [sys.executable, "-m", "tests.dns_server", "--address", answering, "--ready-file", str(ready)],
            cwd=str(REPO),
        )
        try:
            wait_for(ready.exists, 20, "the DNS server to listen")
            agent.wait_ready()
            for name, count in (("www.ok.test", 3), ("nothing.test", 2), ("servfail.test", 1)):
                for _ in range(count):
                    dig(dns_lab.client, answering, name)
            dig(dns_lab.client, silent_address, "www.ok.test")
        finally:
            own_server.kill()
            own_server.wait()
        server, silent = f"{answering}:53/udp", f"{silent_address}:53/udp"

        def swept() -> bool:
            return agent.metric("netsleuth_dns_timeouts_total", server=silent) == 1

        wait_for(swept, 20, "the timeout to be swept and exported")
        assert agent.metric("netsleuth_dns_queries_total", server=server) == 6
        assert agent.metric("netsleuth_dns_answers_total", server=server, rcode="NOERROR") == 3
        assert agent.metric("netsleuth_dns_answers_total", server=server, rcode="NXDOMAIN") == 2
        assert agent.metric("netsleuth_dns_answers_total", server=server, rcode="SERVFAIL") == 1
        assert agent.metric("netsleuth_dns_timeouts_total", server=server) == 0
        assert agent.metric("netsleuth_dns_queries_total", server=silent) == 1
        assert agent.metric("netsleuth_dns_latency_seconds_count", server=server) == 6
        assert agent.metric("netsleuth_dns_latency_seconds_bucket", server=server, le="+Inf") == 6
        programs, _links = agent.bpf_ids()
        assert len(programs) == 4  # the drops exporter + dns egress, ingress, kfree_skb
        assert agent.stop() == 0


def test_agent_session_runs_dns_from_the_registry(dns_lab: DnsLab) -> None:
    from tests.privileged.test_agent_harness import AgentProcess

    request = {
        "diagnostic": "dns",
        "config": {"netns": dns_lab.client.name, "rcode": ["NXDOMAIN"], "timeout": 1},
        "duration": 60,
        "max_events": 2,
    }
    with AgentProcess() as agent:
        agent.wait_ready()
        with agent.client.session(request) as stream:
            lines = iter(stream)
            assert next(lines)["type"] == "session_start"
            for name in ("www.ok.test", "gone.test", "gone.test"):
                dig(dns_lab.client, dns_lab.pair.b4, name)
            records = []
            for line in lines:
                records.append(line)
                if line["type"] == "session_end":
                    break
    answers = [record for record in records if record["type"] == "dns"]
    assert [(a["name"], a["rcode"], a["v"]) for a in answers] == [("gone.test", "NXDOMAIN", 1)] * 2
    summary = next(record for record in records if record["type"] == "summary")
    assert summary["diagnostic"] == "dns" and summary["queries"] == 3 and summary["answers"] == 3


def test_diagnose_gives_dns_verdicts(dns_lab: DnsLab) -> None:
    with search_list(dns_lab), DnsTrace("diagnose", "--netns", dns_lab.client.name, "--duration", "6") as run:
        run.wait_ready()
        dns_lab.client.run("getent", "ahostsv4", "api.svc", check=False)
        for _ in range(3):
            dig(dns_lab.client, dns_lab.pair.b4, "servfail.test")
        dns_lab.client.run("iptables", "-A", "INPUT", "-p", "udp", "--sport", "53", "-j", "DROP")
        dig(dns_lab.client, dns_lab.pair.b4, "lost.ok.test")
        assert run.finish(60) == 0
        records = run.records()
    verdicts = {record["category"]: record for record in records if record.get("type") == "verdict"}
    assert {"dns-timeout-firewall", "dns-servfail", "dns-search-amplification"} <= set(verdicts)
    assert {
        category: verdicts[category]["cause_code"] for category in verdicts if category.startswith("dns-")
    } == {
        "dns-timeout-firewall": "firewall_drop",
        "dns-servfail": "dns_servfail",
        "dns-search-amplification": "dns_search_amplification",
    }
    # The firewall verdict of the same rule and packets is part of the DNS verdict, not another one.
    assert (
        "firewall" not in verdicts and verdicts["dns-timeout-firewall"]["evidence"]["firewall"]["drops"] >= 1
    )
    firewall = verdicts["dns-timeout-firewall"]
    assert "--sport 53 -j DROP" in firewall["cause"] and firewall["severity"] == "critical"
    assert any("iptables -t filter -D INPUT 1" in fix for fix in firewall["fix"])
    assert verdicts["dns-servfail"]["evidence"]["answers"] == 3
    amplification = verdicts["dns-search-amplification"]
    assert "api.svc" in amplification["cause"] and "becomes 4.0 DNS queries" in amplification["cause"]
    assert any("ndots" in fix for fix in amplification["fix"])
    # Only names this resolv.conf's search list makes: no Kubernetes suggestion on a host without one.
    assert amplification["evidence"]["search_domains"] == ["a.test", "b.test", "c.test"]
    assert "api.svc.a.test, api.svc.b.test, api.svc.c.test answered NXDOMAIN" in amplification["cause"]
    assert not any("svc.cluster.local" in fix or "Kubernetes" in fix for fix in amplification["fix"])


def test_diagnose_groups_the_same_lookup_of_many_processes_into_one_verdict(dns_lab: DnsLab) -> None:
    """Three `getent` runs in a shell loop (a cron job's pattern) are one amplification verdict that counts
    the processes, not three identical ones."""
    with search_list(dns_lab), DnsTrace("diagnose", "--netns", dns_lab.client.name, "--duration", "4") as run:
        run.wait_ready()
        dns_lab.client.run("sh", "-c", "for i in 1 2 3; do getent ahostsv4 api.svc; done")
        assert run.finish(60) == 0
        records = run.records()
    verdicts = [record for record in records if record.get("type") == "verdict"]
    amplification = [verdict for verdict in verdicts if verdict["category"] == "dns-search-amplification"]
    assert len(amplification) == 1, [verdict["cause"] for verdict in verdicts]
    (verdict,) = amplification
    assert "each lookup of api.svc by getent (3 processes) becomes 4.0 DNS queries" in verdict["cause"]
    assert len(verdict["evidence"]["processes"]) == 3 and verdict["evidence"]["lookups"] == 3


def test_timeout_joined_with_a_drop_in_the_servers_namespace(dns_lab: DnsLab) -> None:
    """Traced with --netns of the client, the query is dropped by the server namespace's firewall: the
    timeout still names that rule (same host), and the drop itself is no record of the client's trace."""
    dns_lab.server.run("iptables", "-A", "INPUT", "-p", "udp", "--dport", "53", "-j", "DROP")
    with trace(dns_lab, "--timeout", "1") as run:
        run.wait_ready()
        dig(dns_lab.client, dns_lab.pair.b4, "blocked.ok.test")
        run.wait_records(lambda record: record.get("type") == "dns_timeout", count=1)
        run.stop()
    (timeout,) = of_type(run, "dns_timeout")
    drop = timeout["drop"]
    assert drop["direction"] == "query" and drop["reason"] == "NETFILTER_DROP"
    assert drop["netns"] == dns_lab.server.inode and "--dport 53 -j DROP" in drop["rule"]
    assert of_type(run, "dns_drop") == []
    assert run.summary()["dns_drops"] == 0  # counted only inside the traced namespace


PYTHON_QUERY = (
    "import sys, dns.message, dns.query\n"
    "dns.query.udp(dns.message.make_query(sys.argv[2], 'A'), sys.argv[1], timeout=2)\n"
)


def test_process_and_address_filters_apply_in_the_kernel(dns_lab: DnsLab) -> None:
    with trace(dns_lab, "--comm", "dig") as by_comm, trace(dns_lab, "--dst", dns_lab.pair.b6) as by_server:
        by_comm.wait_ready()
        by_server.wait_ready()
        dig(dns_lab.client, dns_lab.pair.b4, "a.ok.test")
        dig(dns_lab.client, dns_lab.pair.b6, "b.ok.test")
        dns_lab.client.run(sys.executable, "-c", PYTHON_QUERY, dns_lab.pair.b4, "c.ok.test")
        by_comm.wait_records(lambda record: record.get("type") == "dns", count=2)
        by_server.wait_records(lambda record: record.get("type") == "dns", count=1)
        by_comm.stop()
        by_server.stop()
    assert sorted(record["name"] for record in of_type(by_comm, "dns")) == ["a.ok.test", "b.ok.test"]
    assert by_comm.summary()["queries"] == 2
    assert [record["name"] for record in of_type(by_server, "dns")] == ["b.ok.test"]
    assert by_server.summary()["queries"] == 1


def test_not_root_gets_one_sentence() -> None:
    unprivileged = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    argv = [*unprivileged, *netsleuth_argv("dns", "--duration", "1")]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "root" in result.stderr
    assert "Traceback" not in result.stderr
