"""`conn`: joining events into connections and the one-line verdicts, on hand-made events (no BPF)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from netsleuth._generated.tcp_abi import EventKind, RetransKind
from netsleuth.diagnostics.conn.records import split_endpoint
from netsleuth.diagnostics.conn.tracker import ConnSelector, ConnTracker
from netsleuth.diagnostics.tcp.resets import ResetEnricher
from netsleuth.errors import UsageError
from tests.unit.tcp_fakes import REASON, FakeClock, drop_record, fake_context, raw_event

CLIENT = ("198.18.0.1", 41234)
SERVER = ("198.18.0.2", 80)
UNBOUND = ("198.18.0.1", 0)
RULE = "-A INPUT -p tcp -m tcp --dport 80 -j DROP"
A, B = 4026532001, 4026532002


def tracker(tmp_path: Path, clock: FakeClock, selector: ConnSelector | None = None) -> ConnTracker:
    return ConnTracker(selector or ConnSelector(), fake_context(tmp_path), clock=clock)


def test_connect_killed_by_a_firewall_drop(tmp_path: Path) -> None:
    clock = FakeClock()
    conns = tracker(tmp_path, clock)
    # connect(): the state changes before the kernel picks the local port.
    conns.add_tcp(
        raw_event(
            EventKind.STATE,
            UNBOUND,
            SERVER,
            state="SYN_SENT",
            old_state="CLOSE",
            side=1,
            in_task=1,
            pid=7,
            comm="curl",
            sk=0xAA,
            netns=A,
            time_ns=1,
        )
    )
    conns.add_drop(
        drop_record(CLIENT, SERVER, 0x02, rule=RULE, netns=B, time=4e9)
    )  # before its connection is known
    for retransmit in range(2):
        conns.add_tcp(
            raw_event(
                EventKind.RETRANS,
                CLIENT,
                SERVER,
                state="SYN_SENT",
                retrans_kind=RetransKind.SYN,
                sk=0xAA,
                netns=A,
                side=1,
                time_ns=2 + retransmit,
            )
        )
        conns.add_drop(drop_record(CLIENT, SERVER, 0x02, rule=RULE, netns=B, time=4e9))
    conns.add_tcp(
        raw_event(
            EventKind.STATE,
            CLIENT,
            SERVER,
            state="CLOSE",
            old_state="SYN_SENT",
            reason=110,
            sk=0xAA,
            netns=A,
            side=1,
            time_ns=9,
        )
    )
    assert conns.ready() == []  # late events may still come
    clock.now += 1
    [report] = conns.ready()
    assert report.outcome == "timeout"
    assert report.verdict == (
        "connect 198.18.0.1:41234 → 198.18.0.2:80 failed after 2 SYN retransmits: SYNs dropped by "
        f'NETFILTER_DROP at "{RULE}" (netns srv)'
    )
    conn = report.connection
    assert conn.client_netns == A and conn.owner is not None and conn.owner.pid == 7
    assert min(conn.entries, key=lambda e: e.time).event == "state"
    assert len(conn.drops) == 3
    record = report.record(lambda inode: None)
    assert record.syn_retransmits == 2 and record.errno == "ETIMEDOUT" and record.established is False


def test_connect_without_drops_points_along_the_path(tmp_path: Path) -> None:
    clock = FakeClock()
    conns = tracker(tmp_path, clock)
    conns.add_tcp(
        raw_event(
            EventKind.RETRANS, CLIENT, SERVER, state="SYN_SENT", retrans_kind=RetransKind.SYN, sk=1, side=1
        )
    )
    conns.add_tcp(
        raw_event(
            EventKind.STATE, CLIENT, SERVER, state="CLOSE", old_state="SYN_SENT", reason=110, sk=1, side=1
        )
    )
    [report] = conns.flush()
    assert report.verdict.endswith(
        "failed after 1 SYN retransmit: no drop of its packets was seen on this host, so they left it; "
        "look along the path to 198.18.0.2"
    )


def test_connect_refused_by_a_reject_rule(tmp_path: Path) -> None:
    clock = FakeClock()
    context = fake_context(tmp_path)
    conns = ConnTracker(ConnSelector(), context, clock=clock)
    resets = ResetEnricher(context, explain_firewall=False)
    fw = raw_event(EventKind.RESET_FIREWALL, SERVER, CLIENT, has_trigger=1, tcp_flags=0x14, ack=100)
    received = raw_event(EventKind.RESET_RECEIVED, CLIENT, SERVER, state="SYN_SENT", side=1, sk=2)
    conns.add_tcp(
        raw_event(EventKind.STATE, CLIENT, SERVER, state="SYN_SENT", old_state="CLOSE", sk=2, side=1)
    )
    for raw, record in resets.enrich_pairs([fw, received]):
        conns.add_tcp(raw, record)
    conns.add_tcp(
        raw_event(
            EventKind.STATE, CLIENT, SERVER, state="CLOSE", old_state="SYN_SENT", reason=111, sk=2, side=1
        )
    )
    [report] = conns.flush()
    assert report.outcome == "refused"
    assert report.verdict.startswith(
        "connect 198.18.0.1:41234 → 198.18.0.2:80 refused: a netfilter REJECT rule"
    )


def test_connection_reset_by_the_server_names_the_servers_cause(tmp_path: Path) -> None:
    clock = FakeClock()
    context = fake_context(tmp_path)
    conns = ConnTracker(ConnSelector(), context, clock=clock)
    resets = ResetEnricher(context, explain_firewall=False)
    conns.add_tcp(
        raw_event(
            EventKind.STATE,
            CLIENT,
            SERVER,
            state="ESTABLISHED",
            old_state="SYN_SENT",
            sk=3,
            side=1,
            value1=250_000,
            time_ns=10,
        )
    )
    sent = raw_event(
        EventKind.RESET_SENT,
        SERVER,
        CLIENT,
        state="CLOSE",
        reason=REASON["TCP_ABORT_ON_CLOSE"],
        unread=12,
        in_task=1,
        pid=9,
        comm="srv",
        time_ns=2_000_000_010,
    )
    for raw, record in resets.enrich_pairs([sent]):
        conns.add_tcp(raw, record)
    conns.add_tcp(
        raw_event(
            EventKind.STATE,
            CLIENT,
            SERVER,
            state="CLOSE",
            old_state="ESTABLISHED",
            sk=3,
            reason=104,
            side=1,
            time_ns=2_000_000_020,
        )
    )
    [report] = conns.flush()
    assert report.outcome == "reset"
    assert report.verdict == (
        "connection 198.18.0.1:41234 → 198.18.0.2:80 established in 250 us, reset by the server after 2 s: "
        "srv[9] closed its connection 198.18.0.2:80 -> 198.18.0.1:41234 with 12 bytes it had not read: Linux "
        "then resets instead of closing gracefully (RFC 2525 2.17)"
    )


def test_graceful_close_and_benign_purges(tmp_path: Path) -> None:
    clock = FakeClock()
    conns = tracker(tmp_path, clock)
    conns.add_tcp(
        raw_event(
            EventKind.STATE,
            CLIENT,
            SERVER,
            state="ESTABLISHED",
            old_state="SYN_SENT",
            sk=4,
            side=1,
            value1=90_000,
        )
    )
    conns.add_tcp(
        raw_event(EventKind.STATE, SERVER, CLIENT, state="SYN_RECV", old_state="LISTEN", sk=5, side=2)
    )
    conns.add_drop(drop_record(CLIENT, SERVER, 0x11, reason="QUEUE_PURGE"))
    conns.add_tcp(
        raw_event(
            EventKind.STATE,
            CLIENT,
            SERVER,
            state="CLOSE",
            old_state="LAST_ACK",
            sk=4,
            side=1,
            value2=7,
            value3=4,
        )
    )
    clock.now += 1
    assert conns.ready() == []  # the server's socket is still open
    conns.add_tcp(
        raw_event(EventKind.STATE, SERVER, CLIENT, state="CLOSE", old_state="FIN_WAIT2", sk=5, side=2)
    )
    clock.now += 1
    [report] = conns.ready()
    assert report.outcome == "closed"
    assert report.verdict == (
        "connection 198.18.0.1:41234 → 198.18.0.2:80 established in 90 us, closed normally after 0 us "
        "(bytes_acked 7, bytes_received 4)"
    )


def test_still_open_at_the_end(tmp_path: Path) -> None:
    conns = tracker(tmp_path, FakeClock())
    conns.add_tcp(
        raw_event(
            EventKind.STATE,
            CLIENT,
            SERVER,
            state="ESTABLISHED",
            old_state="SYN_SENT",
            sk=6,
            side=1,
            value1=1000,
        )
    )
    conns.add_tcp(
        raw_event(
            EventKind.RETRANS, CLIENT, SERVER, state="ESTABLISHED", sk=6, side=1, retrans_kind=RetransKind.TLP
        )
    )
    [report] = conns.flush()
    assert report.outcome == "open"
    assert report.verdict.endswith("still open after 0 us (1 retransmit (1 tail loss probe))")


def test_selector_keeps_only_the_named_server(tmp_path: Path) -> None:
    selector = ConnSelector(servers=(ipaddress.ip_network("198.18.0.2/32"),), server_port=443)
    conns = tracker(tmp_path, FakeClock(), selector)
    conns.add_tcp(
        raw_event(EventKind.STATE, CLIENT, SERVER, state="ESTABLISHED", old_state="SYN_SENT", sk=7, side=1)
    )
    conns.add_drop(drop_record(CLIENT, SERVER, 0x10))
    assert conns.flush() == []
    assert selector.matches(("198.18.0.1", 5), ("198.18.0.2", 443))
    assert not selector.matches(("198.18.0.2", 443), ("198.18.0.1", 5))  # the server must be the server


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("198.18.0.2:80", ("198.18.0.2", 80)),
        ("198.18.0.0/24", ("198.18.0.0/24", None)),
        ("[2001:db8::2]:443", ("2001:db8::2", 443)),
        ("2001:db8::2", ("2001:db8::2", None)),
        ("[2001:db8::2]", ("2001:db8::2", None)),
    ],
)
def test_split_endpoint(text: str, expected: tuple[str, int | None]) -> None:
    assert split_endpoint(text) == expected


@pytest.mark.parametrize("text", ["198.18.0.2:0", "198.18.0.2:http", "[2001:db8::2", "[2001:db8::2]x"])
def test_split_endpoint_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        split_endpoint(text)


def test_reused_ports_start_a_new_connection_and_report_the_old_one(tmp_path: Path) -> None:
    clock = FakeClock()
    conns = tracker(tmp_path, clock)
    for sk in (10, 11):
        conns.add_tcp(
            raw_event(EventKind.STATE, UNBOUND, SERVER, state="SYN_SENT", old_state="CLOSE", side=1, sk=sk)
        )
        conns.add_tcp(
            raw_event(
                EventKind.STATE, CLIENT, SERVER, state="ESTABLISHED", old_state="SYN_SENT", side=1, sk=sk
            )
        )
        conns.add_tcp(
            raw_event(EventKind.STATE, CLIENT, SERVER, state="CLOSE", old_state="LAST_ACK", side=1, sk=sk)
        )
    reports = conns.flush()
    assert [report.outcome for report in reports] == ["closed", "closed"]


def test_a_connects_duration_starts_at_its_syn_sent_not_at_the_event_that_gave_its_port(
    tmp_path: Path,
) -> None:
    """connect()'s SYN_SENT has no local port and waits for the next event, which creates the connection:
    an application that gave up 1.5 s after connect() was reported 0.5 s (from the retransmit)."""
    clock = FakeClock()
    conns = tracker(tmp_path, clock)
    common: dict[str, Any] = {"sk": 0xBB, "netns": A, "side": 1}
    syn_sent = raw_event(
        EventKind.STATE, UNBOUND, SERVER, state="SYN_SENT", old_state="CLOSE", time_ns=1_000_000_000, **common
    )
    retransmit = raw_event(
        EventKind.RETRANS, CLIENT, SERVER, state="SYN_SENT", retrans_kind=RetransKind.SYN,
        time_ns=2_000_000_000, **common,
    )  # fmt: skip
    closed = raw_event(
        EventKind.STATE, CLIENT, SERVER, state="CLOSE", old_state="SYN_SENT", time_ns=2_500_000_000, **common
    )
    for event in (syn_sent, retransmit, closed):
        conns.add_tcp(event)
    [report] = conns.flush()
    assert report.record(lambda inode: None).duration_s == pytest.approx(1.5, abs=1e-3)
