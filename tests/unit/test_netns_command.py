"""Commands printed for a namespace: the one helper (netns_command.in_netns) and doctor's placed findings."""

from __future__ import annotations

import pytest

from netsleuth.diagnostics.drops.rules import drop_verdicts
from netsleuth.doctor.findings import Finding, FixAction, FixKind, Severity
from netsleuth.doctor.fixes import action_netns, apply_command, mtu_fix, placed_in, sysctl_fix
from netsleuth.netns_command import in_netns, is_placed
from netsleuth.spec.diagnose import Window


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("ip link set dev fxa mtu 1400", "ip -n fx1 link set dev fxa mtu 1400"),
        ("sysctl -w net.core.somaxconn=4096", "ip netns exec fx1 sysctl -w net.core.somaxconn=4096"),
        ("ethtool -K veth0 gro on", "ip netns exec fx1 ethtool -K veth0 gro on"),
        # The redirection must happen inside the namespace, not in the calling shell.
        (
            "echo 0 > /sys/class/net/veth0/queues/rx-0/rps_cpus",
            "ip netns exec fx1 sh -c 'echo 0 > /sys/class/net/veth0/queues/rx-0/rps_cpus'",
        ),
        ("ss -ltnup   # what does listen there", "ip netns exec fx1 ss -ltnup   # what does listen there"),
        ("netsleuth tcp retrans --summary", "netsleuth tcp retrans --summary --netns fx1"),
        # Host-wide settings have no per-namespace copy (or a read-only one): the host's command is right.
        ("sysctl -w net.core.netdev_max_backlog=2000", "sysctl -w net.core.netdev_max_backlog=2000"),
        (
            "sysctl -w net.netfilter.nf_conntrack_max=524288",
            "sysctl -w net.netfilter.nf_conntrack_max=524288",
        ),
        # Already placed: never wrapped twice.
        ("ip -n other link set dev x mtu 1", "ip -n other link set dev x mtu 1"),
        ("ip netns exec other ss -ltn", "ip netns exec other ss -ltn"),
        ("netsleuth drops --netns 4026532246", "netsleuth drops --netns 4026532246"),
    ],
)
def test_in_netns_named(command: str, expected: str) -> None:
    assert in_netns(command, "fx1") == expected


def test_in_netns_without_a_namespace_is_unchanged() -> None:
    assert in_netns("ip link set dev x mtu 1", None) == "ip link set dev x mtu 1"


def test_in_netns_by_file_uses_nsenter_and_a_fresh_sysfs() -> None:
    path = "/proc/42/ns/net"
    assert (
        in_netns("ip link set dev x mtu 1", path) == "nsenter --net=/proc/42/ns/net ip link set dev x mtu 1"
    )
    assert in_netns("echo f > /sys/class/net/x/queues/rx-0/rps_cpus", path) == (
        "nsenter --net=/proc/42/ns/net unshare -m sh -c "
        "'mount -t sysfs sysfs /sys && echo f > /sys/class/net/x/queues/rx-0/rps_cpus'"
    )


def test_quoting_of_odd_names() -> None:
    assert in_netns("ip link show", "a b") == "ip -n 'a b' link show"
    assert is_placed("ip -n 'a b' link show")


def _finding(
    fix_commands: tuple[str, ...], actions: tuple[FixAction, ...], persistent: tuple[str, ...] = ()
) -> Finding:
    return Finding(
        id="veth-mtu:fxa",
        severity=Severity.WARNING,
        subject="fxa",
        title="t",
        evidence={},
        explanation="e",
        fix_commands=fix_commands,
        persistent=persistent,
        actions=actions,
    )


def test_placed_finding_carries_the_namespace_in_fix_apply_and_json() -> None:
    fix = mtu_fix("fxa", 1400)
    placed = placed_in(_finding(fix.commands, fix.actions, fix.persistent), "fx1")
    assert placed.fix_commands == ("ip -n fx1 link set dev fxa mtu 1400",)
    assert placed.apply_command == "netsleuth doctor --netns fx1 --fix veth-mtu:fxa --yes"
    data = placed.to_json()
    assert data["fix"] == ["ip -n fx1 link set dev fxa mtu 1400"] and data["apply"] == placed.apply_command


def test_placed_on_the_host_and_without_actions() -> None:
    fix = mtu_fix("fxa", 1400)
    host = placed_in(_finding(fix.commands, fix.actions), None)
    assert (
        host.fix_commands == fix.commands
        and host.apply_command == "netsleuth doctor --fix veth-mtu:fxa --yes"
    )
    assert placed_in(_finding(("ip link set dev x mtu 1",), ()), "fx1").apply_command == ""


def test_sysctl_persistence_in_a_namespace_is_not_the_hosts_sysctl_d() -> None:
    fix = sysctl_fix("net.core.somaxconn", 4096)
    placed = placed_in(_finding(fix.commands, fix.actions, fix.persistent), "fx1")
    assert placed.fix_commands == ("ip netns exec fx1 sysctl -w net.core.somaxconn=4096",)
    assert placed.persistent[0].startswith(
        "run `ip netns exec fx1 sysctl -w net.core.somaxconn=4096` wherever"
    )
    host_wide = sysctl_fix("net.netfilter.nf_conntrack_max", 1024)
    assert placed_in(
        _finding(host_wide.commands, host_wide.actions, host_wide.persistent), "fx1"
    ).persistent == (host_wide.persistent)


def test_host_wide_actions_are_applied_in_the_hosts_namespace() -> None:
    host_wide = (FixAction(FixKind.SYSCTL, "net.netfilter.nf_conntrack_max", "1024"),)
    assert action_netns(host_wide, "fx1") is None
    assert action_netns((FixAction(FixKind.MTU, "fxa", "1400"),), "fx1") == "fx1"
    assert apply_command("a:b c", None) == "netsleuth doctor --fix 'a:b c' --yes"


def _firewall_fix(context: Window) -> str:
    from tests.unit.test_diagnose_rules import group

    netfilter = {
        "hook": "input",
        "table": "filter",
        "chain": "INPUT",
        "rule": "-A INPUT -j DROP",
        "backend": "iptables-nft",
        "family": "ip",
        "rule_number": 1,
    }
    [verdict] = drop_verdicts([group("NETFILTER_DROP", 2, netfilter=netfilter)], context)  # netns 4026531840
    return verdict.fix[0]


def test_drop_fix_in_an_unnamed_namespace_is_entered_by_a_process_file_never_run_on_the_host() -> None:
    # A container's namespace has no `ip netns` name: printed bare, `iptables -D INPUT 1` would delete the
    # host's first INPUT rule.
    files = {4026531840: "/proc/4242/ns/net"}
    inside = Window(1.0, {}, host_netns=4026531833, netns_file=files.get)
    assert _firewall_fix(inside).startswith("nsenter --net=/proc/4242/ns/net iptables -t filter -D INPUT 1")
    gone = Window(1.0, {}, host_netns=4026531833, netns_file=lambda inode: None)
    assert _firewall_fix(gone).startswith(
        "ip netns exec 4026531840 iptables"
    )  # fails to enter, changes nothing
    host = Window(1.0, {}, host_netns=4026531840, netns_file=files.get)
    assert _firewall_fix(host).startswith("iptables -t filter -D INPUT 1")
