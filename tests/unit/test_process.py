"""Socket owners from a real socket of this test process; container ids from cgroup files in the formats
docker, containerd, CRI-O, podman and kubelet write (tests/fixtures/kernel/cgroup)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from netsleuth.kernel.process import (
    CgroupIdentity,
    SocketOwner,
    SocketOwners,
    cgroup_identity,
    comm_of,
    container_of,
    parse_cgroup,
)

CGROUPS = Path(__file__).resolve().parent.parent / "fixtures" / "kernel" / "cgroup"


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def udp_socket() -> Iterator[tuple[socket.socket, int]]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock, os.fstat(sock.fileno()).st_ino


@pytest.mark.parametrize(
    ("fixture", "container_id", "runtime", "pod_uid"),
    [
        (
            "docker-systemd",
            "4f3c2e1d0b9a8877665544332211ffeeddccbbaa99887766554433221100aabb",
            "docker",
            None,
        ),
        (
            "docker-cgroupfs-v1",
            "9a8b7c6d5e4f30211203f4e5d6c7b8a99a8b7c6d5e4f30211203f4e5d6c7b8a9",
            "docker",
            None,
        ),
        (
            "k8s-containerd-systemd",
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "containerd",
            "1c2d3e4f-5a6b-7c8d-9e0f-112233445566",
        ),
        (
            "k8s-cgroupfs-v1",
            "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210",
            None,
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
        ),
        (
            "k8s-crio",
            "aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999",
            "cri-o",
            "7e6d5c4b-3a29-1807-f6e5-d4c3b2a19080",
        ),
        ("k8s-crio-conmon", None, None, "7e6d5c4b-3a29-1807-f6e5-d4c3b2a19080"),
        (
            "podman-rootless",
            "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e",
            "podman",
            None,
        ),
        ("host-session", None, None, None),
        ("host-init", None, None, None),
    ],
)
def test_parse_cgroup(
    fixture: str, container_id: str | None, runtime: str | None, pod_uid: str | None
) -> None:
    identity = parse_cgroup((CGROUPS / f"{fixture}.cgroup").read_text())
    assert (identity.container_id, identity.runtime, identity.pod_uid) == (container_id, runtime, pod_uid)
    assert identity.short_id == (container_id[:12] if container_id else None)


def test_parse_cgroup_of_nothing() -> None:
    assert parse_cgroup("") == CgroupIdentity(path="")


def test_container_of_reads_proc(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text((CGROUPS / "k8s-containerd-systemd.cgroup").read_text())
    assert container_of(4242, proc_root=str(tmp_path)) == "0123456789ab"
    identity = cgroup_identity(4242, proc_root=str(tmp_path))
    assert identity is not None and identity.pod_uid == "1c2d3e4f-5a6b-7c8d-9e0f-112233445566"
    assert container_of(4243, proc_root=str(tmp_path)) is None
    assert cgroup_identity(4243, proc_root=str(tmp_path)) is None


def test_comm_of() -> None:
    with open("/proc/self/comm") as comm:
        assert comm_of(os.getpid()) == comm.read().strip()
    assert comm_of(2**22 + 12345) is None  # above pid_max's ceiling: never a process


def test_owner_of_a_real_socket(udp_socket: tuple[socket.socket, int]) -> None:
    _, inode = udp_socket
    owners = SocketOwners()
    owner = owners.owner(inode)
    assert owner == SocketOwner(os.getpid(), comm_of(os.getpid()) or "")
    assert owners.owners(inode)[0] == owner


def test_unknown_inodes_rescan_at_most_every_interval(udp_socket: tuple[socket.socket, int]) -> None:
    _, inode = udp_socket
    clock = FakeClock()
    owners = SocketOwners(clock=clock)
    assert owners.owner(inode) is not None
    assert owners.scans == 1
    for unknown in range(1, 1000):
        assert owners.owner(unknown) is None  # drops at a high rate for sockets we cannot see
    assert owners.owner(inode) is not None
    assert owners.scans == 1
    clock.now += 0.5
    assert owners.owner(1) is None
    assert owners.scans == 2


def test_closed_sockets_keep_their_owner_for_a_while() -> None:
    clock = FakeClock()
    owners = SocketOwners(clock=clock, retain_closed=30.0)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    inode = os.fstat(sock.fileno()).st_ino
    assert owners.owner(inode) is not None
    sock.close()
    clock.now += 10
    owners.rescan()
    assert owners.owner(inode) is not None  # a drop reported just after close() is still attributed
    clock.now += 30
    owners.rescan()
    clock.now += 0.1  # too soon for owner() to rescan again
    assert owners.owner(inode) is None


def test_socket_inodes_of_and_pids_matching(udp_socket: tuple[socket.socket, int]) -> None:
    _, inode = udp_socket
    owners = SocketOwners()
    me = os.getpid()
    my_comm = comm_of(me)
    assert my_comm is not None
    assert inode in owners.socket_inodes_of({me})
    assert owners.socket_inodes_of({2**22 + 12345}) == set()
    assert owners.pids_matching(me, None) == {me}
    assert owners.pids_matching(me, my_comm) == {me}
    assert owners.pids_matching(me, my_comm + "-not") == set()
    assert me in owners.pids_matching(None, my_comm)
    assert owners.pids_matching(2**22 + 12345, None) == set()


def test_pids_matching_on_a_recorded_proc(tmp_path: Path) -> None:
    for pid, comm in ((100, "nginx"), (200, "a-very-long-pro"), (300, "nginx")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "comm").write_text(comm + "\n")
    (tmp_path / "self").mkdir()
    owners = SocketOwners(proc_root=str(tmp_path))
    assert owners.pids_matching(None, "nginx") == {100, 300}
    # The kernel keeps 15 characters of a name; a user typing the full one still matches.
    assert owners.pids_matching(None, "a-very-long-process-name") == {200}
    assert owners.pids_matching(None, None) == {100, 200, 300}
    assert owners.pids_matching(100, "nginx") == {100}
    assert owners.owner(1) is None  # no fd directories: nothing owned, no crash
