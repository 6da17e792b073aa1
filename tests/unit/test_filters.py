"""Filter parsing: every bad value is one sentence and a UsageError (exit 2)."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path

import pytest

from netsleuth.diagnostics.filters import (
    PacketFilter,
    check_process,
    missing_device_note,
    on_this_host,
    read_for_another_host,
)
from netsleuth.errors import UsageError
from netsleuth.kernel.netns import NetnsNames
from netsleuth.spec.common import PacketConfig
from netsleuth.spec.flags import add_config_flags, config_from_args


def packet_filter_from_argv(*argv: str) -> PacketFilter:
    """The filter a packet diagnostic's flags give, read as the CLI reads them (its typed config)."""
    parser = argparse.ArgumentParser()
    add_config_flags(parser, PacketConfig)
    return config_from_args(PacketConfig, parser.parse_args(argv)).packet_filter()


def test_all_filters_parse() -> None:
    # Read as the controller reads a fleet request: the formats, not whether pid 42 exists here.
    with read_for_another_host():
        packet_filter = packet_filter_from_argv(
            "--proto",
            "udp",
            "--host",
            "2001:db8::/32",
            "--src",
            "2001:db8::1",
            "--dst",
            "2001:db8::2",
            "--port",
            "53",
            "--sport",
            "1024",
            "--dport",
            "80",
            "--pid",
            "42",
            "--comm",
            "nginx",
            "--dev",
            "eth0",
            "-6",
        )
    assert packet_filter.proto == 17
    assert packet_filter.hosts == (ipaddress.ip_network("2001:db8::/32"),)
    assert packet_filter.sources == (ipaddress.ip_network("2001:db8::1/128"),)
    assert packet_filter.destinations == (ipaddress.ip_network("2001:db8::2/128"),)
    assert (packet_filter.port, packet_filter.sport, packet_filter.dport) == (53, 1024, 80)
    assert (packet_filter.pid, packet_filter.comm, packet_filter.dev, packet_filter.family) == (
        42,
        "nginx",
        "eth0",
        6,
    )
    assert packet_filter.filters_owner


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--host", "198.18.0.0/33"], "not an IP address or CIDR"),
        (["--src", "nonsense"], "not an IP address or CIDR"),
        (["--port", "70000"], "not a port"),
        (["--dport", "0"], "not a port"),
        (["--sport", "http"], "not a port"),
        (["--proto", "quic"], r"--proto must be one of .*tcp.* or a whole number from 0 to 255 \(got 'quic'"),
        (["--pid=-3"], "not a process id"),
        (["--pid", "abc"], "not a process id"),
        (["--comm", "a-very-long-process-name"], "1 to 15 characters"),
        (["--netns", "no-such-namespace-xyz"], "unknown network namespace"),
        (["-6", "--dst", "198.18.0.0/15"], "-6 contradicts the IPv4 address 198.18.0.0/15"),
        (["-4", "--host", "2001:db8::1"], "-4 contradicts the IPv6 address 2001:db8::1/128"),
    ],
)
def test_bad_filters_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        packet_filter_from_argv(*argv)


def fake_proc(tmp_path: Path, processes: dict[int, int], devices: dict[int, list[str]]) -> Path:
    """/proc with `processes` (pid -> tgid) whose /proc/PID/net/dev lists `devices[pid]`."""
    proc = tmp_path / "proc"
    for pid, tgid in processes.items():
        (proc / str(pid) / "net").mkdir(parents=True)
        (proc / str(pid) / "status").write_text(f"Name:\tworker\nTgid:\t{tgid}\nPid:\t{pid}\n")
        lines = ["Inter-|   Receive", " face |bytes"] + [f"{name}: 0 0 0 0" for name in devices.get(pid, [])]
        (proc / str(pid) / "net" / "dev").write_text("\n".join(lines) + "\n")
    return proc


def test_a_pid_must_be_a_process_of_this_host(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {300: 300, 301: 300}, {})
    check_process(300, str(proc))
    with pytest.raises(UsageError) as caught:
        check_process(999999, str(proc))
    assert str(caught.value) == "--pid 999999: no process has this id on this host"
    # The kernel filters on the process (thread group) id: a thread's id would match nothing.
    with pytest.raises(UsageError) as caught:
        check_process(301, str(proc))
    assert str(caught.value) == "--pid 301 is a thread of process 300: give the process id, 300"
    with read_for_another_host():
        check_process(999999, str(proc))  # the controller checks formats; the agent checks existence


class OneNamespacePerProcess(NetnsNames):
    """Each fake process in a namespace of its own, inode = pid."""

    def __init__(self, proc: Path) -> None:
        super().__init__(proc_root=str(proc), netns_dirs=[])
        self.pids = sorted(int(entry.name) for entry in proc.iterdir())

    def inodes(self) -> list[int]:
        return self.pids

    def pids_of(self, inode: int) -> list[int]:
        return [inode]

    def name_of(self, inode: int) -> str | None:
        return f"ns{inode}"


def test_an_interface_no_namespace_has_is_a_note(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {300: 300, 400: 400}, {300: ["lo", "eth0"], 400: ["lo", "veth1"]})
    names = OneNamespacePerProcess(proc)
    assert missing_device_note("veth1", None, names) is None  # in some namespace
    assert missing_device_note("veth1", 400, names) is None
    assert missing_device_note("veth1", 300, names) == (
        "no interface is named 'veth1' in network namespace ns300 now: its events will show if one appears"
    )
    assert missing_device_note("nosuchdev0", None, names) == (
        "no interface is named 'nosuchdev0' in any network namespace of this host now: its events will show "
        "if one appears"
    )


def test_the_note_travels_with_the_filter(tmp_path: Path) -> None:
    names = OneNamespacePerProcess(fake_proc(tmp_path, {300: 300}, {300: ["lo"]}))
    assert on_this_host(PacketFilter(dev="lo"), names).notes == ()
    (note,) = on_this_host(PacketFilter(dev="nosuchdev0"), names).notes
    assert "'nosuchdev0'" in note
    with read_for_another_host():
        assert on_this_host(PacketFilter(dev="nosuchdev0"), names).notes == ()
