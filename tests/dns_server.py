"""A small authoritative DNS server for tests, on dnspython: UDP and TCP, with answers chosen by name.

    python -m tests.dns_server --address 198.18.0.2 --address 2001:db8::2 --ready-file PATH

Names (case-insensitive, any qtype):
- `*.ok.test`, `api.svc`: A 198.18.0.2 and AAAA 2001:db8::2;
- `servfail.test`: SERVFAIL; `refused.test`: REFUSED;
- `big.test`: 100 A records, so a UDP answer is truncated (TC) and the resolver retries over TCP;
- `slow.test`: answered after 300 ms;
- anything else: NXDOMAIN.
It counts what it answered by (proto, rcode) and writes the counts as JSON to `--stats-file` on SIGTERM, so a
test can compare netsleuth's counts with what the server really did.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import socketserver
import threading
import time
from pathlib import Path
from types import FrameType

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

_ADDRESS_V4 = "198.18.0.2"
_ADDRESS_V6 = "2001:db8::2"
_UDP_LIMIT = 512  # without EDNS; with EDNS the client's size (dig: 1232)
_COUNTS: dict[str, int] = {}
_LOCK = threading.Lock()


def _count(proto: str, rcode: int) -> None:
    key = f"{proto} {dns.rcode.to_text(dns.rcode.Rcode(rcode))}"
    with _LOCK:
        _COUNTS[key] = _COUNTS.get(key, 0) + 1


def answer(wire: bytes, proto: str) -> bytes | None:
    try:
        query = dns.message.from_wire(wire)
    except Exception:
        return None
    response = dns.message.make_response(query)
    response.flags |= dns.flags.AA
    question = query.question[0]
    name = question.name.to_text(omit_final_dot=True).lower()
    if name == "servfail.test":
        response.set_rcode(dns.rcode.SERVFAIL)
    elif name == "refused.test":
        response.set_rcode(dns.rcode.REFUSED)
    elif name == "big.test":
        addresses = [f"198.18.1.{index}" for index in range(1, 101)]
        response.answer.append(dns.rrset.from_text_list(question.name, 60, "IN", "A", addresses))
    elif name.endswith(".ok.test") or name in ("api.svc", "slow.test"):
        if name == "slow.test":
            time.sleep(0.3)
        if question.rdtype == dns.rdatatype.A:
            response.answer.append(dns.rrset.from_text(question.name, 60, "IN", "A", _ADDRESS_V4))
        elif question.rdtype == dns.rdatatype.AAAA:
            response.answer.append(dns.rrset.from_text(question.name, 60, "IN", "AAAA", _ADDRESS_V6))
    else:
        response.set_rcode(dns.rcode.NXDOMAIN)
    limit = 65535
    if proto == "udp":
        limit = max(_UDP_LIMIT, query.payload) if query.edns >= 0 else _UDP_LIMIT
    try:
        data = response.to_wire(max_size=limit)
    except dns.exception.TooBig:
        response.answer = []
        response.flags |= dns.flags.TC
        data = response.to_wire(max_size=limit)
    _count(proto, response.rcode())
    return data


class _Udp(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data, sock = self.request
        reply = answer(data, "udp")
        if reply is not None:
            sock.sendto(reply, self.client_address)


class _Tcp(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock = self.request
        while True:
            prefix = sock.recv(2, socket.MSG_WAITALL)
            if len(prefix) < 2:
                return
            wire = sock.recv(int.from_bytes(prefix, "big"), socket.MSG_WAITALL)
            reply = answer(wire, "tcp")
            if reply is None:
                return
            sock.sendall(len(reply).to_bytes(2, "big") + reply)


class _Udp6(socketserver.ThreadingUDPServer):
    address_family = socket.AF_INET6


class _Tcp6(socketserver.ThreadingTCPServer):
    address_family = socket.AF_INET6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", action="append", default=[])
    parser.add_argument("--port", type=int, default=53)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--stats-file")
    args = parser.parse_args()
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    servers: list[socketserver.BaseServer] = []
    for address in args.address or [_ADDRESS_V4]:
        six = ":" in address
        udp = (_Udp6 if six else socketserver.ThreadingUDPServer)((address, args.port), _Udp)
        tcp = (_Tcp6 if six else socketserver.ThreadingTCPServer)((address, args.port), _Tcp)
        servers += [udp, tcp]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    Path(args.ready_file).write_text("ready\n")
    stop.wait()
    if args.stats_file:
        with _LOCK:
            Path(args.stats_file).write_text(json.dumps(_COUNTS))


if __name__ == "__main__":
    main()
