"""`conn` through NAT on hand-made events: the tracker asks a conntrack source it is given (no kernel)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from netsleuth._generated.tcp_abi import EventKind, RetransKind
from netsleuth.diagnostics.conn.tracker import ConnSelector, ConnTracker
from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple
from tests.unit.tcp_fakes import FakeClock, drop_record, fake_context, raw_event

CLIENT = ("198.18.70.1", 40000)
VIP = ("198.18.70.2", 80)
BACKEND = ("198.18.71.2", 8080)
RULE = "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"
A, SRV = 4026532001, 4026532002
LB_ENTRY = ConntrackEntry(
    "netns lb",
    FlowTuple("tcp", CLIENT, VIP),
    FlowTuple("tcp", BACKEND, CLIENT),
    state="SYN_SENT",
    status=("CONFIRMED", "DST_NAT"),
)


class FakeConntrack:
    """Looks entries up as ctnetlink does (a tuple matches either direction); counts the rounds of lookups."""

    def __init__(self, entries: list[ConntrackEntry]) -> None:
        self._entries = entries
        self.reads = 0
        self.asked: list[FlowTuple] = []

    def poll(self) -> None:
        pass

    def lookup(self, flows: Iterable[FlowTuple]) -> list[ConntrackEntry]:
        self.reads += 1
        wanted = set(flows)
        self.asked.extend(wanted)
        return [entry for entry in self._entries if {entry.original, entry.reply} & wanted]


def _connect_and_time_out(conns: ConnTracker, clock: FakeClock, drops: bool) -> None:
    conns.add_tcp(
        raw_event(EventKind.STATE, CLIENT, VIP, state="SYN_SENT", old_state="CLOSE", sk=1, side=1, netns=A)
    )
    for attempt in range(2):
        if drops:  # the server's INPUT drops the SYN after the load balancer rewrote it
            conns.add_drop(drop_record(CLIENT, BACKEND, 0x02, rule=RULE, netns=SRV, time=2.0 + attempt))
        assert conns.ready() == []
        clock.now += 1
        if attempt == 0:
            conns.add_tcp(
                raw_event(
                    EventKind.RETRANS,
                    CLIENT,
                    VIP,
                    state="SYN_SENT",
                    retrans_kind=RetransKind.SYN,
                    sk=1,
                    side=1,
                    netns=A,
                )
            )
    conns.add_tcp(
        raw_event(
            EventKind.STATE,
            CLIENT,
            VIP,
            state="CLOSE",
            old_state="SYN_SENT",
            reason=110,
            sk=1,
            side=1,
            netns=A,
        )
    )


def test_syn_dropped_after_dnat_names_the_hop_and_the_rule(tmp_path: Path) -> None:
    clock = FakeClock()
    conntrack = FakeConntrack([LB_ENTRY])
    conns = ConnTracker(ConnSelector(), fake_context(tmp_path), clock=clock, conntrack=conntrack)
    _connect_and_time_out(conns, clock, drops=True)
    clock.now += 1
    [report] = conns.ready()
    assert report.outcome == "timeout"
    assert report.verdict == (
        "connect 198.18.70.1:40000 → 198.18.70.2:80 failed after 1 SYN retransmit: DNAT 198.18.70.2:80 → "
        f'198.18.71.2:8080 in netns lb, then SYNs dropped by NETFILTER_DROP at "{RULE}" (netns srv)'
    )
    conn = report.connection
    assert len(conn.drops) == 2 and conn.nat is not None and len(conn.nat.hops) == 1
    record = report.record(lambda inode: None)
    assert record.nat[0].kind == "DNAT" and record.nat[0].after.dport == 8080
    assert [entry.event for entry in record.timeline].count("nat") == 1
    # One round found the hop, a second asked for hops around it (none); the second drop joined by alias.
    assert conntrack.reads == 2


def test_without_a_conntrack_source_the_drop_is_not_joined(tmp_path: Path) -> None:
    clock = FakeClock()
    conns = ConnTracker(ConnSelector(), fake_context(tmp_path), clock=clock)
    _connect_and_time_out(conns, clock, drops=True)
    clock.now += 1
    [report] = conns.ready()
    assert "no drop of its packets was seen on this host" in report.verdict


def test_no_drop_seen_still_names_the_nat_hop(tmp_path: Path) -> None:
    clock = FakeClock()
    conns = ConnTracker(
        ConnSelector(), fake_context(tmp_path), clock=clock, conntrack=FakeConntrack([LB_ENTRY])
    )
    _connect_and_time_out(conns, clock, drops=False)
    [report] = conns.flush()
    assert report.verdict == (
        "connect 198.18.70.1:40000 → 198.18.70.2:80 failed after 1 SYN retransmit: DNAT 198.18.70.2:80 → "
        "198.18.71.2:8080 in netns lb, then no drop of its packets was seen on this host, so they left it; "
        "look along the path to 198.18.71.2:8080"
    )


def test_conntrack_is_not_read_when_nothing_waits(tmp_path: Path) -> None:
    clock = FakeClock()
    conntrack = FakeConntrack([LB_ENTRY])
    conns = ConnTracker(ConnSelector(), fake_context(tmp_path), clock=clock, conntrack=conntrack)
    conns.add_tcp(
        raw_event(EventKind.STATE, CLIENT, VIP, state="SYN_SENT", old_state="CLOSE", sk=1, side=1, netns=A)
    )
    conns.add_tcp(
        raw_event(
            EventKind.STATE, CLIENT, VIP, state="ESTABLISHED", old_state="SYN_SENT", sk=1, side=1, netns=A
        )
    )
    for _ in range(5):
        conns.ready()
        clock.now += 1
    assert conntrack.reads == 0


def test_refused_behind_a_dnat_names_the_hop(tmp_path: Path) -> None:
    """The RST comes back from the backend; the client sees it from the address it dialled."""
    clock = FakeClock()
    conns = ConnTracker(
        ConnSelector(), fake_context(tmp_path), clock=clock, conntrack=FakeConntrack([LB_ENTRY])
    )
    conns.add_tcp(
        raw_event(EventKind.STATE, CLIENT, VIP, state="SYN_SENT", old_state="CLOSE", sk=1, side=1, netns=A)
    )
    conns.add_tcp(
        raw_event(
            EventKind.STATE,
            CLIENT,
            VIP,
            state="CLOSE",
            old_state="SYN_SENT",
            reason=111,
            sk=1,
            side=1,
            netns=A,
        )
    )
    [report] = conns.flush()
    assert report.outcome == "refused"
    assert report.verdict == (
        "connect 198.18.70.1:40000 → 198.18.70.2:80 refused: DNAT 198.18.70.2:80 → 198.18.71.2:8080 in "
        "netns lb, then 198.18.71.2:8080 answered the SYN with RST"
    )


def test_the_nat_hop_is_dated_by_the_first_packet_seen_past_it(tmp_path: Path) -> None:
    """conntrack read late (the connection's path found first from its retries): the hop's timeline entry
    moves back to the first translated drop once that drop is placed."""
    clock = FakeClock()
    conns = ConnTracker(
        ConnSelector(), fake_context(tmp_path), clock=clock, conntrack=FakeConntrack([LB_ENTRY])
    )
    conns.add_tcp(
        raw_event(EventKind.STATE, CLIENT, VIP, state="SYN_SENT", old_state="CLOSE", sk=1, side=1, netns=A)
    )
    conns.add_tcp(
        raw_event(
            EventKind.RETRANS,
            CLIENT,
            VIP,
            state="SYN_SENT",
            retrans_kind=RetransKind.SYN,
            sk=1,
            side=1,
            netns=A,
        )
    )
    conns.ready()  # the path, from the retrying connection alone
    first_drop = drop_record(CLIENT, BACKEND, 0x02, rule=RULE, netns=SRV, time=0.5)
    conns.add_drop(first_drop)
    clock.now += 1
    conns.ready()
    [report] = conns.flush()
    nat = [entry for entry in report.connection.entries if entry.event == "nat"]
    assert len(nat) == 1 and nat[0].time == first_drop.time


def test_drops_of_other_flows_do_not_crowd_a_failing_connection_out(tmp_path: Path) -> None:
    """On a busy host TCP drops of unrelated flows wait for connections too; the selected connection is
    looked up first, and once more before its verdict is final whatever the rate limit."""
    clock = FakeClock()
    conns = ConnTracker(
        ConnSelector(), fake_context(tmp_path), clock=clock, conntrack=FakeConntrack([LB_ENTRY])
    )
    for port in range(40):
        conns.add_drop(drop_record(("198.18.9.1", 20000 + port), ("198.18.9.2", 443), 0x02, time=1.0))
    conns.ready()  # a read for the noise alone: the rate limit starts now
    conns.add_tcp(
        raw_event(EventKind.STATE, CLIENT, VIP, state="SYN_SENT", old_state="CLOSE", sk=1, side=1, netns=A)
    )
    conns.add_tcp(
        raw_event(
            EventKind.STATE,
            CLIENT,
            VIP,
            state="CLOSE",
            old_state="SYN_SENT",
            reason=111,
            sk=1,
            side=1,
            netns=A,
        )
    )
    clock.now += 0.6
    [report] = conns.ready()
    assert "DNAT 198.18.70.2:80 → 198.18.71.2:8080 in netns lb" in report.verdict
