"""Records of the `tcp` subcommands from hand-made kernel events (no BPF), and the TcpExt reader."""

from __future__ import annotations

from pathlib import Path

from netsleuth._generated.tcp_abi import TCP_REASON_SYN_ACCEPT_QUEUE_FULL, EventKind, RetransKind
from netsleuth.diagnostics.tcp.events import NetstatReader, TcpEventEnricher
from netsleuth.diagnostics.tcp.program import RawTcpGroup
from netsleuth.diagnostics.tcp.records import (
    ConnectRecord,
    LifeRecord,
    QueueRecord,
    RetransRecord,
    StateRecord,
)
from netsleuth.diagnostics.tcp.view import describe
from netsleuth.kernel.reasons import DropReasons
from netsleuth.spec.records import to_builtins
from tests.unit.tcp_fakes import fake_context, raw_event

CLIENT = ("198.18.0.1", 41234)
SERVER = ("198.18.0.2", 80)
REASONS = DropReasons({2: "NOT_SPECIFIED", 6: "SOCKET_RCVBUFF", 40: "TCP_LISTEN_OVERFLOW"}, "fixture")


class FixedSomaxconn(TcpEventEnricher):
    def somaxconn(self, netns: int) -> int | None:
        return 4096


def enricher(tmp_path: Path) -> TcpEventEnricher:
    return FixedSomaxconn(fake_context(tmp_path), REASONS)


def test_life(tmp_path: Path) -> None:
    raw = raw_event(
        EventKind.LIFE,
        CLIENT,
        SERVER,
        state="CLOSE",
        old_state="LAST_ACK",
        value1=2_500_000_000,
        value2=1002,
        value3=301,
        side=1,
        owner_pid=9,
        owner_comm="curl",
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, LifeRecord)
    data = record.to_json()
    assert data["type"] == "life" and data["duration_s"] == 2.5 and data["side"] == "client"
    assert (data["bytes_acked"], data["bytes_received"], data["pid"], data["comm"]) == (1002, 301, 9, "curl")
    assert describe(record) == (
        "curl[9] 198.18.0.1:41234 -> 198.18.0.2:80 lived 2.5 s, bytes_acked 1002, bytes_received 301"
    )


def test_state_change_with_error(tmp_path: Path) -> None:
    raw = raw_event(
        EventKind.STATE, CLIENT, SERVER, state="CLOSE", old_state="SYN_SENT", value1=3_000, reason=111
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, StateRecord)
    assert record.to_json()["errno"] == "ECONNREFUSED" and record.previous_state_s == 3e-6
    assert "SYN_SENT -> CLOSE after 3 us with ECONNREFUSED" in describe(record)


def test_first_state_of_a_socket_has_no_previous_duration(tmp_path: Path) -> None:
    raw = raw_event(
        EventKind.STATE, CLIENT, SERVER, state="SYN_SENT", old_state="CLOSE", in_task=1, pid=5, comm="x"
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, StateRecord) and record.previous_state_s is None
    assert record.pid == 5 and record.owner == "task"  # connect() runs in the caller


def test_retransmits_count_per_flow(tmp_path: Path) -> None:
    tcp = enricher(tmp_path)
    raws = [
        raw_event(
            EventKind.RETRANS, CLIENT, SERVER, state="ESTABLISHED", retrans_kind=RetransKind.TLP, ca_state=0
        ),
        raw_event(
            EventKind.RETRANS,
            CLIENT,
            SERVER,
            state="ESTABLISHED",
            retrans_kind=RetransKind.TIMEOUT,
            ca_state=4,
            value1=2,
            value2=120,
            value3=1,
        ),
        raw_event(EventKind.SYNACK_RETRANS, SERVER, CLIENT, state="NEW_SYN_RECV", value1=1),
    ]
    records = [tcp.enrich(raw) for raw in raws]
    assert all(isinstance(record, RetransRecord) for record in records)
    first, second, synack = (record.to_json() for record in records if record is not None)
    assert (first["kind"], first["flow_count"], first["congestion_state"]) == ("tlp", 1, "Open")
    assert (second["kind"], second["flow_count"], second["congestion_state"]) == ("timeout", 2, "Loss")
    assert second["srtt_us"] == 120 and second["total_retrans"] == 2
    assert synack["kind"] == "synack" and synack["synack_retransmits"] == 1 and synack["flow_count"] == 1


def test_connect_latency_and_failure(tmp_path: Path) -> None:
    ok = enricher(tmp_path).enrich(raw_event(EventKind.CONNECT, CLIENT, SERVER, value1=1_500_000))
    failed = enricher(tmp_path).enrich(raw_event(EventKind.CONNECT, CLIENT, SERVER, value1=7, reason=110))
    assert isinstance(ok, ConnectRecord) and isinstance(failed, ConnectRecord)
    assert ok.to_json()["latency_ms"] == 1.5 and ok.to_json()["ok"] is True
    assert failed.to_json()["errno"] == "ETIMEDOUT" and "failed after 0 us: ETIMEDOUT" in describe(failed)


def test_accept_queue_overflow_from_a_discarded_syn(tmp_path: Path) -> None:
    raw = raw_event(
        EventKind.SOCK_DROP,
        SERVER,
        CLIENT,
        state="LISTEN",
        reason=TCP_REASON_SYN_ACCEPT_QUEUE_FULL,
        backlog=2,
        max_backlog=1,
        syn_queue=0,
        has_trigger=1,
        tcp_flags=0x02,
        owner_pid=42,
        owner_comm="srv",
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, QueueRecord)
    data = record.to_json()
    assert data["what"] == "accept_queue_overflow" and data["reason"] == "SYN_ACCEPT_QUEUE_FULL"
    assert (data["backlog"], data["queued"], data["somaxconn"], data["state"]) == (1, 2, 4096, "LISTEN")
    assert record.text.startswith(
        "the accept queue of 198.18.0.2:80 (netns 0) is full: 2 connections wait for srv[42] to accept() "
        "(listen() backlog 1, net.core.somaxconn 4096)"
    )


def test_accept_queue_overflow_from_a_dropped_ack(tmp_path: Path) -> None:
    raw = raw_event(
        EventKind.SOCK_DROP,
        SERVER,
        CLIENT,
        state="LISTEN",
        reason=2,
        backlog=3,
        max_backlog=2,
        has_trigger=1,
        tcp_flags=0x10,
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, QueueRecord) and record.what == "accept_queue_overflow"
    assert "the handshake's last ACK from 198.18.0.1:41234 was dropped" in record.text


def test_other_listener_drop_and_receive_buffer(tmp_path: Path) -> None:
    listener = enricher(tmp_path).enrich(
        raw_event(EventKind.SOCK_DROP, SERVER, CLIENT, state="LISTEN", reason=2, backlog=0, max_backlog=8)
    )
    assert isinstance(listener, QueueRecord) and listener.what == "listen_drop"
    buffer = enricher(tmp_path).enrich(
        raw_event(
            EventKind.SOCK_DROP,
            SERVER,
            CLIENT,
            state="ESTABLISHED",
            reason=6,
            backlog=9000,
            max_backlog=8192,
            owner_pid=3,
            owner_comm="slow",
        )
    )
    assert isinstance(buffer, QueueRecord) and buffer.what == "receive_buffer"
    assert "is full (9000 of 8192 bytes): slow[3] reads too slowly" in buffer.text


def test_udp_receive_queue_full(tmp_path: Path) -> None:
    raw = raw_event(
        EventKind.RCVQ_FULL, SERVER, None, state="CLOSE", reason=17, backlog=212992, max_backlog=212992
    )
    record = enricher(tmp_path).enrich(raw)
    assert isinstance(record, QueueRecord) and record.what == "receive_buffer"
    assert record.text.startswith("the receive queue of the UDP socket 198.18.0.2:80")


def test_group_means(tmp_path: Path) -> None:
    example = raw_event(EventKind.CONNECT, CLIENT, SERVER, value1=2_000_000)
    group = RawTcpGroup(EventKind.CONNECT, 4, 8_000_000, 0, 0, 5_000_000, example)
    record = enricher(tmp_path).enrich_group(group)
    assert record is not None
    assert record.mean_latency_ms == 2.0 and record.max_latency_ms == 5.0
    assert to_builtins(record)["mean_latency_ms"] == 2.0 and "mean_duration_s" not in to_builtins(record)


def test_netstat_reader(tmp_path: Path) -> None:
    netstat = tmp_path / "netstat"
    netstat.write_text(
        "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 0 5 7\nIpExt: InNoRoutes\nIpExt: 1\n"
    )
    reader = NetstatReader(None, str(netstat))
    assert reader.read() == {"SyncookiesSent": 0, "ListenOverflows": 5, "ListenDrops": 7}
    reader.start()
    netstat.write_text("TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 0 9 12\n")
    assert reader.growth() == {"ListenOverflows": 4, "ListenDrops": 5, "SyncookiesSent": 0}
