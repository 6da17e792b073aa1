"""netsleuth never counts its own footprint as the host's: the unread netlink replies its firewall reads
(iptables-nft-save, run by netsleuth in the namespace) leave behind are QUEUE_PURGE drops the drops program
tells apart by socket (bpf/own_sockets.bpf.h), while the same tool run by anyone else stays the host's."""

from __future__ import annotations

import subprocess

import pytest

from netsleuth.diagnostics.drops.program import DropsProgramConfig, DropsSession
from netsleuth.diagnostics.own_sockets import recent_own_sockets
from netsleuth.firewall.iptables import read_iptables
from netsleuth.kernel.reasons import load_drop_reasons
from tests.netlab import Lab
from tests.privileged.test_diagnose import flush_rcu_callbacks

pytestmark = pytest.mark.privileged


def purges(session: DropsSession, netns: int) -> int:
    purge = load_drop_reasons().value("QUEUE_PURGE")
    return sum(group.count for group in session.groups() if group.reason == purge and group.netns == netns)


def test_purges_of_netsleuths_own_firewall_reads_are_told_apart_from_the_hosts() -> None:
    lab = Lab()
    try:
        host = lab.host("o")
        host.run("iptables", "-A", "INPUT", "-p", "udp", "--sport", "53", "-j", "DROP")
        flush_rcu_callbacks()  # the purge of this `iptables -A` happens now, before anything watches
        session = DropsSession(DropsProgramConfig(summary_only=True, skip_own=True))
        try:
            session.start()
            assert session.own_marked
            # This process is the netsleuth here: its firewall reads are its own...
            for _ in range(3):
                read_iptables(host.netns_path)
            flush_rcu_callbacks()
            assert purges(session, host.inode) == 0
            assert session.own_drops() == 3  # iptables-nft-save leaves one unread ACK per run
            # ...the same tool run by someone else (not a child of this process) is the host's.
            subprocess.run(
                ["setsid", "sh", "-c", f"ip netns exec {host.name} iptables-nft-save -c >/dev/null"],
                check=True,
            )
            flush_rcu_callbacks()
            assert purges(session, host.inode) == 1 and session.own_drops() == 3
        finally:
            session.close()
        # The sockets this run marked are left for the next run: their purges may come up to lazy RCU's
        # flush later, in a process that never saw them.
        assert len(recent_own_sockets()) >= 3
    finally:
        lab.close()


def test_firewall_reads_after_the_last_drain_are_still_netsleuths() -> None:
    # diagnose names its last drops, and its DNS and tcp verdicts' rules, after the drops program stopped:
    # those reads' unread replies are purged up to lazy RCU's flush later, in the next run. Their sockets
    # must still be marked (and handed on at close), or the next diagnose reports a QUEUE_PURGE of its own.
    lab = Lab()
    try:
        host = lab.host("l")
        session = DropsSession(DropsProgramConfig(summary_only=True, skip_own=True))
        try:
            session.start()
            assert session.own_marked
            session.last_records()  # the run's end: the drops program stops
            marked = len(list(session._programs.maps.own_sockets.keys()))
            read_iptables(host.netns_path)
            assert len(list(session._programs.maps.own_sockets.keys())) > marked
        finally:
            session.close()
    finally:
        lab.close()
