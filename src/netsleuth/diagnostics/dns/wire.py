"""DNS message bytes the kernel copied, read with dnspython (never parsed by hand here).

An answer may be cut at the copy limit (bpf/dns.h DNS_PAYLOAD_MAX) or be the first segment of a long TCP
answer: then the header the kernel read (id, rcode, flags, answer count) still stands and the records are
left out, marked `complete=False`.
"""

from __future__ import annotations

from dataclasses import dataclass

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype

__all__ = [
    "AnswerFacts",
    "PacketDns",
    "dns_in_packet",
    "name_from_wire",
    "parse_answer",
    "rcode_name",
    "rcode_number",
    "type_name",
]

_HEADER = 12
_UDP = 17


def rcode_name(rcode: int) -> str:
    return dns.rcode.to_text(dns.rcode.Rcode(rcode)) if 0 <= rcode < 16 else str(rcode)


def rcode_number(text: str) -> int | None:
    """`NXDOMAIN`, `servfail` or `3`: the response code, or None when it names none."""
    if text.isdigit():
        return int(text) if int(text) < 16 else None
    try:
        return int(dns.rcode.from_text(text.upper()))
    except dns.rcode.UnknownRcode:
        return None


def type_name(qtype: int) -> str:
    return dns.rdatatype.to_text(dns.rdatatype.RdataType.make(qtype)) if qtype else "?"


def name_from_wire(wire: bytes) -> str:
    """A question name as the kernel kept it (wire labels, maybe cut) as text without the final dot;
    a cut name ends in `...`."""
    labels: list[str] = []
    at = 0
    while at < len(wire):
        length = wire[at]
        if length == 0:
            return ".".join(labels) or "."
        if length > 63 or at + 1 + length > len(wire):
            break
        labels.append(dns.name.Name([wire[at + 1 : at + 1 + length]]).to_text(omit_final_dot=True))
        at += 1 + length
    return ".".join(labels) + "..." if labels else "?"


@dataclass(frozen=True)
class AnswerFacts:
    qname: str | None
    qtype: int | None
    rcode: int
    truncated: bool
    answer_count: int
    answers: tuple[str, ...]  # "A 198.18.0.2", "CNAME x.example." ... (empty when not complete)
    complete: bool


def parse_answer(payload: bytes, rcode: int, flags_hi: int, answer_count: int) -> AnswerFacts:
    """The answer's question and records; `rcode`, `flags_hi` and `answer_count` are the header the kernel
    read, used when the message cannot be read whole."""
    truncated = bool(flags_hi & 0x02)
    try:
        message = dns.message.from_wire(payload, ignore_trailing=True, one_rr_per_rrset=True)
    except (dns.exception.DNSException, ValueError, IndexError):
        return AnswerFacts(None, None, rcode, truncated, answer_count, (), False)
    question = message.question[0] if message.question else None
    answers = tuple(
        f"{dns.rdatatype.to_text(rrset.rdtype)} {rdata.to_text()}"
        for rrset in message.answer
        for rdata in rrset
    )
    return AnswerFacts(
        qname=question.name.to_text(omit_final_dot=True) if question is not None else None,
        qtype=int(question.rdtype) if question is not None else None,
        rcode=int(message.rcode()),
        truncated=bool(message.flags & dns.flags.TC),
        answer_count=len(answers),
        answers=answers,
        complete=True,
    )


@dataclass(frozen=True)
class PacketDns:
    """What a dropped packet's first bytes say about the DNS message it carried."""

    id: int
    response: bool
    qname: str | None


def dns_in_packet(packet: bytes, family: int, l4proto: int) -> PacketDns | None:
    """The DNS header and question of a UDP packet starting at its network header (TCP: None, the message
    start is not known)."""
    if l4proto != _UDP or not packet:
        return None
    if family == 4:
        offset = (packet[0] & 0x0F) * 4 + 8
    elif family == 6:
        offset = 40 + 8
    else:
        return None
    message = packet[offset:]
    if len(message) < _HEADER:
        return None
    qname = None
    if int.from_bytes(message[4:6], "big"):
        text = name_from_wire(message[_HEADER:])
        qname = None if text == "?" else text
    return PacketDns(int.from_bytes(message[0:2], "big"), bool(message[2] & 0x80), qname)
