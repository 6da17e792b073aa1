"""A real Prometheus server (Debian's `prometheus`, our own instance on a free loopback port with a temp
config and data dir) scrapes the agent while a drop storm runs; PromQL sees the drop counter of the storm's
reason and namespace grow by exactly the number of drops made."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.netlab import wait_for
from tests.privileged.conftest import Pair
from tests.privileged.test_agent_harness import AgentProcess
from tests.prometheus_lab import Prometheus


@pytest.fixture
def agent() -> Iterator[AgentProcess]:
    with AgentProcess() as running:
        running.wait_ready()
        yield running


@pytest.fixture
def prometheus(agent: AgentProcess) -> Iterator[Prometheus]:
    with Prometheus.scraping(f"127.0.0.1:{agent.port}") as server:
        yield server


def flood(pair: Pair, udpflood: str, port: int, count: int) -> None:
    result = json.loads(pair.a.run(udpflood, pair.b4, str(port), str(count)).stdout)
    assert result["refused"] == count  # each refusal is exactly one NETFILTER_DROP, in namespace a


def test_prometheus_sees_exactly_the_drops_made(
    pair: Pair, udpflood: str, agent: AgentProcess, prometheus: Prometheus
) -> None:
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "6200", "-j", "DROP")
    # Namespace a is this test's own, so its NETFILTER_DROP series counts nothing but our drops (other
    # tests on this machine drop packets too, in their own namespaces).
    series = f'netsleuth_drops_total{{reason="NETFILTER_DROP",netns="{pair.a.inode}"}}'
    wait_for(lambda: prometheus.scalar('up{job="netsleuth"}') == 1, 30, "the first scrape")

    flood(pair, udpflood, 6200, 1)  # the series now exists: a baseline PromQL can subtract
    baseline: list[float] = []

    def baseline_scraped() -> bool:
        moment = time.time()
        if prometheus.scalar(series, moment) == 1:
            baseline.append(moment)
            return True
        return False

    wait_for(baseline_scraped, 30, "Prometheus to scrape the baseline drop")
    storm = 300_000
    flood(pair, udpflood, 6200, storm)
    wait_for(lambda: prometheus.scalar(series) == 1 + storm, 30, "Prometheus to scrape the storm")
    increase = prometheus.scalar(f"{series} - {series} @ {baseline[0]:.3f}")
    assert increase == storm

    # The rest of the exposition is in Prometheus too: path health and self-metrics.
    by_location = prometheus.query('netsleuth_drops_by_location_total{reason="NETFILTER_DROP"}')
    assert by_location and all(row["metric"]["location"] for row in by_location)
    assert prometheus.scalar('sum(netsleuth_bpf_programs_attached{owner="exporter"})') == 1
    assert (prometheus.scalar("sum(netsleuth_bpf_program_runs_total)") or 0) >= storm
    assert prometheus.scalar('netsleuth_scrape_collector_success{collector="drops"}') == 1
    assert prometheus.scalar('netsleuth_link_up{device="lo"}') is not None
    assert prometheus.scalar("netsleuth_tcp_resets_sent_total") is not None
    assert prometheus.scalar("process_resident_memory_bytes") is not None
    # The namespace's name is one join away.
    named = prometheus.query(f'netsleuth_netns_info{{netns="{pair.a.inode}"}}')
    assert named and named[0]["metric"]["name"] == pair.a.name
