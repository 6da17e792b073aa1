"""The cause catalogue: one entry per code, templates that fill, and one listen-overflow wherever it is seen
(doctor finding, drop verdict, full-listener verdict, `tcp queues` record)."""

from __future__ import annotations

import string
from pathlib import Path

import pytest

from netsleuth._generated.tcp_abi import TCP_REASON_SYN_ACCEPT_QUEUE_FULL, EventKind
from netsleuth.diagnose.listeners import FullListener, listener_verdicts
from netsleuth.diagnostics.attribution import Owner
from netsleuth.diagnostics.causes import CATALOGUE, cause
from netsleuth.diagnostics.drops.enrich import drop_record
from netsleuth.diagnostics.drops.records import DropGroup
from netsleuth.diagnostics.drops.rules import drop_verdicts
from netsleuth.diagnostics.tcp.events import TcpEventEnricher
from netsleuth.diagnostics.tcp.records import QueueRecord
from netsleuth.diagnostics.tcp.reset_causes import ResetCause
from netsleuth.doctor.rules import diagnose
from netsleuth.kernel.reasons import DropReasons
from netsleuth.packet import PacketTuple
from netsleuth.spec.diagnose import Window
from tests.fixtures.doctor import scenario_window
from tests.unit.tcp_fakes import fake_context, raw_event

# The facts consumers fill templates with; a template naming anything else would fail at run time.
FACTS = {
    # doctor findings and diagnose verdicts
    *("somaxconn", "port", "comm", "rmem_max", "default_key", "max_key", "backlog", "device"),
    # every reset (reset_causes._explained) and the cases' own
    *("local", "remote", "netns", "owner", "prefix", "state", "socket_state", "segment", "a_segment"),
    *("rejecter", "unidentified", "side", "age", "peer_check", "remote_port", "queued", "evidence"),
    *("unread", "retried", "dropped", "known_state", "numbers", "because", "reason"),
    # aborts (reset_causes.classify_abort)
    *("remote_host", "retransmits", "error", "role"),
}


def _fields(template: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(template) if field}


@pytest.mark.parametrize("code", sorted(CATALOGUE))
def test_entry_templates_name_only_known_facts(code: str) -> None:
    entry = cause(code)
    assert entry.code == code and entry.title
    for template in (entry.summary, entry.explanation, *entry.checks, *entry.fixes, entry.remedy):
        assert _fields(template) <= FACTS, (code, template)
        template.format(**dict.fromkeys(FACTS, "X"))  # no stray braces


def test_a_record_cannot_carry_a_code_outside_the_catalogue() -> None:
    with pytest.raises(KeyError):
        ResetCause("made_up", "text", "check")


def _overflow_group() -> DropGroup:
    example = drop_record(
        time=0.0,
        reason="TCP_LISTEN_OVERFLOW",
        reason_code=0,
        location="tcp_v4_syn_recv_sock+0x9a",
        packet=PacketTuple(4, 6, "198.18.0.1", "198.18.0.2", 40000, 80, 0x10, length=60),
        owner=Owner(42, "nginx", "socket"),
        netns=4026532999,
        netns_name="srv",
        ifname="veth0",
        ifindex=2,
        cpu=0,
        sk_state="LISTEN",
        stack=None,
        source=None,
        netfilter=None,
    )
    return DropGroup(
        reason=example.reason,
        location=example.location,
        netns=example.netns,
        netns_name="srv",
        count=7,
        bytes=420,
        example=example,
    )


def test_listen_overflow_reads_the_same_everywhere(tmp_path: Path) -> None:
    entry = cause("listen_overflow")
    context = Window(seconds=10.0, sysctls={"net.core.somaxconn": "4096"})
    [dropped] = drop_verdicts([_overflow_group()], context)
    [listener] = listener_verdicts([FullListener("0.0.0.0", 80, 3, 1, 0)], 7, "4096", "srv")
    [finding] = diagnose(scenario_window("listen-overflow", tmp_path)).findings
    enricher = TcpEventEnricher(fake_context(tmp_path), DropReasons({}, "fixture"))
    raw = raw_event(
        EventKind.SOCK_DROP,
        ("198.18.0.2", 80),
        ("198.18.0.1", 41234),
        state="LISTEN",
        reason=TCP_REASON_SYN_ACCEPT_QUEUE_FULL,
        backlog=2,
        max_backlog=1,
    )
    record = enricher.enrich(raw)
    assert isinstance(record, QueueRecord)

    assert dropped.cause_code == listener.cause_code == finding.cause_code == record.cause_code == entry.code
    assert dropped.to_json()["cause_code"] == finding.to_json()["cause_code"] == "listen_overflow"
    assert record.to_json()["cause_code"] == "listen_overflow"
    assert entry.summary in dropped.cause and entry.summary in listener.cause
    assert dropped.fix[0] == entry.fixes_for(comm="nginx", somaxconn="4096")[0]
    assert dropped.fix[1] == listener.fix[1]  # the same sysctl advice, from one template
    assert dropped.fix[1].endswith("ip netns exec srv sysctl -w net.core.somaxconn=8192")  # as doctor's fix
    assert finding.explanation == entry.explain(somaxconn=finding.evidence["somaxconn"])
    assert entry.remedy in record.check and "ss -ltn 'sport = :80'" in record.check


def _doctor_rule_ids() -> set[str]:
    """The rule part of every finding id the doctor's rules make, read from their source (`id="rule"`,
    `id=f"rule:{subject}"`, and the two spelled with a direction)."""
    import re

    rules = Path(__file__).resolve().parents[2] / "src" / "netsleuth" / "doctor" / "rules"
    found: set[str] = set()
    for source in rules.glob("*.py"):
        for literal in re.findall(r'\bid=f?"([^"]+)"', source.read_text()):
            prefix = literal.split(":", 1)[0]
            prefix = prefix.replace("{'rcvbuf' if direction == 'receive' else 'sndbuf'}", "{kind}")
            for direction, kind in (("rx", "rcvbuf"), ("tx", "sndbuf")):
                found.add(prefix.replace("{direction}", direction).replace("{kind}", kind))
    return found


def test_every_doctor_rule_has_a_catalogued_code_as_a_verdict() -> None:
    from netsleuth.diagnose.correlate import PATH_CAUSE_CODES

    rules = _doctor_rule_ids()
    assert "gro-off" in rules and "udp-sndbuf-errors" in rules and "tx-errors" in rules  # the scan works
    assert rules <= set(PATH_CAUSE_CODES), sorted(rules - set(PATH_CAUSE_CODES))
    assert set(PATH_CAUSE_CODES.values()) <= set(CATALOGUE)


def test_codes_are_snake_case() -> None:
    assert all(code == code.lower() and "-" not in code and " " not in code for code in CATALOGUE)
