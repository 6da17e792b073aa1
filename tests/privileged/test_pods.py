"""Pods named from the container runtime: real pod sandboxes and containers made through CRI on a containerd
of the test's own (tests/cri_lab.py), looked up by network namespace inode and by container as records
carry them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from netsleuth.kernel.cgroups import CgroupPaths, cgroup2_mount
from netsleuth.kernel.cri import CriClient
from netsleuth.kernel.pods import PodIndex
from netsleuth.kernel.process import cgroup_identity, container_of
from tests.cri_lab import CriLab
from tests.netlab import wait_for


def test_runtime_answers_on_its_own_socket(cri: CriLab) -> None:
    with CriClient(cri.endpoint) as client:
        version = client.version()
    assert version.runtime_name == "containerd"
    assert version.runtime_version.startswith("1.6"), version
    assert version.runtime_api_version == "v1"


def test_pods_by_netns_with_namespace_name_uid_labels_and_containers(cri: CriLab) -> None:
    web = cri.run_pod("team-a", "web-1", labels={"app": "web", "tier": "front"})
    db = cri.run_pod("team-b", "db-0", labels={"app": "db"})
    try:
        cri.run_container(web, "sidecar", ["/pause"])
        cri.run_container(web, "app", ["/pause"])
        index = PodIndex(cri.endpoint)
        found = index.pod_of_netns(web.inode)
        assert found is not None
        assert (found.namespace, found.name, found.uid, found.sandbox_id) == (
            "team-a",
            "web-1",
            web.uid,
            web.sandbox_id,
        )
        assert found.labels["app"] == "web" and found.labels["tier"] == "front"
        assert found.containers == ("app", "sidecar")
        assert found.ip == web.ip and found.ip.startswith(cri.subnet_prefix)
        other = index.pod_of_netns(db.inode)
        assert other is not None and other.ref == "team-b/db-0" and other.containers == ()
        assert index.pod_of_netns(os.stat("/proc/self/ns/net").st_ino) is None  # the host's is no pod's
        assert index.find("team-b", "db-0") == other
        assert [pod.ref for pod in index.in_namespace("team-a")] == ["team-a/web-1"]
        assert index.find("team-b", "web-1") is None
        assert index.problem is None
    finally:
        cri.remove_pod(web.sandbox_id)
        cri.remove_pod(db.sandbox_id)


def test_container_by_the_id_and_cgroup_its_process_shows(cri: CriLab) -> None:
    pod = cri.run_pod("team-a", "api-7", labels={"app": "api"})
    try:
        container_id = cri.run_container(pod, "server", ["/pause"])
        pid = cri.container_pid(container_id)
        identity = cgroup_identity(pid)
        assert identity is not None and identity.container_id == container_id and identity.pod_uid == pod.uid
        index = PodIndex(cri.endpoint)
        short = container_of(pid)  # what a record's owner carries
        assert short == container_id[:12]
        found = index.container(short)
        assert found is not None and found.name == "server" and found.pod.ref == "team-a/api-7"
        # By the cgroup id bpf_get_current_cgroup_id() gives: the v2 directory's inode.
        mount = cgroup2_mount()
        assert mount is not None, "this host has no cgroup v2 hierarchy"
        cgroup_id = os.stat(mount + identity.path).st_ino
        assert CgroupPaths(mount).container_of(cgroup_id) == short
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == pod.inode  # the container is in the pod's namespace
    finally:
        cri.remove_pod(pod.sandbox_id)


def test_refreshed_on_a_miss_and_when_old(cri: CriLab) -> None:
    """No event stream in containerd 1.6: a pod made after the last refresh is found on the first miss, and a
    removed one disappears once what was known is older than max_age_s."""
    index = PodIndex(cri.endpoint, min_refresh_s=0.0, max_age_s=0.5)
    assert index.pods() == [] or all(pod.namespace != "team-c" for pod in index.pods())
    refreshes = index.refreshes
    pod = cri.run_pod("team-c", "late-1")
    inode = pod.inode
    try:
        found = index.pod_of_netns(inode)
        assert found is not None and found.ref == "team-c/late-1"
        assert index.refreshes == refreshes + 1
        index.pod_of_netns(inode)  # known and young: no call
        assert index.refreshes == refreshes + 1
    finally:
        cri.remove_pod(pod.sandbox_id)
    wait_for(lambda: index.pod_of_netns(inode) is None, timeout=5, what="the removed pod to be forgotten")
    assert index.find("team-c", "late-1") is None


def test_a_host_without_a_runtime_never_loads_grpc() -> None:
    """No socket: every lookup answers None at once and grpc is not even imported."""
    code = (
        "import sys\n"
        "from netsleuth.kernel.pods import PodIndex\n"
        "index = PodIndex(environ={}, candidates=('unix:///nonexistent/containerd.sock',))\n"
        "assert index.pod_of_netns(4026531840) is None and index.container('0123456789ab') is None\n"
        "assert index.pods() == [] and not index.available and index.refreshes == 0\n"
        "assert 'grpc' not in sys.modules, 'grpc was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_runtime_that_stops_answering_is_one_problem_not_an_error(cri: CriLab, tmp_path: Path) -> None:
    index = PodIndex(f"unix://{tmp_path}/gone.sock")
    assert index.pod_of_netns(12345) is None
    assert index.problem is not None and "no container runtime socket" in index.problem


def test_the_registry_entry_lists_the_pods_a_host_holds(cri: CriLab) -> None:
    """What an agent writes to the fleet's host registry: every pod with a namespace of its own, or with a
    netns scope only the pods in that namespace; the entry survives its JSON round trip."""
    from netsleuth.fleet.host_registry import host_entry
    from netsleuth.fleet.protocol import HostEntry
    from netsleuth.kernel.netns import NetnsNames

    web = cri.run_pod("team-a", "web-1", labels={"app": "web"})
    db = cri.run_pod("team-b", "db-0")
    try:
        index = PodIndex(cri.endpoint)
        names = NetnsNames()

        def entry(scope: str) -> HostEntry:
            made = host_entry("h1", {}, {}, scope, names, None, (), "", 0, pods=index)
            return HostEntry.from_json(json.loads(made.encode()))

        everything = entry("")
        listed = {(pod["namespace"], pod["name"]): pod for pod in everything.pods}
        assert listed[("team-a", "web-1")] == {
            "namespace": "team-a",
            "name": "web-1",
            "uid": web.uid,
            "netns": web.inode,
            "labels": {
                "app": "web",
                "io.kubernetes.pod.namespace": "team-a",
                "io.kubernetes.pod.name": "web-1",
            },
        }
        assert ("team-b", "db-0") in listed
        scoped = entry(os.path.basename(db.netns_path))  # an agent scoped to db-0's `ip netns` name
        assert [(pod["namespace"], pod["name"]) for pod in scoped.pods] == [("team-b", "db-0")]
        without = host_entry(
            "h1", {}, {}, "", names, None, (), "", 0, pods=PodIndex(environ={}, candidates=())
        )
        assert without.pods == []
    finally:
        cri.remove_pod(web.sandbox_id)
        cri.remove_pod(db.sandbox_id)
