"""ResetEnricher on hand-made kernel events: records, JSON, firewall trigger inference, peer causes."""

from __future__ import annotations

from pathlib import Path

from netsleuth._generated.tcp_abi import EventKind, SockFlag
from netsleuth.diagnostics.tcp.records import AbortRecord, ConntrackView, ResetRecord
from netsleuth.diagnostics.tcp.resets import ConntrackReader, ResetEnricher
from tests.unit.tcp_fakes import REASON, fake_context, raw_event

CLIENT = ("198.18.0.1", 41234)
SERVER = ("198.18.0.2", 80)


class FixedConntrack(ConntrackReader):
    def view(self, netns_path: str | None) -> ConntrackView:
        return ConntrackView(True, 7, 1, 0)


def enricher(tmp_path: Path) -> ResetEnricher:
    return ResetEnricher(fake_context(tmp_path), explain_firewall=False, conntrack=FixedConntrack())


def test_sent_reset_json(tmp_path: Path) -> None:
    raw = raw_event(
        EventKind.RESET_SENT,
        SERVER,
        CLIENT,
        reason=REASON["NO_SOCKET"],
        has_trigger=1,
        tcp_flags=0x02,
        seq=5,
        ack=0,
        netns=4026532001,
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, ResetRecord)
    data = record.to_json()
    assert data["type"] == "reset" and data["direction"] == "sent" and data["by_firewall"] is False
    assert data["state"] is None and data["reason"] == "NO_SOCKET" and data["reason_code"] == 1
    assert data["trigger"] == {"flags": "SYN", "seq": 5, "ack": 0, "len": 0}
    assert (data["saddr"], data["sport"], data["daddr"], data["dport"]) == (*SERVER, *CLIENT)
    assert data["cause_code"] == "no_listener" and data["owner"] == "kernel" and data["pid"] is None
    assert data["local"] == "198.18.0.2:80" and data["remote"] == "198.18.0.1:41234"


def test_received_reset_is_addressed_from_the_peer(tmp_path: Path) -> None:
    raw = raw_event(EventKind.RESET_RECEIVED, CLIENT, SERVER, state="ESTABLISHED", side=1)
    data = enricher(tmp_path).enrich(raw).to_json()  # type: ignore[union-attr]
    assert data["direction"] == "received" and data["reason"] is None
    assert (data["saddr"], data["sport"], data["daddr"], data["dport"]) == (*SERVER, *CLIENT)
    assert data["side"] == "client" and data["cause_code"] == "peer_reset"


def test_active_reset_is_owned_by_the_closing_task(tmp_path: Path) -> None:
    raw = raw_event(
        EventKind.RESET_SENT,
        SERVER,
        CLIENT,
        state="CLOSE",
        reason=REASON["TCP_STATE"],
        in_task=1,
        pid=77,
        tid=77,
        comm="server",
        sock_flags=int(SockFlag.FULL | SockFlag.HAS_FILE | SockFlag.LINGER | SockFlag.LINGER_ZERO),
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, ResetRecord)
    assert record.pid == 77 and record.owner == "task"
    assert record.cause_code == "linger_zero" and record.cause.startswith("server[77] closed")


def test_softirq_reset_is_not_blamed_on_the_interrupted_task(tmp_path: Path) -> None:
    raw = raw_event(
        EventKind.RESET_SENT,
        SERVER,
        CLIENT,
        state="LISTEN",
        reason=REASON["TCP_FLAGS"],
        has_trigger=1,
        tcp_flags=0x10,
        in_task=1,
        pid=999,
        comm="bystander",
        owner_pid=42,
        owner_comm="nginx",
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, ResetRecord)
    assert record.pid == 42 and record.owner == "socket"
    assert record.conntrack == ConntrackView(True, 7, 1, 0)
    assert record.to_json()["conntrack"] == {
        "loaded": True,
        "invalid": 7,
        "invalid_delta": 1,
        "be_liberal": 0,
    }


def test_firewall_rst_infers_the_rejected_syn_and_the_hook(tmp_path: Path) -> None:
    frames = (
        0xFFFFFFFF81100010,
        0xFFFFFFFF81200010,
        0xFFFFFFFF81300010,
        0xFFFFFFFF81400010,
        0xFFFFFFFF81500010,
        0xFFFFFFFF81600010,
        0xFFFFFFFF81700010,
        0xFFFFFFFF81800010,
    )
    # nf_send_reset answers a SYN (seq 999) with RST|ACK, ack 1000.
    raw = raw_event(
        EventKind.RESET_FIREWALL,
        SERVER,
        CLIENT,
        has_trigger=1,
        tcp_flags=0x14,
        seq=0,
        ack=1000,
        ifname="veth0",
        frames=frames,
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, ResetRecord)
    assert record.by_firewall and record.direction == "sent"
    assert record.trigger is not None and (record.trigger.flags, record.trigger.seq) == ("SYN", 999)
    assert record.trigger.inferred is True
    assert record.netfilter == {"hook": "input", "table": None, "chain": None, "rule": None}
    assert record.cause_code == "firewall_reject" and "could not be identified" in record.cause
    assert record.to_json()["trigger"]["inferred"] is True


def test_peer_cause_even_when_the_receive_event_comes_first(tmp_path: Path) -> None:
    """tcp_send_active_reset fires its tracepoint after transmitting: across veth the peer sees it first."""
    received = raw_event(EventKind.RESET_RECEIVED, CLIENT, SERVER, state="ESTABLISHED", time_ns=10)
    sent = raw_event(
        EventKind.RESET_SENT,
        SERVER,
        CLIENT,
        state="CLOSE",
        reason=REASON["TCP_ABORT_ON_CLOSE"],
        unread=5,
        time_ns=20,
    )
    records = enricher(tmp_path).enrich_many([received, sent])
    assert [record.direction for record in records if isinstance(record, ResetRecord)] == ["received", "sent"]
    first, second = records
    assert isinstance(first, ResetRecord) and isinstance(second, ResetRecord)
    assert first.peer_cause == second.cause and second.cause_code == "unread_data"


def test_abort_uses_the_state_before_close(tmp_path: Path) -> None:
    raw = raw_event(
        EventKind.ERROR, CLIENT, SERVER, state="CLOSE", old_state="SYN_SENT", reason=110, retransmits=6
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, AbortRecord)
    assert record.state == "SYN_SENT" and record.cause_code == "connect_timeout"
    data = record.to_json()
    assert data["type"] == "abort" and data["errno"] == "ETIMEDOUT" and data["direction"] == "none"


def test_errors_that_come_with_an_rst_are_not_aborts(tmp_path: Path) -> None:
    for errno_number in (104, 111):
        raw = raw_event(EventKind.ERROR, CLIENT, SERVER, state="CLOSE", reason=errno_number)
        assert enricher(tmp_path).enrich(raw) is None
