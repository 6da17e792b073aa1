"""`netsleuth route` against real policy routing in namespaces: a flow steered by `ip rule` into table 100, a
blackhole route, an unresolved next hop whose queued packets the kernel drops, exact counts, `diagnose`
verdicts, nothing left attached, and bad input."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.netlab import Host, wait_for
from tests.privileged.conftest import Pair
from tests.tracerun import TraceRun, bpftool_netsleuth_programs, diagnose_verdicts, netsleuth_argv

pytestmark = pytest.mark.privileged

CLIENT = "198.18.3.1"
PEER = "198.18.3.2"
STEERED = "198.18.7.5"  # table 100 via PEER, by `ip rule from 198.18.3.0/24 to 198.18.7.0/24 lookup 100`
BLACKHOLED = "198.18.5.9"  # blackhole 198.18.5.0/24 in table 100 (`ip rule from 198.18.3.0/24 lookup 100`)
SILENT_HOP = "198.18.3.9"  # a gateway nobody answers ARP for
BEHIND_SILENT_HOP = "198.18.9.4"

# UDP datagrams from a bound source (so policy rules on the source match from the first lookup), one
# sendto each (an unconnected socket looks the route up for every datagram); prints how many the kernel
# accepted and the errno of the rest.
SENDER = r"""
import errno, socket, sys
src, dst, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((src, 0))
sent = failed = 0
codes = set()
for _ in range(count):
    try:
        sock.sendto(b"route-test", (dst, 9999))
        sent += 1
    except OSError as error:
        failed += 1
        codes.add(errno.errorcode.get(error.errno, str(error.errno)))
print(sent, failed, ",".join(sorted(codes)))
"""


@pytest.fixture
def routed(pair: Pair) -> Iterator[Pair]:
    """The pair, re-addressed for routing: the client (a) has table 100 and two rules, and a route through a
    gateway that never answers ARP (fast to give up: one probe, 100 ms)."""
    a: Host = pair.a
    pair.b.run("ip", "addr", "add", f"{PEER}/24", "dev", "veth0")
    a.run("ip", "addr", "add", f"{CLIENT}/24", "dev", "veth0")
    a.run("ip", "route", "add", "198.18.7.0/24", "via", PEER, "dev", "veth0", "table", "100")
    a.run("ip", "route", "add", "blackhole", "198.18.5.0/24", "table", "100")
    a.run("ip", "rule", "add", "from", "198.18.3.0/24", "to", "198.18.7.0/24", "lookup", "100", "pref", "900")
    a.run("ip", "rule", "add", "from", "198.18.3.0/24", "lookup", "100", "pref", "1000")
    a.run("ip", "route", "add", "198.18.9.0/24", "via", SILENT_HOP, "dev", "veth0")
    # Namespace-local neighbour settings: one solicitation, 100 ms apart, so the hop fails within the test.
    a.run("sysctl", "-qw", "net.ipv4.neigh.veth0.mcast_solicit=1", "net.ipv4.neigh.veth0.retrans_time_ms=100")
    yield pair


def send(host: Host, src: str, dst: str, count: int) -> tuple[int, int, str]:
    out = host.run(sys.executable, "-c", SENDER, src, dst, str(count)).stdout.split()
    return int(out[0]), int(out[1]), out[2] if len(out) > 2 else ""


def trace(*args: str) -> TraceRun:
    return TraceRun("route", *args)


def of_type(records: list[dict[str, Any]], record_type: str) -> list[dict[str, Any]]:
    return [record for record in records if record.get("type") == record_type]


def test_policy_rule_and_table_named_for_a_steered_flow(routed: Pair) -> None:
    run_ = trace("--netns", routed.a.name, "--dst", "198.18.7.0/24")
    try:
        run_.wait_ready()
        sent, failed, _ = send(routed.a, CLIENT, STEERED, 5)
        assert (sent, failed) == (5, 0)
        run_.wait_records(lambda record: record.get("type") == "route", count=5)
    finally:
        run_.stop()
    lookups = of_type(run_.records(), "route")
    assert len(lookups) == 5, lookups  # one per datagram, and only this flow (--dst in the kernel)
    for lookup in lookups:
        assert lookup["netns_name"] == routed.a.name
        assert lookup["table"] == 100 and lookup["result"] == "route"
        assert lookup["rule"] == "900: from 198.18.3.0/24 to 198.18.7.0/24 lookup 100"
        assert lookup["route"] == f"198.18.7.0/24 via {PEER} dev veth0"
        assert lookup["gateway"] == PEER and lookup["dev"] == "veth0"
        assert (lookup["src"], lookup["dst"], lookup["proto"], lookup["dport"]) == (
            CLIENT,
            STEERED,
            "udp",
            9999,
        )
        assert lookup["comm"] == "python3" or lookup["comm"].startswith("python")
    summary = run_.records()[-1]
    assert summary["type"] == "summary" and summary["by_kind"]["lookup"]["total"] == 5


def test_blackhole_route_counted_exactly_and_named(routed: Pair) -> None:
    run_ = trace("--netns", routed.a.name, "--failed", "--summary")
    try:
        run_.wait_ready()
        sent, failed, codes = send(routed.a, CLIENT, BLACKHOLED, 37)
        assert (sent, failed, codes) == (0, 37, "EINVAL")  # a blackhole route fails the send with EINVAL
    finally:
        run_.stop()
    summary = run_.records()[-1]
    assert summary["type"] == "summary"
    groups = [group for group in summary["groups"] if group["kind"] == "lookup"]
    assert len(groups) == 1, groups
    group = groups[0]
    assert group["count"] == 37 and summary["by_kind"]["lookup"]["total"] == 37
    example = group["example"]
    assert example["result"] == "blackhole" and example["table"] == 100
    assert example["route"] == "blackhole 198.18.5.0/24"
    assert example["rule"] == "1000: from 198.18.3.0/24 lookup 100"
    assert example["dst"] == BLACKHOLED and example["netns_name"] == routed.a.name


def test_unresolved_next_hop_fails_and_its_packets_are_dropped(routed: Pair) -> None:
    run_ = trace("--netns", routed.a.name, "--failed")
    try:
        run_.wait_ready()
        sent, _, _ = send(routed.a, CLIENT, BEHIND_SILENT_HOP, 3)
        assert sent == 3  # queued while ARP runs: the send itself succeeds
        run_.wait_records(
            lambda record: record.get("type") == "neigh" and record["event"] == "failed", timeout=10
        )
        run_.wait_records(lambda record: record.get("type") == "route_drop", count=3, timeout=10)
    finally:
        run_.stop()
    records = run_.records()
    failures = of_type(records, "neigh")
    assert {(record["address"], record["dev"], record["event"]) for record in failures} == {
        (SILENT_HOP, "veth0", "failed")
    }
    drops = of_type(records, "route_drop")
    assert len(drops) == 3
    assert {(drop["reason"], drop["dst"]) for drop in drops} == {("NEIGH_FAILED", BEHIND_SILENT_HOP)}
    assert not of_type(records, "route")  # --failed: successful lookups are not shown


def test_diagnose_turns_blackhole_and_silent_next_hop_into_verdicts(routed: Pair) -> None:
    def traffic() -> None:
        send(routed.a, CLIENT, BLACKHOLED, 12)
        send(routed.a, CLIENT, BEHIND_SILENT_HOP, 4)

    verdicts = diagnose_verdicts("--netns", routed.a.name, traffic=traffic, duration=3, attach_timeout=30)
    by_category = {verdict["category"]: verdict for verdict in verdicts}
    blackhole = by_category["route-reject"]
    assert (
        f"packets to {BLACKHOLED} from netns {routed.a.name} hit blackhole route 198.18.5.0/24 in table 100 "
        "(ip rule 1000: from 198.18.3.0/24 lookup 100)" in blackhole["cause"]
    )
    assert blackhole["evidence"]["lookups"] == 12
    assert blackhole["cause_code"] == "route_reject"  # the catalogue's codes, as every verdict carries
    silent = by_category["next-hop-unresolved"]
    assert silent["cause_code"] == "neighbour_unresolved"
    assert f"next hop {SILENT_HOP} never answered ARP" in silent["cause"]
    assert silent["evidence"]["drops"] == 4


def test_nothing_stays_attached_after_exit(routed: Pair) -> None:
    # By program id: other tracers on the host (a parallel test, a diagnose run) may hold route programs too.
    def program_ids() -> set[int]:
        return {int(program["id"]) for program in bpftool_netsleuth_programs("route_")}

    before = program_ids()
    trace_run = trace("--netns", routed.a.name)
    trace_run.wait_ready()
    ours = program_ids() - before
    assert ours
    assert trace_run.stop() == 0
    # The kernel frees programs once the last fd closes, after an RCU grace period: wait, bounded.
    wait_for(lambda: not ours & program_ids(), 10, "route programs released")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--dst", "not-an-address"], "is not an IP address"),
        (["-6", "--dst", "2001:db8::/129"], "is not an IP address"),
        (["--failed", "--misses"], "cannot go with --failed"),
        (["--netns", "no-such-namespace-here"], "unknown network namespace"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args: list[str], words: str) -> None:
    result = subprocess.run(netsleuth_argv("route", *args), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
