"""The drops exporter, through a registry, on hand-made kernel group counts (no BPF)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from netsleuth._generated.drops_abi import DropEvent
from netsleuth.agent.config import DropsExporterConfig
from netsleuth.diagnostics.drops.collector import DropsCollector
from netsleuth.diagnostics.drops.decode import RawDropGroup, decode_event
from netsleuth.diagnostics.drops.program import DropTotals
from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.function_names import FunctionNames, _names_from, resolve_in_child
from netsleuth.kernel.kallsyms import Kallsyms
from netsleuth.kernel.netns import NetnsNames
from netsleuth.kernel.pods import PodIndex
from netsleuth.kernel.reasons import DropReasons, load_drop_reasons

FIXTURES = Path(__file__).parents[1] / "fixtures"
KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81100000 T nf_hook_slow
ffffffff81200000 T tcp_v4_rcv
ffffffff81300000 T __udp4_lib_rcv
"""
NF_HOOK = 0xFFFFFFFF81100040
TCP_RCV = 0xFFFFFFFF81200100
UDP_RCV = 0xFFFFFFFF81300200


def reasons() -> DropReasons:
    return load_drop_reasons(Path("/nonexistent"), [FIXTURES / "reasons" / "kfree_skb_format_6.1.txt"])


class FakeGroups:
    """The kernel's drop_groups map and drop_stats, as the collector reads them."""

    def __init__(self) -> None:
        self.counts: dict[tuple[int, int, int], list[int]] = {}
        self.ungrouped = 0
        self.forgotten: list[tuple[int, int, int]] = []

    def drop(self, reason: int, location: int, netns: int, count: int = 1, size: int = 100) -> None:
        entry = self.counts.setdefault((reason, location, netns), [0, 0])
        entry[0] += count
        entry[1] += count * size

    def groups(self) -> Iterator[RawDropGroup]:
        for (reason, location, netns), (count, size) in list(self.counts.items()):
            example = decode_event(DropEvent())
            yield RawDropGroup(reason, location, netns, count, size, example)

    def totals(self) -> DropTotals:
        total = sum(count for count, _ in self.counts.values()) + self.ungrouped
        return DropTotals(seen=total, matched=total, ungrouped=self.ungrouped)

    def forget_group(self, reason: int, location: int, netns: int) -> tuple[int, int] | None:
        entry = self.counts.pop((reason, location, netns), None)
        self.forgotten.append((reason, location, netns))
        return (entry[0], entry[1]) if entry else None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Machine:
    """A /proc with processes in fake namespaces (regular files: their inodes stand in for netns inodes)."""

    def __init__(self, root: Path) -> None:
        self.proc = root / "proc"
        self.netns_dir = root / "netns"
        self.netns_dir.mkdir(parents=True)
        (self.proc / "self" / "ns").mkdir(parents=True)
        (self.proc / "self" / "ns" / "net").write_text("")
        self.host = self.process(1)

    def process(self, pid: int) -> int:
        ns = self.proc / str(pid) / "ns"
        ns.mkdir(parents=True)
        (ns / "net").write_text("")
        return os.stat(ns / "net").st_ino

    def kill(self, pid: int) -> None:
        (self.proc / str(pid) / "ns" / "net").unlink()

    def name(self, name: str, pid: int) -> None:
        os.link(self.proc / str(pid) / "ns" / "net", self.netns_dir / name)

    def names(self) -> NetnsNames:
        return NetnsNames(str(self.proc), [str(self.netns_dir)], refresh_interval=0)


def collector(
    tmp_path: Path,
    source: FakeGroups,
    machine: Machine,
    config: DropsExporterConfig,
    clock: Clock | None = None,
) -> tuple[CollectorRegistry, FunctionNames]:
    kallsyms_file = tmp_path / "kallsyms"
    kallsyms_file.write_text(KALLSYMS)
    names = FunctionNames(lambda batch: _names_from(Kallsyms(str(kallsyms_file)), batch))
    registry = CollectorRegistry()
    registry.register(
        DropsCollector(
            source,
            reasons(),
            names,
            config,
            netns_names=machine.names(),
            proc_root=str(machine.proc),
            clock=clock or Clock(),
            container_lookup=lambda pid, _root: "0123456789ab" if pid == 20 else None,
            pods=PodIndex(environ={}, candidates=()),  # no container runtime (tests/privileged/test_pods.py)
        )
    )
    return registry, names


def value(registry: CollectorRegistry, metric: str, **labels: str) -> float:
    found = registry.get_sample_value(metric, labels)
    assert found is not None, f"no sample {metric}{labels}"
    return found


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == name
    }


def test_counts_by_reason_netns_and_location_are_exact(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    web = machine.process(20)
    machine.name("web", 20)
    source = FakeGroups()
    netfilter, no_socket = reasons().value("NETFILTER_DROP"), reasons().value("NO_SOCKET")
    assert netfilter is not None and no_socket is not None
    source.drop(netfilter, NF_HOOK, web, count=1000, size=60)
    source.drop(no_socket, UDP_RCV, web, count=7)
    source.drop(no_socket, TCP_RCV, machine.host, count=3)
    source.drop(no_socket, TCP_RCV, 0, count=2)
    source.ungrouped = 5
    registry, _ = collector(tmp_path, source, machine, DropsExporterConfig())
    assert value(registry, "netsleuth_drops_total", reason="NETFILTER_DROP", netns=str(web)) == 1000
    assert value(registry, "netsleuth_dropped_bytes_total", reason="NETFILTER_DROP", netns=str(web)) == 60000
    assert value(registry, "netsleuth_drops_total", reason="NO_SOCKET", netns=str(web)) == 7
    assert value(registry, "netsleuth_drops_total", reason="NO_SOCKET", netns="unknown") == 2
    assert (
        value(registry, "netsleuth_drops_by_location_total", reason="NO_SOCKET", location="tcp_v4_rcv") == 5
    )
    assert (
        value(registry, "netsleuth_drops_by_location_total", reason="NETFILTER_DROP", location="nf_hook_slow")
        == 1000
    )
    assert value(registry, "netsleuth_drops_unattributed_total") == 5
    assert value(registry, "netsleuth_drop_groups") == 4
    no_pod = {"k8s_namespace": "", "pod": ""}
    assert value(
        registry, "netsleuth_netns_info", netns=str(web), name="web", container="0123456789ab", **no_pod
    )
    assert value(
        registry, "netsleuth_netns_info", netns=str(machine.host), name="host", container="", **no_pod
    )
    total = sum(samples(registry, "netsleuth_drops_total").values())
    assert total + value(registry, "netsleuth_drops_unattributed_total") == source.totals().matched


def test_namespaces_past_the_limit_are_summed_as_other(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    source = FakeGroups()
    no_socket = reasons().value("NO_SOCKET")
    assert no_socket is not None
    inodes = [machine.process(pid) for pid in range(100, 105)]
    for rank, inode in enumerate(inodes):
        source.drop(no_socket, UDP_RCV, inode, count=10 * (rank + 1))
    registry, _ = collector(tmp_path, source, machine, DropsExporterConfig(netns_series=2, location_series=1))
    series = samples(registry, "netsleuth_drops_total")
    assert {dict(labels)["netns"] for labels in series} == {str(inodes[4]), str(inodes[3]), "other"}
    assert value(registry, "netsleuth_drops_total", reason="NO_SOCKET", netns="other") == 10 + 20 + 30
    assert sum(series.values()) == 150
    assert value(registry, "netsleuth_drop_series_folded", series="netns") == 3
    # A new, bigger namespace finds no slot; `other` only grows.
    newcomer = machine.process(200)
    source.drop(no_socket, UDP_RCV, newcomer, count=1000)
    source.drop(reasons().value("NETFILTER_DROP") or 0, NF_HOOK, newcomer, count=1)
    assert value(registry, "netsleuth_drops_total", reason="NO_SOCKET", netns="other") == 1060
    locations = samples(registry, "netsleuth_drops_by_location_total")
    assert locations == {
        (("location", "__udp4_lib_rcv"), ("reason", "NO_SOCKET")): 1150,
        (("location", "other"), ("reason", "NETFILTER_DROP")): 1,
    }


def test_a_vanished_namespace_is_retired_into_other_without_changing_sums(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    source = FakeGroups()
    no_socket = reasons().value("NO_SOCKET")
    assert no_socket is not None
    doomed = machine.process(30)
    source.drop(no_socket, UDP_RCV, doomed, count=40)
    source.drop(no_socket, UDP_RCV, machine.host, count=2)
    clock = Clock()
    registry, names = collector(tmp_path, source, machine, DropsExporterConfig(retire_netns_after=60), clock)
    assert value(registry, "netsleuth_drops_total", reason="NO_SOCKET", netns=str(doomed)) == 40
    machine.kill(30)
    clock.now += 30  # first seen missing now
    assert value(registry, "netsleuth_drops_total", reason="NO_SOCKET", netns=str(doomed)) == 40
    clock.now += 59
    assert value(registry, "netsleuth_drops_total", reason="NO_SOCKET", netns=str(doomed)) == 40
    assert source.forgotten == []
    clock.now += 1
    series = samples(registry, "netsleuth_drops_total")
    assert series == {
        (("netns", str(machine.host)), ("reason", "NO_SOCKET")): 2,
        (("netns", "other"), ("reason", "NO_SOCKET")): 40,
    }
    assert source.forgotten == [(no_socket, UDP_RCV, doomed)]  # its kernel group was freed
    assert (
        value(registry, "netsleuth_drops_by_location_total", reason="NO_SOCKET", location="__udp4_lib_rcv")
        == 42
    )
    assert names.batches == 1  # names were resolved once, in one batch, and then cached


def test_no_drops_exports_empty_counters(tmp_path: Path) -> None:
    registry, names = collector(tmp_path, FakeGroups(), Machine(tmp_path), DropsExporterConfig())
    text = generate_latest(registry).decode()
    assert "# TYPE netsleuth_drops_total counter" in text
    assert "netsleuth_drops_unattributed_total 0.0" in text
    assert names.batches == 0


def test_names_are_resolved_in_a_child_process() -> None:
    """The real resolver: a child reads /proc/kallsyms (unprivileged, every address reads 0: hex names)."""
    probe = Kallsyms()
    try:
        address = probe.address_of("kfree_skb_reason") or probe.address_of("sk_skb_reason_drop")
    except EnvironmentProblem:
        address = None
    if address is None:  # kallsyms hidden from this user: the child must fail soft, to hex names
        assert resolve_in_child({0xFFFFFFFF81000123}) == {0xFFFFFFFF81000123: "0xffffffff81000123"}
        return
    assert set(resolve_in_child({address + 4}).values()) <= {"kfree_skb_reason", "sk_skb_reason_drop"}
