"""DNS message parsing (dnspython) of what the kernel copies: whole answers, cut ones, dropped packets."""

from __future__ import annotations

import ipaddress

import dns.flags
import dns.message
import dns.rcode
import dns.rrset

from netsleuth.diagnostics.dns.wire import (
    dns_in_packet,
    name_from_wire,
    parse_answer,
    rcode_name,
    rcode_number,
    type_name,
)


def _answer(name: str, *addresses: str, rcode: int = 0) -> bytes:
    query = dns.message.make_query(name, "A")
    response = dns.message.make_response(query)
    response.set_rcode(dns.rcode.Rcode(rcode))
    if addresses:
        response.answer.append(dns.rrset.from_text_list(name, 60, "IN", "A", list(addresses)))
    return response.to_wire()


def test_whole_answer_gives_question_records_and_rcode() -> None:
    facts = parse_answer(_answer("www.ok.test.", "198.18.0.2", "198.18.0.3"), 0, 0x81, 2)
    assert facts.complete
    assert facts.qname == "www.ok.test"
    assert facts.qtype == 1
    assert facts.rcode == 0
    assert sorted(facts.answers) == ["A 198.18.0.2", "A 198.18.0.3"]  # a set on the server side
    assert facts.answer_count == 2
    assert not facts.truncated


def test_cut_answer_falls_back_to_the_kernel_header() -> None:
    wire = _answer("big.test.", *(f"198.18.1.{i}" for i in range(1, 60)))
    facts = parse_answer(wire[:200], 0, 0x83, 59)
    assert not facts.complete
    assert facts.answers == ()
    assert facts.answer_count == 59
    assert facts.truncated  # TC from the header byte the kernel read


def test_truncated_flag_from_the_message() -> None:
    response = dns.message.make_response(dns.message.make_query("big.test.", "A"))
    response.flags |= dns.flags.TC
    facts = parse_answer(response.to_wire(), 0, 0, 0)
    assert facts.truncated and facts.complete and facts.answer_count == 0


def test_name_from_wire_plain_and_cut() -> None:
    assert name_from_wire(b"\x03api\x03svc\x00\x00\x01") == "api.svc"
    assert name_from_wire(b"\x00") == "."
    assert name_from_wire(b"\x05label\x04cut") == "label..."
    assert name_from_wire(b"") == "?"


def test_rcode_and_type_names() -> None:
    assert rcode_number("nxdomain") == 3
    assert rcode_number("SERVFAIL") == 2
    assert rcode_number("5") == 5
    assert rcode_number("16") is None
    assert rcode_number("bogus") is None
    assert rcode_name(3) == "NXDOMAIN"
    assert type_name(28) == "AAAA"
    assert type_name(65) == "HTTPS"


def _udp_packet(payload: bytes, family: int) -> bytes:
    if family == 4:
        header = bytes([0x45]) + bytes(8) + bytes([17]) + bytes(2)
        header += ipaddress.ip_address("198.18.0.2").packed + ipaddress.ip_address("198.18.0.1").packed
    else:
        header = bytes([0x60]) + bytes(5) + bytes([17, 64]) + bytes(32)
    return header + (53).to_bytes(2, "big") + (40000).to_bytes(2, "big") + bytes(4) + payload


def test_dns_in_a_dropped_packet_v4_and_v6() -> None:
    query = dns.message.make_query("lost.ok.test.", "A")
    query.id = 4242
    for family in (4, 6):
        found = dns_in_packet(_udp_packet(query.to_wire(), family), family, 17)
        assert found is not None
        assert found.id == 4242 and not found.response and found.qname == "lost.ok.test"
    assert dns_in_packet(b"\x45" + bytes(40), 4, 6) is None
