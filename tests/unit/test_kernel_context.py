"""KernelContext on a recorded /proc and kallsyms (no root, no BPF): the clock, stacks, owners, sharing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from netsleuth._generated.tcp_abi import EventKind
from netsleuth.diagnostics.attribution import drop_owner_facts, tcp_owner_facts
from netsleuth.diagnostics.drops.decode import RawDrop
from netsleuth.diagnostics.drops.enrich import DropEnricher
from netsleuth.diagnostics.tcp.events import TcpEventEnricher
from netsleuth.diagnostics.tcp.resets import ResetEnricher
from netsleuth.kernel.context import KernelClock, KernelContext
from netsleuth.kernel.kallsyms import Kallsyms
from netsleuth.kernel.netns import NetnsNames
from netsleuth.kernel.process import SocketOwners
from netsleuth.kernel.reasons import DropReasons
from netsleuth.packet import PacketTuple
from tests.unit.tcp_fakes import KALLSYMS, NAMES, raw_event

SOCKET_INODE = 31337


@pytest.fixture
def context(tmp_path: Path) -> KernelContext:
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text(KALLSYMS)
    proc = tmp_path / "proc"
    (proc / "4242" / "fd").mkdir(parents=True)
    (proc / "4242" / "comm").write_text("nginx\n")
    (proc / "4242" / "cgroup").write_text(
        "0::/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n"
    )
    os.symlink(f"socket:[{SOCKET_INODE}]", proc / "4242" / "fd" / "3")
    (tmp_path / "netns").mkdir()
    netns = NetnsNames(proc_root=str(proc), netns_dirs=[str(tmp_path / "netns")])
    clock = KernelClock(monotonic_ns=5_000_000_000, wall_ns=1_700_000_000_000_000_000)
    return KernelContext(
        NAMES, Kallsyms(str(kallsyms)), netns, SocketOwners(proc_root=str(proc)), clock=clock
    )


def test_clock_is_read_once_and_travels_as_json(context: KernelContext) -> None:
    assert context.wall_offset_ns == 1_700_000_000_000_000_000 - 5_000_000_000
    assert context.clock.to_json() == {
        "monotonic_ns": 5_000_000_000,
        "wall_ns": 1_700_000_000_000_000_000,
        "offset_ns": 1_700_000_000_000_000_000 - 5_000_000_000,
    }
    # An event 1.5 s after the clock was read happened 1.5 s after its wall time.
    assert context.wall_time(6_500_000_000) == pytest.approx(1_700_000_001.5)


def test_clock_now_pairs_the_two_clocks() -> None:
    clock = KernelClock.now(monotonic_ns=lambda: 10, wall_ns=lambda: 25)
    assert (clock.offset_ns, clock.wall_time(20)) == (15, 35e-9)


def test_stack_starts_below_the_tracing_machinery(context: KernelContext) -> None:
    frames = (0xFFFFFFFF81100010, 0xFFFFFFFF81100110, 0xFFFFFFFF81300020, 0xFFFFFFFF81500040)
    assert context.stack(frames) == ("nf_send_reset+0x20", "ipt_do_table+0x40")
    assert context.function_names(frames) == ["nf_send_reset", "ipt_do_table"]
    assert context.symbol(0x10) == "0x10"  # below every symbol: the bare address


def test_owner_rules_are_the_same_for_drops_and_tcp_events(context: KernelContext) -> None:
    context.prepare()
    packet = PacketTuple(4, 6, "198.18.0.1", "198.18.0.2", 40000, 80, 0x02, length=60)
    softirq_drop = RawDrop(
        monotonic_ns=1,
        location=0,
        reason=2,
        netns=0,
        pid=99,
        tid=99,
        in_task=False,
        kthread=False,
        comm="swapper/0",
        sock_ino=SOCKET_INODE,
        sk_state=None,
        ifindex=0,
        ifname="",
        skb_len=60,
        cpu=0,
        packet=packet,
    )
    # In softirq the interrupted task is never the owner; the socket's holder is, with its container.
    owner = context.owner(drop_owner_facts(softirq_drop))
    assert (owner.pid, owner.comm, owner.source, owner.container) == (4242, "nginx", "socket", "0123456789ab")
    reset = raw_event(EventKind.RESET_SENT, ("198.18.0.2", 80), ("198.18.0.1", 4000), sock_ino=SOCKET_INODE)
    assert context.owner(tcp_owner_facts(reset)) == owner


def test_enrichers_share_one_context(context: KernelContext, tmp_path: Path) -> None:
    drops = DropEnricher(
        DropReasons({2: "NOT_SPECIFIED"}, "fixture"), explain_firewall=False, context=context
    )
    resets = ResetEnricher(context, explain_firewall=False)
    events = TcpEventEnricher(context)
    assert drops.context is resets.context is events.context is context
    resets.prepare(None)
    drops.prepare()  # the second prepare reads nothing again
    drops.close()
    resets.close()  # neither closes a context it was given


def test_an_enricher_without_a_context_makes_and_closes_its_own() -> None:
    enricher = ResetEnricher(explain_firewall=False)
    assert isinstance(enricher.context, KernelContext) and not enricher.context.firewall
    enricher.close()
