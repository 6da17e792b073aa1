"""Doctor rules on scenarios recorded from REAL traffic in namespaces (`netsleuth doctor --netns NS
--record DIR`, made by tests/fixtures/doctor/record_real.py): every counter here is what the kernel counted,
so these check the rules against the kernel's own accounting, not against what the fixture generator
believes it to be."""

from __future__ import annotations

import json

import pytest

from netsleuth.doctor.findings import Finding, Report, Severity
from netsleuth.doctor.model import Snapshot
from netsleuth.doctor.rules import diagnose
from netsleuth.doctor.window import Window
from tests.fixtures.doctor import FIXTURES

RECORDED = FIXTURES / "recorded"


def _replay(name: str) -> Report:
    before, after = (
        Snapshot.from_json(json.loads((RECORDED / name / f"{phase}.json").read_text()))
        for phase in ("before", "after")
    )
    return diagnose(Window(before, after))


def _finding(report: Report, finding_id: str) -> Finding:
    finding = report.finding(finding_id)
    assert finding is not None, [f.id for f in report.findings]
    return finding


def test_every_recording_is_tested() -> None:
    assert {path.name for path in RECORDED.iterdir() if path.is_dir()} == {
        "veth-mtu",
        "udp-rcvbuf",
        "listen-overflow",
    }


def test_veth_mtu_mismatch_with_real_drops() -> None:
    report = _replay("veth-mtu")
    # The kernel counts a datagram dropped at the smaller veth end three ways, and doctor sees all three:
    # the configuration (MTUs), the sender veth's tx_dropped (veth_xmit), and UDP SndbufErrors, because
    # udp_send_skb turns the -ENOBUFS of the failed transmit into SNDBUFERRORS without telling the sender.
    assert {finding.id for finding in report.findings} == {
        "veth-mtu:veth0",
        "tx-drops:veth0",
        "udp-sndbuf-errors",
    }
    mismatch = _finding(report, "veth-mtu:veth0")
    assert mismatch.evidence["mtu"] == 1500 and mismatch.evidence["peer_mtu"] == 1400
    assert mismatch.evidence["peer_same_netns"] is False
    peer_netns = mismatch.evidence["peer_netns"]
    # The fix lowers this end to the peer's MTU, in the namespace that was diagnosed.
    (fix,) = mismatch.fix_commands
    assert fix.endswith("link set dev veth0 mtu 1400")
    assert peer_netns.removesuffix("b") + "a" in fix
    drops = _finding(report, "tx-drops:veth0")
    # Nearly every packet the sender offered was too big for the peer.
    assert drops.evidence["tx_dropped_per_s"] > 1_000
    assert drops.evidence["dropped_per_million"] > 990_000


def test_udp_receive_buffer_overflow() -> None:
    report = _replay("udp-rcvbuf")
    assert [finding.id for finding in report.findings] == ["udp-rcvbuf-errors"]
    finding = report.findings[0]
    assert finding.evidence["RcvbufErrors_per_s"] > 1_000
    assert finding.severity is Severity.CRITICAL
    assert "net.core.rmem_max" in finding.evidence


def test_listen_queue_overflow() -> None:
    report = _replay("listen-overflow")
    assert [finding.id for finding in report.findings] == ["listen-overflow"]
    evidence = report.findings[0].evidence
    # Backlog 1 and never accepting: every further handshake overflowed, and each overflow is also a drop.
    assert evidence["ListenOverflows_per_s"] > 50
    assert evidence["ListenDrops_per_s"] == pytest.approx(evidence["ListenOverflows_per_s"], rel=0.05)


@pytest.mark.parametrize("name", ["veth-mtu", "udp-rcvbuf", "listen-overflow"])
def test_recordings_are_one_second_windows_in_a_namespace(name: str) -> None:
    before, after = (
        json.loads((RECORDED / name / f"{phase}.json").read_text()) for phase in ("before", "after")
    )
    assert 0.9 < after["taken_at"] - before["taken_at"] < 1.5
    assert set(after["links"]) == {"lo", "veth0"}  # a test namespace, never the host's eth0
