"""`netsleuth softirq` against a real UDP storm between namespaces: NAPI polls and packets counted exactly
(the veth receive path is NAPI when GRO is on and the sender's skbs are GRO-eligible), NET_RX histograms,
the --dev filter; `diagnose` turning NET_RX runs that stop on netdev_budget into one exact verdict that
absorbs the doctor's time-squeeze finding; nothing left attached; bad input."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.netlab import run, wait_for
from tests.privileged.conftest import Pair
from tests.tracerun import TraceRun, bpftool_netsleuth_programs, diagnose_verdicts, netsleuth_argv

pytestmark = pytest.mark.privileged


@pytest.fixture
def napi_pair(pair: Pair, udpflood: str) -> Iterator[Pair]:
    """b receives through veth NAPI: GRO on b's end, TSO off on a's (veth_skb_is_eligible_for_gro)."""
    pair.b.run("ethtool", "-K", "veth0", "gro", "on")
    pair.a.run("ethtool", "-K", "veth0", "tso", "off")
    # No IPv6 chatter (router solicitations, MLD reports) on the link: the storm is all b receives.
    for host in (pair.a, pair.b):
        host.run("sysctl", "-qw", "net.ipv6.conf.veth0.disable_ipv6=1")
    # Resolve ARP before any trace starts, so the storm is the only traffic on b's device.
    pair.a.run(udpflood, pair.b4, "9", "1")
    yield pair


def rx_packets(pair: Pair) -> int:
    return int(pair.b.run("cat", "/sys/class/net/veth0/statistics/rx_packets").stdout)


def napi_of(summary: dict[str, Any], netns_name: str) -> list[dict[str, Any]]:
    return [napi for napi in summary["napi"] if napi["netns_name"] == netns_name]


def test_udp_storm_polls_and_packets_counted_exactly(napi_pair: Pair, udpflood: str) -> None:
    pair = napi_pair
    trace = TraceRun("softirq", "--netns", pair.b.name, "--dev", "veth0")
    try:
        trace.wait_ready()
        before = rx_packets(pair)
        sent = json.loads(pair.a.run(udpflood, pair.b4, "9", "30000").stdout)["sent"]
        after = rx_packets(pair)
    finally:
        trace.stop()
    assert sent == 30000
    (summary,) = trace.records()
    (napi,) = napi_of(summary, pair.b.name)  # --netns and --dev keep this one NAPI instance only
    assert napi["dev"] == "veth0" and napi["budget"] == 64
    # Every packet b's veth received went through its NAPI poll: the kernel's counter and ours agree exactly.
    assert napi["packets"] == after - before == 30000
    assert napi["polls"] == sum(napi["polls_by_cpu"].values())
    assert napi["polls"] >= 30000 // 64
    assert sum(napi["packets_per_poll_histogram"].values()) == napi["polls"]
    net_rx = summary["net_rx"]
    assert net_rx["polls"] >= napi["polls"] and net_rx["packets"] >= 30000  # all devices and CPUs
    vectors = {vector["vector"]: vector for vector in summary["vectors"]}
    assert vectors["NET_RX"]["runs"] >= 30000 // 300
    assert vectors["NET_RX"]["latency"]["count"] > 0 and vectors["NET_RX"]["duration"]["count"] > 0
    assert vectors["NET_RX"]["latency"]["p99_ns"] >= vectors["NET_RX"]["latency"]["p50_ns"]


@pytest.fixture
def small_netdev_budget() -> Iterator[int]:
    """net.core.netdev_budget is one value for the host (init_net): set low for the test, then restored."""
    old = int(run("sysctl", "-n", "net.core.netdev_budget").stdout)
    run("sysctl", "-qw", "net.core.netdev_budget=4")
    try:
        yield 4
    finally:
        run("sysctl", "-qw", f"net.core.netdev_budget={old}")


def test_diagnose_names_net_rx_runs_stopped_on_the_packet_budget(
    napi_pair: Pair, udpflood: str, small_netdev_budget: int
) -> None:
    pair = napi_pair

    def traffic() -> None:
        # Two senders on two CPUs fill one NAPI ring faster than one poll per packet: runs handle several
        # packets, more than netdev_budget = 4.
        floods = [
            threading.Thread(
                target=pair.a.run, args=("taskset", "-c", str(cpu), udpflood, pair.b4, "9", "40000")
            )
            for cpu in (0, 1)
        ]
        for flood in floods:
            flood.start()
        for flood in floods:
            flood.join()

    verdicts = diagnose_verdicts(traffic=traffic, duration=4, attach_timeout=30)
    budget = [verdict for verdict in verdicts if verdict["category"] == "net-rx-budget"]
    assert len(budget) == 1, [verdict["category"] for verdict in verdicts]
    (verdict,) = budget
    evidence = verdict["evidence"]
    assert evidence["netdev_budget"] == small_netdev_budget
    assert sum(evidence["budget_runs_by_cpu"].values()) > 0
    assert (
        "stopped on the packet budget" in verdict["cause"] or "handled netdev_budget = 4" in verdict["cause"]
    )
    assert "sysctl -w net.core.netdev_budget=8" in verdict["fix"]
    # The doctor's inferred finding is absorbed, not repeated.
    assert not any(verdict["category"] == "path:time-squeeze" for verdict in verdicts)


def test_nothing_stays_attached_after_exit() -> None:
    # By program id: other tracers on the host (a parallel test, diagnose) may hold softirq programs too.
    def program_ids() -> set[int]:
        return {int(program["id"]) for program in bpftool_netsleuth_programs("sirq_")}

    before = program_ids()
    trace_run = TraceRun("softirq")
    trace_run.wait_ready()
    ours = program_ids() - before
    assert ours
    assert trace_run.stop() == 0
    # The kernel frees programs once the last fd closes, after an RCU grace period: wait, bounded.
    wait_for(lambda: not ours & program_ids(), 10, "softirq programs released")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--vector", "NET_RXX"], "is not a softirq of this kernel"),
        (["--dev", "an-interface-name-too-long"], "is not an interface name"),
        (["--duration", "-1"], "--duration must be a positive number"),
        (["--netns", "no-such-namespace-here"], "unknown network namespace"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args: list[str], words: str) -> None:
    result = subprocess.run(netsleuth_argv("softirq", *args), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
