"""The plain-words causes of resets, from the facts alone (no kernel)."""

from __future__ import annotations

import dataclasses

import pytest

from netsleuth.diagnostics.tcp.program import Trigger
from netsleuth.diagnostics.tcp.records import ConntrackView
from netsleuth.diagnostics.tcp.reset_causes import (
    ResetFacts,
    classify_abort,
    classify_reset,
    duration_text,
)

SYN, ACK, PSH_ACK = 0x02, 0x10, 0x18

BASE = ResetFacts(
    direction="sent",
    state=None,
    reason=None,
    trigger=None,
    local="198.18.0.2:80",
    remote="198.18.0.1:41234",
    local_port=80,
    netns="netns srv",
    netns_name="srv",
    owner="nginx[42]",
)


def facts(**changes: object) -> ResetFacts:
    return dataclasses.replace(BASE, **changes)  # type: ignore[arg-type]


def test_no_listener() -> None:
    cause = classify_reset(facts(reason="NO_SOCKET", trigger=Trigger(SYN, 7, 0, 0)))
    assert cause.code == "no_listener"
    assert (
        cause.text
        == "nothing listens on 198.18.0.2:80 (netns srv): the kernel refused 198.18.0.1:41234's SYN"
    )
    assert cause.check.startswith("ip netns exec srv ss -ltnp 'sport = :80'")


def test_no_listener_without_kernel_reasons() -> None:
    """Before 6.10 there is no reason: no socket and a SYN say the same."""
    assert classify_reset(facts(trigger=Trigger(SYN, 7, 0, 0))).code == "no_listener"


def test_segment_for_a_connection_the_host_does_not_know() -> None:
    cause = classify_reset(facts(reason="NO_SOCKET", trigger=Trigger(ACK, 7, 9, 0)))
    assert cause.code == "no_socket"
    assert cause.text.startswith("an ACK segment from 198.18.0.1:41234 matched no socket on 198.18.0.2:80")


def test_non_syn_to_listener_reports_conntrack() -> None:
    conntrack = ConntrackView(loaded=True, invalid=12, invalid_delta=3, be_liberal=0)
    cause = classify_reset(
        facts(state="LISTEN", reason="TCP_FLAGS", trigger=Trigger(ACK, 1000, 2000, 0), conntrack=conntrack)
    )
    assert cause.code == "non_syn_to_listener"
    assert "an ACK segment from 198.18.0.1:41234 reached the LISTEN socket on 198.18.0.2:80" in cause.text
    assert "conntrack marked the packet INVALID so NAT/DNAT was skipped" in cause.text
    assert "(conntrack invalid=12 (+3 during this trace), nf_conntrack_tcp_be_liberal=0)" in cause.text
    assert "ip netns exec srv sysctl -w net.netfilter.nf_conntrack_tcp_be_liberal=1" in cause.check


def test_non_syn_to_listener_without_conntrack_rules_out_nat() -> None:
    cause = classify_reset(
        facts(state="LISTEN", trigger=Trigger(PSH_ACK, 1, 2, 10), conntrack=ConntrackView(loaded=False))
    )
    assert cause.code == "non_syn_to_listener"
    assert "conntrack is not loaded there, so NAT is not involved" in cause.text


@pytest.mark.parametrize("reason", ["TCP_ABORT_ON_CLOSE", None])
def test_close_with_unread_data(reason: str | None) -> None:
    cause = classify_reset(facts(state="CLOSE", reason=reason, unread=37))
    assert cause.code == "unread_data"
    assert cause.text.startswith(
        "nginx[42] closed its connection 198.18.0.2:80 -> 198.18.0.1:41234 with 37 bytes it had not read"
    )


def test_linger_zero() -> None:
    cause = classify_reset(facts(state="CLOSE", reason="TCP_STATE", linger_zero=True, unsent=5))
    assert cause.code == "linger_zero"
    assert cause.text == (
        "nginx[42] closed 198.18.0.2:80 -> 198.18.0.1:41234 with SO_LINGER {on, 0}: an abortive close sent "
        "RST and dropped 5 unsent bytes"
    )


def test_listener_closed_with_unaccepted_connection() -> None:
    cause = classify_reset(facts(state="CLOSE", reason="TCP_STATE", accepted=False, side="server"))
    assert cause.code == "listener_closed"
    assert "waited in its accept queue" in cause.text


def test_keepalive_and_memory_aborts() -> None:
    assert classify_reset(facts(state="CLOSE", reason="TCP_KEEPALIVE_TIMEOUT")).code == "keepalive_timeout"
    memory = classify_reset(facts(state="FIN_WAIT1", reason="TCP_ABORT_ON_MEMORY", retransmits=4))
    assert memory.code == "memory_abort" and "after 4 retransmissions" in memory.text


def test_other_active_abort() -> None:
    assert classify_reset(facts(state="CLOSE", reason="TCP_STATE")).code == "abort"


def test_firewall_rule_is_named() -> None:
    rule = "-A INPUT -p tcp -m tcp --dport 80 -j REJECT --reject-with tcp-reset"
    cause = classify_reset(facts(direction="firewall", rule=rule, rule_where="filter/INPUT"))
    assert cause.code == "firewall_reject"
    assert cause.text == (
        f'firewall rule "{rule}" (filter/INPUT, netns srv) answered 198.18.0.1:41234\'s connection to '
        "198.18.0.2:80 with a TCP reset"
    )
    unnamed = classify_reset(facts(direction="firewall"))
    assert unnamed.code == "firewall_reject" and "could not be identified" in unnamed.text


@pytest.mark.parametrize(
    ("state", "code"),
    [
        ("SYN_SENT", "connection_refused"),
        ("ESTABLISHED", "peer_reset"),
        ("CLOSE_WAIT", "peer_reset"),
        ("FIN_WAIT2", "peer_reset_while_closing"),
        ("LAST_ACK", "peer_reset_while_closing"),
    ],
)
def test_received(state: str, code: str) -> None:
    received = facts(
        direction="received", state=state, local="198.18.0.1:41234", remote="198.18.0.2:80", side="client"
    )
    cause = classify_reset(received)
    assert cause.code == code
    assert "198.18.0.2:80" in cause.text and "netsleuth resets --host 198.18.0.2" in cause.check


def test_peer_reset_says_side_age_and_queues() -> None:
    received = facts(
        direction="received", state="ESTABLISHED", side="client", age_seconds=2.5, unsent=100, unread=3
    )
    cause = classify_reset(received)
    assert ", we are the client, 2.5 s after it started" in cause.text
    assert "100 bytes were still unacknowledged, 3 unread" in cause.text


@pytest.mark.parametrize(
    ("reason", "state", "code"),
    [
        ("TCP_INVALID_ACK_SEQUENCE", "SYN_SENT", "out_of_window"),
        ("TCP_RFC7323_PAWS", "ESTABLISHED", "out_of_window"),
        (None, "ESTABLISHED", "out_of_window"),
        ("TCP_TIMEWAIT_SOCKET", "TIME_WAIT", "time_wait"),
        ("INVALID_SYN", "ESTABLISHED", "syn_in_window"),
        ("TCP_ABORT_ON_DATA", "FIN_WAIT2", "data_after_close"),
        ("TCP_FLAGS", "SYN_RECV", "bad_flags"),
        ("NOT_SPECIFIED", "CLOSE_WAIT", "unspecified"),
    ],
)
def test_answers_to_segments(reason: str | None, state: str, code: str) -> None:
    cause = classify_reset(facts(reason=reason, state=state, trigger=Trigger(ACK, 11, 22, 0)))
    assert cause.code == code


def test_out_of_window_text() -> None:
    cause = classify_reset(
        facts(reason="TCP_INVALID_ACK_SEQUENCE", state="SYN_SENT", trigger=Trigger(ACK, 11, 22, 0))
    )
    assert cause.text == (
        "an ACK segment from 198.18.0.1:41234 (seq 11, ack 22) is outside the window of the SYN_SENT "
        "connection "
        "198.18.0.2:80: it acknowledges data this side never sent"
    )


def test_aborts_without_rst() -> None:
    timeout = classify_abort(110, "ESTABLISHED", "198.18.0.1:4", "198.18.0.2:80", 15, "client")
    assert timeout.code == "retransmit_timeout"
    assert "after 15 unanswered retransmissions (ETIMEDOUT): no RST was sent" in timeout.text
    assert "netsleuth drops --host 198.18.0.2" in timeout.check
    assert classify_abort(110, "SYN_SENT", "a:1", "b:2", 6, "client").code == "connect_timeout"
    other = classify_abort(113, "ESTABLISHED", "a:1", "b:2", 0, None)
    assert other.code == "socket_error" and "No route to host" in other.text


@pytest.mark.parametrize(("seconds", "text"), [(0.0000042, "4 us"), (0.0123, "12.3 ms"), (2.5, "2.5 s")])
def test_duration_text(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text
