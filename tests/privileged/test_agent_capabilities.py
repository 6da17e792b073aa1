"""The agent under exactly the systemd unit's capabilities (uid 0, bounding/ambient set from
packaging/netsleuth-agent.service, noroot securebits, no_new_privs): counts drops, names functions and
owners, runs sessions; and without BPF run-time accounting it refuses sessions rather than run them
unbounded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from netsleuth.agent.client import AgentError
from tests.netlab import wait_for
from tests.privileged.conftest import Pair
from tests.privileged.test_agent_harness import AgentProcess

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging" / "netsleuth-agent.service"
# include/uapi/linux/capability.h
CAP_BITS = {
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_NET_ADMIN": 12,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYSLOG": 34,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
}


def unit_capabilities() -> list[str]:
    for line in UNIT.read_text().splitlines():
        if line.startswith("CapabilityBoundingSet="):
            return line.partition("=")[2].split()
    raise AssertionError("the unit sets no CapabilityBoundingSet")


def setpriv_prefix(capabilities: list[str]) -> list[str]:
    names = ",".join("+" + cap.removeprefix("CAP_").lower() for cap in capabilities)
    return [
        "setpriv",
        f"--bounding-set=-all,{names}",
        f"--inh-caps=-all,{names}",
        f"--ambient-caps=-all,{names}",
        "--securebits=+noroot,+noroot_locked",
        "--no-new-privs",
        "--",
    ]


def effective_caps(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError("no CapEff")


def test_agent_works_with_only_the_units_capabilities(
    pair: Pair, udpflood: str, bpf_stats_sysctl: Callable[[str], None]
) -> None:
    capabilities = unit_capabilities()
    bpf_stats_sysctl("1")
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "6300", "-j", "DROP")
    with AgentProcess(argv_prefix=setpriv_prefix(capabilities)) as agent:
        agent.wait_ready()
        assert effective_caps(agent.pid) == sum(1 << CAP_BITS[cap] for cap in capabilities)
        assert agent.metric("netsleuth_bpf_stats_enabled") == 1
        count = 20_000
        result = json.loads(pair.a.run(udpflood, pair.b4, "6300", str(count)).stdout)
        assert result["refused"] == count
        series = {"reason": "NETFILTER_DROP", "netns": str(pair.a.inode)}
        wait_for(lambda: agent.metric("netsleuth_drops_total", **series) == count, 10, "the storm's count")
        locations = {
            dict(labels)["location"]
            for (name, labels), _ in agent.metrics().items()
            if name == "netsleuth_drops_by_location_total" and dict(labels)["reason"] == "NETFILTER_DROP"
        }
        assert locations and not any(location.startswith("0x") for location in locations)  # CAP_SYSLOG
        request = {"diagnostic": "drops", "filters": {"netns": pair.a.name, "dport": 6300}, "max_events": 2}
        with agent.client.session(request) as stream:
            lines = iter(stream)
            next(lines)
            pair.a.run(udpflood, pair.b4, "6300", "2")
            records = list(lines)
        drops = [record for record in records if record["type"] == "drop"]
        assert len(drops) == 2 and records[-1]["reason"] == "max_events"
        assert drops[0]["location"].split("+")[0] in locations and drops[0]["netns_name"] == pair.a.name
        assert drops[0]["owner"] == "task" and drops[0]["comm"] == "udpflood"
        # No CAP_SYS_ADMIN: the firewall of another namespace is out of reach; the drop keeps its hook, has no
        # rule, and the record and the session say why (docs/agent.md).
        assert drops[0]["netfilter"]["hook"] == "output" and drops[0]["netfilter"]["rule"] is None
        assert "needs CAP_SYS_ADMIN" in drops[0]["netfilter"]["problem"]
        assert any("needs CAP_SYS_ADMIN" in note for note in records[-1]["notes"])
        assert "Traceback" not in agent.stderr()


def test_without_run_time_accounting_sessions_are_refused(bpf_stats_sysctl: Callable[[str], None]) -> None:
    bpf_stats_sysctl("0")
    with AgentProcess(argv_prefix=setpriv_prefix(unit_capabilities())) as agent:
        agent.wait_ready()
        assert agent.metric("netsleuth_bpf_stats_enabled") == 0
        assert "BPF run-time accounting is off" in agent.stderr()
        with pytest.raises(AgentError) as refused:
            agent.client.session({"diagnostic": "drops", "duration": 1})
        assert refused.value.status == 503 and "kernel.bpf_stats_enabled=1" in str(refused.value)
        assert agent.http.get("/readyz")[0] == 200  # the exporter still works
