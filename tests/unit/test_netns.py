"""Network namespace names and paths, without root: the test's own namespace (/proc/self/ns/net) stands in
for an `ip netns` bind mount via a symlink, which os.stat follows to the same nsfs inode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from netsleuth.errors import UsageError
from netsleuth.kernel.netns import NetnsNames, current_netns_inode, netns_inode, resolve_netns_arg

SELF_NET = "/proc/self/ns/net"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingNetnsNames(NetnsNames):
    scans = 0

    def refresh(self) -> None:
        self.scans += 1
        super().refresh()


@pytest.fixture
def netns_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "netns"
    directory.mkdir()
    (directory / "blue").symlink_to(SELF_NET)
    # What `ip netns delete` can leave behind when another process still has it open: a plain file.
    (directory / "stale").write_text("")
    return directory


def test_inode_of_namespace_files() -> None:
    inode = os.stat(SELF_NET).st_ino
    assert netns_inode(SELF_NET) == inode
    assert current_netns_inode() == inode
    with pytest.raises(UsageError, match="cannot open network namespace"):
        netns_inode("/nonexistent/ns/net")


def test_names_paths_and_pids(netns_dir: Path) -> None:
    names = NetnsNames(netns_dirs=[str(netns_dir)])
    current = current_netns_inode()
    assert names.name_of(current) == "blue"
    assert names.path_of(current) == str(netns_dir / "blue")
    assert names.inode_of_name("blue") == current
    assert names.inode_of_name("stale") is None
    assert names.names() == {"blue": current}
    assert os.getpid() in names.pids_of(current)
    assert names.name_of(1) is None and names.pids_of(1) == [] and names.path_of(1) is None


def test_unnamed_namespace_is_entered_through_a_process(tmp_path: Path) -> None:
    names = NetnsNames(netns_dirs=[str(tmp_path / "absent")])
    current = current_netns_inode()
    assert names.name_of(current) is None
    path = names.path_of(current)
    assert path is not None and path.startswith("/proc/") and path.endswith("/ns/net")
    assert os.stat(path).st_ino == current


def test_same_directory_twice_lists_each_name_once(netns_dir: Path, tmp_path: Path) -> None:
    alias = tmp_path / "var-run-netns"
    alias.symlink_to(netns_dir)
    names = NetnsNames(netns_dirs=[str(netns_dir), str(alias)])
    assert list(names.names()) == ["blue"]


def test_misses_rescan_at_most_once_per_interval(netns_dir: Path) -> None:
    clock = FakeClock()
    names = CountingNetnsNames(netns_dirs=[str(netns_dir)], clock=clock)
    assert names.name_of(current_netns_inode()) == "blue"
    assert names.scans == 1
    for _ in range(100):
        assert names.name_of(12345) is None  # an unknown namespace, at event rate
    assert names.scans == 1
    (netns_dir / "green").symlink_to(SELF_NET)
    assert names.inode_of_name("green") is None  # not yet: the last scan is too recent
    clock.now += 1.0
    assert names.inode_of_name("green") == current_netns_inode()
    assert names.scans == 2


def test_resolve_netns_arg_forms(netns_dir: Path) -> None:
    names = NetnsNames(netns_dirs=[str(netns_dir)])
    current = current_netns_inode()
    assert resolve_netns_arg(str(current), names) == current
    assert resolve_netns_arg(f" net:[{current}] ", names) == current
    assert resolve_netns_arg(SELF_NET, names) == current
    assert resolve_netns_arg(f"/proc/{os.getpid()}/ns/net", names) == current
    assert resolve_netns_arg("blue", names) == current


def test_an_inode_no_namespace_has_is_refused(netns_dir: Path) -> None:
    names = NetnsNames(netns_dirs=[str(netns_dir)])
    unused = max(names.inodes()) + 1_000_003  # above every namespace this host holds
    with pytest.raises(UsageError) as caught:
        resolve_netns_arg(str(unused), names)
    assert str(caught.value) == (
        f"no network namespace has inode {unused} on this host (no `ip netns` name, process or open file "
        "holds one)"
    )


def test_a_namespace_held_only_by_an_open_file_is_found(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "77" / "fd").mkdir(parents=True)
    (proc / "77" / "fd" / "5").symlink_to("net:[4026599999]")
    names = NetnsNames(proc_root=str(proc), netns_dirs=[])
    assert resolve_netns_arg("4026599999", names) == 4026599999


@pytest.mark.parametrize(
    "text", ["nope", "", "0", "stale", "/proc/self/ns/mnt", "/etc/hostname", "/absent/ns"]
)
def test_resolve_netns_arg_rejects_with_one_sentence(text: str, netns_dir: Path) -> None:
    names = NetnsNames(netns_dirs=[str(netns_dir)])
    with pytest.raises(UsageError) as caught:
        resolve_netns_arg(text, names)
    assert str(caught.value).startswith(
        f"unknown network namespace {text!r}: give an inode, an `ip netns` name or /proc/PID/ns/net"
    )
