"""Pods named in records, verdicts and metrics: real pod sandboxes and containers made through CRI on a
containerd of the test's own (tests/cri_lab.py), real traffic between them, netsleuth run as a user runs it
(the runtime found through CONTAINER_RUNTIME_ENDPOINT, as crictl finds it).

Two pods on the lab's CNI bridge: team-a/web-1 (a container "sender" whose process sends UDP to db-0 port
9999, which web-1's own firewall drops) and team-b/db-0 (nothing listens). From web-1's namespace a
sidecar-like process also sends UDP to db-0 port 9 (refused there: NO_SOCKET in db-0's namespace).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cri_lab import CriLab, LabPod
from tests.netlab import wait_for
from tests.privileged.test_agent_harness import AgentProcess
from tests.tracerun import TraceRun, netsleuth_argv

REPO = Path(__file__).resolve().parents[2]
_FIREWALLED_PORT = 9999
_CLOSED_PORT = 9


@dataclass
class Pods:
    cri: CriLab
    web: LabPod
    db: LabPod
    sender_id: str

    @property
    def subnet(self) -> str:
        return f"{self.cri.subnet_prefix}.0/24"

    def ref(self, pod: LabPod) -> dict[str, str]:
        return {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}


@pytest.fixture(scope="module")
def pods(cri: CriLab) -> Iterator[Pods]:
    web = cri.run_pod("team-a", "web-1", labels={"app": "web"})
    db = cri.run_pod("team-b", "db-0", labels={"app": "db"})
    web.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", str(_FIREWALLED_PORT), "-j", "DROP")
    sender = cri.run_container(web, "sender", ["/pause", db.ip, str(_FIREWALLED_PORT)])
    try:
        yield Pods(cri, web, db, sender)
    finally:
        cri.remove_pod(web.sandbox_id)
        cri.remove_pod(db.sandbox_id)


def send_udp(pod: LabPod, address: str, port: int, count: int = 5) -> None:
    """`count` datagrams from a process in the pod's network namespace."""
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"for _ in range({count}): s.sendto(b'x' * 16, ({address!r}, {port}))\n"
    )
    pod.run(sys.executable, "-c", code)


def connect_refused(pod: LabPod, address: str, port: int) -> None:
    code = (
        "import socket\n"
        f"try: socket.create_connection(({address!r}, {port}), timeout=3)\n"
        "except ConnectionRefusedError: pass\n"
        "else: raise SystemExit('connected?')\n"
    )
    pod.run(sys.executable, "-c", code)


def test_drops_name_the_pod_and_the_container(pods: Pods) -> None:
    run = TraceRun("drops", "--dst", pods.subnet)
    try:
        run.wait_ready()
        send_udp(pods.web, pods.db.ip, _CLOSED_PORT)
        run.wait_records(lambda r: r.get("reason") == "NO_SOCKET" and r.get("dport") == _CLOSED_PORT)
        run.wait_records(lambda r: r.get("reason") == "NETFILTER_DROP" and r.get("dport") == _FIREWALLED_PORT)
    finally:
        run.stop()
    drops = run.drops()
    firewalled = [drop for drop in drops if drop["dport"] == _FIREWALLED_PORT]
    refused = [drop for drop in drops if drop["dport"] == _CLOSED_PORT and drop["reason"] == "NO_SOCKET"]
    assert firewalled and refused
    for drop in firewalled:  # dropped by web-1's OUTPUT chain, in the sender container's own sendto()
        assert drop["netns"] == pods.web.inode
        assert drop["pod"] == pods.ref(pods.web)
        assert drop["owner"] == "task" and drop["comm"] == "pause"
        assert drop["container"] == pods.sender_id[:12] and drop["container_name"] == "sender"
    for drop in refused:  # nothing listens in db-0
        assert drop["netns"] == pods.db.inode and drop["pod"] == pods.ref(pods.db)
    summary = run.records()[-1]
    grouped = {(group["reason"], group["netns"]): group for group in summary["groups"]}
    assert grouped[("NO_SOCKET", pods.db.inode)]["pod"] == pods.ref(pods.db)
    # The text view names the pod where it names the namespace.
    text = TraceRun("drops", "--pod", pods.web.ref, json_output=False)
    try:
        text.wait_ready()
        wait_for(lambda: "NETFILTER_DROP" in text.stdout(), 10, "a drop line")
    finally:
        text.stop()
    assert "pod team-a/web-1" in text.stdout() and "container sender" in text.stdout()


def test_pod_and_k8s_namespace_filters_are_kernel_netns_filters(pods: Pods) -> None:
    other = pods.cri.run_pod("team-b", "db-1")  # a second pod: --k8s-namespace team-b is a set of two
    try:
        by_pod = TraceRun("drops", "--pod", "team-a/web-1", "--dst", pods.subnet)
        by_namespace = TraceRun("drops", "--k8s-namespace", "team-b", "--dst", pods.subnet)
        try:
            by_pod.wait_ready()
            by_namespace.wait_ready()
            send_udp(pods.web, pods.db.ip, _CLOSED_PORT)
            send_udp(pods.web, other.ip, _CLOSED_PORT)
            by_namespace.wait_records(lambda r: r.get("netns") == other.inode)
            by_namespace.wait_records(lambda r: r.get("netns") == pods.db.inode)
            by_pod.wait_records(lambda r: r.get("reason") == "NETFILTER_DROP")
        finally:
            by_pod.stop()
            by_namespace.stop()
    finally:
        pods.cri.remove_pod(other.sandbox_id)
    assert {drop["netns"] for drop in by_pod.drops()} == {pods.web.inode}
    assert {drop["netns"] for drop in by_namespace.drops()} == {pods.db.inode, other.inode}
    # In the kernel: the summaries' exact totals count only what the filters kept.
    assert by_pod.records()[-1]["total"] == len(by_pod.drops())
    assert by_namespace.records()[-1]["total"] == len(by_namespace.drops())


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--pod", "team-a/nope"], "no pod team-a/nope runs on this host"),
        (["--pod", "web-1"], "is not a pod as NAMESPACE/NAME"),
        (["--k8s-namespace", "team-z"], "no pod of Kubernetes namespace team-z runs on this host"),
        (["--pod", "team-a/web-1", "--netns", "1"], "--pod and --netns each choose the network namespace"),
    ],
)
def test_a_pod_that_is_not_here_is_one_sentence_and_exit_2(pods: Pods, args: list[str], words: str) -> None:
    result = subprocess.run(netsleuth_argv("drops", *args), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert words in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_resets_name_the_pods_on_both_ends(pods: Pods) -> None:
    run = TraceRun("resets", "--host", pods.db.ip)
    try:
        run.wait_ready()
        connect_refused(pods.web, pods.db.ip, 8080)
        run.wait_records(lambda r: r.get("type") == "reset" and r.get("direction") == "sent")
    finally:
        run.stop()
    sent = [r for r in run.records() if r.get("type") == "reset" and r["direction"] == "sent"]
    assert sent and all(r["pod"] == pods.ref(pods.db) and r["netns"] == pods.db.inode for r in sent)
    received = [r for r in run.records() if r.get("type") == "reset" and r["direction"] == "received"]
    assert all(r["pod"] == pods.ref(pods.web) for r in received)


def test_dns_names_the_pod_that_asked(pods: Pods) -> None:
    with tempfile.TemporaryDirectory(prefix="netsleuth-pod-dns-") as scratch:
        ready = Path(scratch) / "ready"
        argv = [sys.executable, "-m", "tests.dns_server", "--address", pods.db.ip, "--ready-file", str(ready)]
        server = pods.db.popen(argv, cwd=str(REPO))
        try:
            wait_for(ready.exists, 20, "the DNS server in db-0 to listen")
            run = TraceRun("dns", "--pod", pods.web.ref)
            try:
                run.wait_ready()
                answer = pods.web.run("dig", "+time=2", "+tries=1", f"@{pods.db.ip}", "www.ok.test", "A")
                assert "198.18.0.2" in answer.stdout
                run.wait_records(lambda r: r.get("type") == "dns")
            finally:
                run.stop()
        finally:
            server.kill()
            server.wait()
    [answer_record] = [r for r in run.records() if r.get("type") == "dns"]
    assert answer_record["pod"] == pods.ref(pods.web) and answer_record["netns"] == pods.web.inode
    assert answer_record["comm"] == "dig" and answer_record["server"] == pods.db.ip


def test_diagnose_verdict_names_the_pod(pods: Pods) -> None:
    prober = pods.cri.run_container(pods.web, "prober", ["/pause", pods.db.ip, str(_CLOSED_PORT)])
    try:
        result = subprocess.run(
            netsleuth_argv("diagnose", "--pod", pods.db.ref, "--duration", "3", "--json"),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        pods.cri.remove_container(prober)
        pods.web.containers.pop("prober", None)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    verdicts = [record for record in records if record["type"] == "verdict"]
    refused = [verdict for verdict in verdicts if verdict["evidence"].get("netns") == pods.db.inode]
    assert refused, verdicts
    assert "pod team-b/db-0" in refused[0]["cause"], refused[0]["cause"]
    assert refused[0]["evidence"]["pod"] == "team-b/db-0"
    [summary] = [record for record in records if record["type"] == "summary"]
    assert summary["watched"].startswith("pod team-b/db-0, netns cni-"), summary["watched"]


def _metrics(agent: AgentProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    found: list[tuple[dict[str, str], float]] = []
    for family in text_string_to_metric_families(text):
        found += [(dict(s.labels), s.value) for s in family.samples if s.name == name]
    return found


def test_agent_metrics_name_the_pod_of_a_namespace(pods: Pods) -> None:
    with AgentProcess() as agent:
        agent.wait_ready()
        send_udp(pods.web, pods.db.ip, _CLOSED_PORT, count=20)

        def counted() -> bool:
            drops = _samples(_metrics(agent), "netsleuth_drops_total")
            return any(labels.get("netns") == str(pods.db.inode) and value > 0 for labels, value in drops)

        wait_for(counted, 20, "db-0's drops in the agent's metrics")
        info = _samples(_metrics(agent), "netsleuth_netns_info")
    by_netns: dict[str, dict[str, Any]] = {labels["netns"]: labels for labels, _ in info}
    assert by_netns[str(pods.db.inode)]["k8s_namespace"] == "team-b"
    assert by_netns[str(pods.db.inode)]["pod"] == "db-0"
    assert by_netns[str(pods.web.inode)]["pod"] == "web-1"  # the sender container's drops: web-1 is there too
    ours = {str(pods.web.inode), str(pods.db.inode)}
    assert all(labels["pod"] == "" for netns, labels in by_netns.items() if netns not in ours)


def test_tcp_views_name_the_pod(pods: Pods) -> None:
    run = TraceRun("tcp", "connlat", "--pod", pods.web.ref)
    try:
        run.wait_ready()
        connect_refused(pods.web, pods.db.ip, 8080)
        run.wait_records(lambda r: r.get("type") == "connect")
    finally:
        run.stop()
    connects = [r for r in run.records() if r.get("type") == "connect"]
    assert connects and all(r["pod"] == pods.ref(pods.web) and r["netns"] == pods.web.inode for r in connects)
    assert not connects[0]["ok"] and connects[0]["dport"] == 8080
