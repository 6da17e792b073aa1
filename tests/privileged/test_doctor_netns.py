"""doctor, offload and fix/rollback against the real kernel, inside test namespaces (tests/netlab.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netsleuth.doctor.apply import apply_fix, rollback
from netsleuth.doctor.offload import set_offload, show_offloads
from netsleuth.doctor.run import run_doctor
from netsleuth.doctor.snapshot import take_snapshot
from netsleuth.errors import UsageError
from tests.netlab import Host, Lab, lab, run


def _pair(the_lab: Lab) -> tuple[Host, Host]:
    a, b = the_lab.host("a"), the_lab.host("b")
    the_lab.link(a, b, ["198.18.0.1/24"], ["198.18.0.2/24"])
    return a, b


def _row(host: Host, device: str, feature: str) -> bool:
    (row,) = [row for row in show_offloads([device], host.name)[device] if row.name == feature]
    return row.active


def _mtu(host: Host, device: str) -> int:
    return int(json.loads(host.run("ip", "-j", "link", "show", device).stdout)[0]["mtu"])


def test_offload_show_set_round_trip_on_veth() -> None:
    with lab() as the_lab:
        a, _ = _pair(the_lab)
        rows = {row.name: row for row in show_offloads(["veth0"], a.name)["veth0"]}
        assert "rx-gro" in rows and rows["tx-tcp-segmentation"].description
        original = rows["rx-gro"].active
        (result,) = set_offload("veth0", "gro", not original, a.name)
        assert (result.feature, result.before, result.after) == ("rx-gro", original, not original)
        assert _row(a, "veth0", "rx-gro") is (not original)
        # The ethtool CLI agrees with what we read over ioctl/netlink.
        shown = a.run("ethtool", "-k", "veth0").stdout
        assert f"generic-receive-offload: {'on' if not original else 'off'}" in shown
        set_offload("veth0", "rx-gro", original, a.name)
        assert _row(a, "veth0", "rx-gro") is original


def test_offload_set_refuses_fixed_features_and_unknown_names() -> None:
    with lab() as the_lab:
        a, _ = _pair(the_lab)
        fixed = next(row.name for row in show_offloads(["veth0"], a.name)["veth0"] if row.fixed)
        with pytest.raises(UsageError, match="fixed"):
            set_offload("veth0", fixed, True, a.name)
        with pytest.raises(UsageError, match="no feature"):
            set_offload("veth0", "warp-drive", True, a.name)
        with pytest.raises(UsageError, match="no such device"):
            set_offload("nosuch0", "gro", True, a.name)


def test_vxlan_mtu_too_large_for_veth_underlay_is_found_fixed_and_rolled_back(tmp_path: Path) -> None:
    with lab() as the_lab:
        a, _ = _pair(the_lab)
        # No `dev`: the kernel then allows any MTU, and the underlay is whatever routes to the remote.
        a.run(
            "ip",
            "link",
            "add",
            "vxl0",
            "type",
            "vxlan",
            "id",
            "42",
            "remote",
            "198.18.0.2",
            "dstport",
            "4789",
        )
        a.run("ip", "link", "set", "vxl0", "mtu", "1500", "up")
        _, report = run_doctor(netns=a.name, interval=0.2)
        finding = report.finding("tunnel-mtu:vxl0")
        assert finding is not None, [f.id for f in report.findings]
        assert finding.evidence["encapsulation_bytes"] == 50 and finding.evidence["underlay"] == "veth0"
        assert finding.fix_commands == (f"ip -n {a.name} link set dev vxl0 mtu 1450",)

        rollback_file = apply_fix(finding, rollback_dir=tmp_path, netns=a.name)
        assert json.loads(rollback_file.read_text())["changes"][0]["previous"] == "1500"
        assert _mtu(a, "vxl0") == 1450 and _mtu(a, "veth0") == 1500  # only the named device changed
        _, after = run_doctor(netns=a.name, interval=0.2)
        assert after.finding("tunnel-mtu:vxl0") is None
        rollback(rollback_file)
        assert _mtu(a, "vxl0") == 1500


def test_veth_mtu_mismatch_across_namespaces() -> None:
    with lab() as the_lab:
        a, b = _pair(the_lab)
        b.run("ip", "link", "set", "veth0", "mtu", "1400")
        _, report = run_doctor(netns=a.name, interval=0.2)
        finding = report.finding("veth-mtu:veth0")
        assert finding is not None
        assert finding.evidence["peer_mtu"] == 1400 and finding.evidence["peer_same_netns"] is False
        assert finding.fix_commands == (f"ip -n {a.name} link set dev veth0 mtu 1400",)
        assert finding.apply_command == f"netsleuth doctor --netns {a.name} --fix veth-mtu:veth0 --yes"
        # From b, the larger end is the peer: its command runs in a's namespace, and there is no apply line.
        _, from_b = run_doctor(netns=b.name, interval=0.2)
        peer = from_b.finding("veth-mtu:veth0")
        assert peer is not None and peer.evidence["peer_netns"] == a.name
        assert peer.fix_commands == (f"ip -n {a.name} link set dev veth0 mtu 1400",)
        assert peer.apply_command == "" and peer.to_json()["apply"] is None


def test_sysctl_fix_in_a_namespace_is_restored_exactly(tmp_path: Path) -> None:
    with lab() as the_lab:
        a, _ = _pair(the_lab)
        a.run("sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1")
        from netsleuth.doctor.findings import Finding, FixAction, FixKind, Severity

        finding = Finding(
            id="rp-filter-drops",
            severity=Severity.WARNING,
            subject="all",
            title="t",
            evidence={},
            explanation="e",
            fix_commands=("sysctl -w net.ipv4.conf.all.rp_filter=2",),
            actions=(FixAction(FixKind.SYSCTL, "net.ipv4.conf.all.rp_filter", "2"),),
        )
        host_value = Path("/proc/sys/net/ipv4/conf/all/rp_filter").read_text()
        rollback_file = apply_fix(finding, rollback_dir=tmp_path, netns=a.name)
        assert a.run("sysctl", "-n", "net.ipv4.conf.all.rp_filter").stdout.strip() == "2"
        assert Path("/proc/sys/net/ipv4/conf/all/rp_filter").read_text() == host_value  # the host's untouched
        rollback(rollback_file)
        assert a.run("sysctl", "-n", "net.ipv4.conf.all.rp_filter").stdout.strip() == "1"


def _eth0_state() -> list[str]:
    return [
        run("ip", "-d", "link", "show", "eth0").stdout.split("\n", 1)[0],
        run("ethtool", "-k", "eth0").stdout,
        run("ethtool", "-g", "eth0", check=False).stdout,
        run("ethtool", "-l", "eth0", check=False).stdout,
        run("ethtool", "-c", "eth0", check=False).stdout,
        Path("/sys/class/net/eth0/queues/rx-0/rps_cpus").read_text(),
        Path("/proc/sys/net/core/netdev_budget").read_text(),
    ]


def test_reading_eth0_changes_nothing() -> None:
    before = _eth0_state()
    snapshot = take_snapshot()
    assert "eth0" in snapshot.links and snapshot.ethtool["eth0"].features
    show_offloads(["eth0"])
    result = subprocess.run(
        [sys.executable, "-m", "netsleuth", "doctor", "--interval", "0.2", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    json.loads(result.stdout)
    assert _eth0_state() == before


def test_cli_in_a_namespace_json_and_exit_codes() -> None:
    with lab() as the_lab:
        a, _ = _pair(the_lab)
        result = a.run(sys.executable, "-m", "netsleuth", "doctor", "--interval", "0.2", "--json")
        payload = json.loads(result.stdout)
        assert payload["findings"] == [] and payload["all_good"]
        bad = a.run(
            sys.executable, "-m", "netsleuth", "offload", "set", "veth0", "warp-drive", "on", check=False
        )
        assert bad.returncode == 2 and "no feature" in bad.stderr


def test_offload_set_on_a_bond_changes_its_slaves_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # bonding is not compiled into this test kernel: veth0 plays the bond, its sysfs says veth1 is a slave.
    from netsleuth.doctor import sysfs
    from netsleuth.doctor.model import DeviceSysfs

    real_read_device = sysfs.read_device

    def bond_view(root: Path, name: str) -> DeviceSysfs:
        if name == "veth0":
            return DeviceSysfs(bond_mode="active-backup", bond_slaves=("veth1",))
        return real_read_device(root, name)

    monkeypatch.setattr(sysfs, "read_device", bond_view)
    with lab() as the_lab:
        a, b = _pair(the_lab)
        the_lab.link(a, b, ["198.18.1.1/24"], ["198.18.1.2/24"], names=("veth1", "veth1"))
        set_offload("veth1", "gro", False, a.name)  # the slaves differ before the change
        results = set_offload("veth0", "gro", True, a.name)
        assert [(result.device, result.after) for result in results] == [("veth1", True), ("veth0", True)]
        assert _row(a, "veth1", "rx-gro") and _row(a, "veth0", "rx-gro")


# -- issue 13 item 7: every fix and apply line printed for a namespace works when pasted ------------------

_COMMAND_WORDS = ("ip ", "sysctl ", "ethtool ", "nsenter ", "netsleuth ", "iptables", "nft ", "echo ")


def _shell(line: str) -> subprocess.CompletedProcess[str]:
    """A printed line pasted into a root shell on the host: `netsleuth` is the installed entry point."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.run(
        ["sh", "-c", line], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def _doctor_text(netns: str) -> str:
    result = _shell(f"netsleuth doctor --netns {netns} --interval 0.2")
    assert result.returncode == 0, result.stderr
    return result.stdout


def _printed(text: str, label: str) -> list[str]:
    return [line.split(label, 1)[1].strip() for line in text.splitlines() if line.strip().startswith(label)]


def _doctor_ids(netns: str) -> set[str]:
    result = _shell(f"netsleuth doctor --netns {netns} --interval 0.2 --json")
    assert result.returncode == 0, result.stderr
    return {finding["id"] for finding in json.loads(result.stdout)["findings"]}


_BROKEN = {"tunnel-mtu:vxl0", "veth-mtu:veth0", "veth-mtu:veth1"}


def _break(a: Host, b: Host) -> None:
    """Three findings in netns a: a VXLAN too large for its veth underlay (veth1, whose end here no fix
    changes), a veth whose peer (in b) is smaller (fixed here, with an apply line), and one whose peer is
    larger (fixed in b: a peer command, no apply line)."""
    if "vxl0" not in a.run("ip", "-o", "link", "show").stdout:
        a.run(
            "ip",
            "link",
            "add",
            "vxl0",
            "type",
            "vxlan",
            "id",
            "42",
            "remote",
            "198.18.1.2",
            "dstport",
            "4789",
        )
    a.run("ip", "link", "set", "vxl0", "mtu", "1500", "up")
    for host, device, mtu in ((a, "veth0", 1500), (b, "veth0", 1400), (a, "veth1", 1400), (b, "veth1", 1500)):
        host.run("ip", "link", "set", device, "mtu", str(mtu))


def _host_mtus() -> dict[str, int]:
    return {link["ifname"]: int(link["mtu"]) for link in json.loads(run("ip", "-j", "link", "show").stdout)}


def _paste_all(lines: list[str]) -> None:
    assert lines
    for line in lines:
        result = _shell(line)
        assert result.returncode == 0, f"{line!r} failed: {result.stderr.strip()}"


def test_printed_fix_and_apply_lines_work_when_pasted(tmp_path: Path) -> None:
    rollback_dir = Path("/var/lib/netsleuth/rollback")
    rollback_before = set(rollback_dir.glob("*.json")) if rollback_dir.exists() else set()
    try:
        with lab() as the_lab:
            a, b = _pair(the_lab)
            the_lab.link(a, b, ["198.18.1.1/24"], ["198.18.1.2/24"], names=("veth1", "veth1"))
            host_links = _host_mtus()

            # 1. doctor's `fix:` lines, each pasted as printed.
            _break(a, b)
            text = _doctor_text(a.name)
            fixes = _printed(text, "fix:")
            assert len(fixes) == 3 and all(a.name in fix or b.name in fix for fix in fixes), text
            assert f"ip -n {b.name} link set dev veth1 mtu 1400" in fixes  # the peer's own namespace
            _paste_all(fixes)
            assert _doctor_ids(a.name) & _BROKEN == set()

            # 2. doctor's `apply with:` lines (only findings with an automatic fix have one).
            _break(a, b)
            text = _doctor_text(a.name)
            applies = _printed(text, "apply with:")
            assert sorted(applies) == [
                f"netsleuth doctor --netns {a.name} --fix tunnel-mtu:vxl0 --yes",
                f"netsleuth doctor --netns {a.name} --fix veth-mtu:veth0 --yes",
            ]
            _paste_all(applies)
            assert _doctor_ids(a.name) & _BROKEN == {"veth-mtu:veth1"}  # no apply line: a peer's command

            # 3. The same findings through diagnose --json: every fix that is a command, and the apply lines.
            _break(a, b)
            result = _shell(f"netsleuth diagnose --netns {a.name} --duration 0.5 --json")
            assert result.returncode == 0, result.stderr
            verdicts = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
            path = [v for v in verdicts if v.get("type") == "verdict" and v["category"].startswith("path:")]
            commands = [fix for v in path for fix in v["fix"] if fix.startswith(_COMMAND_WORDS)]
            assert {v["evidence"]["finding"] for v in path} >= _BROKEN
            assert all(a.name in command or b.name in command for command in commands), commands
            # Each finding's own fix, then the apply lines of the others would find nothing left to do.
            _paste_all([command for command in commands if not command.startswith("netsleuth ")])
            assert _doctor_ids(a.name) & _BROKEN == set()
            _break(a, b)
            _paste_all([command.split("   #")[0] for command in commands if command.startswith("netsleuth ")])
            assert _doctor_ids(a.name) & _BROKEN == {"veth-mtu:veth1"}
            after = _host_mtus()  # the host's links untouched (other tests' links come and go meanwhile)
            assert {name: mtu for name, mtu in after.items() if name in host_links} == {
                name: mtu for name, mtu in host_links.items() if name in after
            }
    finally:
        # `--fix` as printed writes its rollback file to the default directory: remove what this test made.
        made = set(rollback_dir.glob("*.json")) - rollback_before if rollback_dir.exists() else set()
        for rollback_file in made:
            rollback_file.unlink()


_FLOOD = """
import socket, sys, time
deadline = time.time() + float(sys.argv[3])
held = []
while time.time() < deadline:
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((sys.argv[1], int(sys.argv[2])))
    held.append(s)  # keep them: each completed handshake the full accept queue refuses is an overflow
    if len(held) > 200:
        held.pop(0).close()
    time.sleep(0.005)
"""


def _sysctl(host: Host | None, key: str) -> str:
    argv = ("sysctl", "-n", key)
    return (host.run(*argv) if host else run(*argv)).stdout.strip()


def test_sysctl_fix_and_apply_lines_from_a_namespace_change_that_namespace_only() -> None:
    """A listener that never accepts, in netns a, flooded with connects: doctor's listen-overflow finding
    fixes two per-namespace sysctls. Its printed lines, pasted, change a's values and never the host's."""
    from tests.privileged.tcp_helpers import Server

    keys = ("net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog")
    host_before = {key: _sysctl(None, key) for key in keys}
    rollback_dir = Path("/var/lib/netsleuth/rollback")
    rollback_before = set(rollback_dir.glob("*.json")) if rollback_dir.exists() else set()
    try:
        with lab() as the_lab:
            a, _ = _pair(the_lab)
            with Server(a, "198.18.0.1", 7300, "never_accept"):
                flood = a.popen([sys.executable, "-c", _FLOOD, "198.18.0.1", "7300", "60"])
                try:
                    text = _doctor_text(a.name)
                    fixes = _printed(text, "fix:")
                    assert fixes == [
                        f"ip netns exec {a.name} sysctl -w net.core.somaxconn=8192",
                        f"ip netns exec {a.name} sysctl -w net.ipv4.tcp_max_syn_backlog=4096",
                    ], text
                    assert _printed(text, "apply with:") == [
                        f"netsleuth doctor --netns {a.name} --fix listen-overflow --yes"
                    ]
                    _paste_all(fixes)
                    assert [_sysctl(a, key) for key in keys] == ["8192", "4096"]
                    # The next run proposes doubling again; its apply line applies that, in a as well.
                    applies = _printed(_doctor_text(a.name), "apply with:")
                    _paste_all(applies)
                    assert [_sysctl(a, key) for key in keys] == ["16384", "8192"]
                finally:
                    flood.kill()
                    flood.wait()
        assert {key: _sysctl(None, key) for key in keys} == host_before
    finally:
        made = set(rollback_dir.glob("*.json")) - rollback_before if rollback_dir.exists() else set()
        for rollback_file in made:
            rollback_file.unlink()
