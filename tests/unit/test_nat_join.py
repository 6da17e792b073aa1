"""nat_join on recorded conntrack entries (tests/fixtures/conntrack) and the ctnetlink decoder behind them."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from pyroute2.netlink.nfnetlink.nfctsocket import nfct_msg

from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple, NatIndex, status_names
from netsleuth.kernel.conntrack import entry_from_message

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "conntrack" / "ctnetlink_dump_lb.json"
CLIENT = "198.18.70.1"


def _recorded() -> list[ConntrackEntry]:
    entries = []
    for raw in json.loads(FIXTURE.read_text())["messages"]:
        entry = entry_from_message(base64.b64decode(raw["message"]), f"netns {raw['netns']}")
        assert entry is not None
        entries.append(entry)
    return entries


def test_our_decoder_agrees_with_pyroute2s() -> None:
    """The hand parser (fast) against pyroute2's generic nfct_msg decoder (slow, independent)."""
    for raw, entry in zip(json.loads(FIXTURE.read_text())["messages"], _recorded(), strict=True):
        message = nfct_msg(base64.b64decode(raw["message"]))
        message.decode()
        for name, flow in (("CTA_TUPLE_ORIG", entry.original), ("CTA_TUPLE_REPLY", entry.reply)):
            tuple_attr = message.get_attr(name)
            ip, proto = tuple_attr.get_attr("CTA_TUPLE_IP"), tuple_attr.get_attr("CTA_TUPLE_PROTO")
            assert (ip.get_attr("CTA_IP_V4_SRC"), proto.get_attr("CTA_PROTO_SRC_PORT")) == flow.src
            assert (ip.get_attr("CTA_IP_V4_DST"), proto.get_attr("CTA_PROTO_DST_PORT")) == flow.dst
        assert status_names(message.get_attr("CTA_STATUS")) == entry.status
        assert message.get_attr("CTA_MARK") == entry.mark


def test_truncated_or_foreign_messages_decode_to_nothing() -> None:
    first = base64.b64decode(json.loads(FIXTURE.read_text())["messages"][0]["message"])
    assert entry_from_message(first[:20], "x") is None
    assert entry_from_message(first[:40], "x") is None  # cut inside the first tuple


def tcp(src: str, sport: int, dst: str, dport: int) -> FlowTuple:
    return FlowTuple("tcp", (src, sport), (dst, dport))


def test_decoder_reads_tuples_state_and_status_from_raw_ctnetlink() -> None:
    dnat, syn = _recorded()[1], _recorded()[2]
    assert dnat.where == "netns lb" and dnat.state == "SYN_SENT" and dnat.family == 4
    assert dnat.original == tcp(CLIENT, 58394, "198.18.70.2", 80)
    assert dnat.reply == tcp("198.18.71.2", 8080, CLIENT, 58394)
    assert dnat.status == ("CONFIRMED", "DST_NAT", "SRC_NAT_DONE", "DST_NAT_DONE")
    assert dnat.dnat and not dnat.snat and syn.original.src[1] == 48128
    both = _recorded()[0]  # DNAT to 9090 and masquerade on the way out
    assert both.dnat and both.snat and both.state == "ESTABLISHED"
    assert both.translated == tcp("198.18.71.1", 41350, "198.18.71.2", 9090)


def test_a_dropped_syn_after_dnat_is_placed_on_its_connection() -> None:
    index = NatIndex(_recorded())
    placement = index.place(tcp(CLIENT, 58394, "198.18.71.2", 8080))  # what the server's INPUT dropped
    assert placement is not None and placement.position == 1 and not placement.reply
    assert placement.path.original == tcp(CLIENT, 58394, "198.18.70.2", 80)
    assert placement.path.text() == "DNAT 198.18.70.2:80 → 198.18.71.2:8080 in netns lb"
    # Another connection through the same DNAT is its own flow.
    other = index.place(tcp(CLIENT, 48128, "198.18.71.2", 8080))
    assert other is not None and other.path.original.src == (CLIENT, 48128)


def test_replies_both_sides_of_the_nat_and_snat() -> None:
    index = NatIndex(_recorded())
    answer = index.place(tcp("198.18.71.2", 9090, "198.18.71.1", 41350))  # the server's reply, before un-NAT
    assert answer is not None and answer.reply and answer.position == 1
    assert answer.path.original == tcp(CLIENT, 41350, "198.18.70.2", 90)
    assert answer.path.hops[0].kind == "DNAT+SNAT"
    assert answer.path.text() == (
        "DNAT 198.18.70.2:90 → 198.18.71.2:9090, SNAT 198.18.70.1:41350 → 198.18.71.1:41350 in netns lb"
    )
    # As the client sees it: untranslated, position 0 on the same path.
    seen = index.place(tcp("198.18.70.2", 90, CLIENT, 41350))
    assert seen is not None and seen.reply and seen.position == 0 and not seen.translated
    assert index.place(tcp(CLIENT, 1, "198.18.70.2", 22)) is None  # no NAT touches it


def test_chains_of_hops_across_hosts_from_fleet_records() -> None:
    """Two load balancers in a row on two hosts: the records as agents ship them (docs/fleet-api.md)."""
    first = ConntrackEntry(
        "host a netns lb1",
        tcp("198.18.0.2", 40000, "198.18.1.10", 80),
        tcp("198.18.2.10", 80, "198.18.0.2", 40000),
    )
    second = ConntrackEntry(
        "host b netns lb2",
        tcp("198.18.0.2", 40000, "198.18.2.10", 80),
        tcp("198.18.3.7", 8080, "198.18.9.1", 61000),
    )
    plain = ConntrackEntry(
        "host c", tcp("198.18.9.1", 61000, "198.18.3.7", 8080), tcp("198.18.3.7", 8080, "198.18.9.1", 61000)
    )
    records = [entry.to_record(entry.where, "2026-11-23T09:00:00+00:00") for entry in (second, plain, first)]
    entries = [ConntrackEntry.from_record(record, where=str(record["netns"])) for record in records]
    index = NatIndex(entry for entry in entries if entry is not None)
    assert len(index) == 2  # the plain entry translates nothing
    placement = index.place(tcp("198.18.9.1", 61000, "198.18.3.7", 8080))  # seen at the server
    assert placement is not None and placement.position == 2
    path = placement.path
    assert path.original == first.original and [hop.where for hop in path.hops] == [
        "host a netns lb1",
        "host b netns lb2",
    ]
    assert path.text(1) == "DNAT 198.18.1.10:80 → 198.18.2.10:80 in host a netns lb1"
    assert path.forms[-1] == tcp("198.18.9.1", 61000, "198.18.3.7", 8080)
    middle = index.place(tcp("198.18.0.2", 40000, "198.18.2.10", 80))
    assert middle is not None and middle.position == 1


def test_cycles_and_incomplete_records_do_not_hang_or_crash() -> None:
    loop_a = ConntrackEntry("x", tcp("198.18.0.1", 1, "198.18.0.2", 2), tcp("198.18.0.3", 3, "198.18.0.1", 1))
    loop_b = ConntrackEntry("y", tcp("198.18.0.1", 1, "198.18.0.3", 3), tcp("198.18.0.2", 2, "198.18.0.1", 1))
    index = NatIndex([loop_a, loop_b])
    assert index.place(tcp("198.18.0.1", 1, "198.18.0.3", 3)) is not None
    assert ConntrackEntry.from_record({"orig": {"src": "198.18.0.1"}, "reply": {}}, where="x") is None


@pytest.mark.parametrize(
    ("status", "names"), [(0x1A8, ("CONFIRMED", "DST_NAT", "SRC_NAT_DONE", "DST_NAT_DONE")), (0, ())]
)
def test_status_names(status: int, names: tuple[str, ...]) -> None:
    assert status_names(status) == names
