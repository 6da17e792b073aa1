"""Hand-made tcp events and a context that reads nothing from the machine, for the tcp-family unit tests."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from netsleuth._generated.tcp_abi import EventKind, TcpEventC
from netsleuth.diagnostics.attribution import Owner
from netsleuth.diagnostics.drops.enrich import drop_record as make_drop_record
from netsleuth.diagnostics.drops.records import DropRecord
from netsleuth.diagnostics.tcp.program import RawTcpEvent, decode_event
from netsleuth.diagnostics.tcp_names import TcpNames
from netsleuth.kernel.context import KernelContext
from netsleuth.kernel.kallsyms import Kallsyms
from netsleuth.kernel.netns import NetnsNames
from netsleuth.kernel.process import SocketOwners
from netsleuth.packet import PacketTuple

__all__ = ["NAMES", "FakeClock", "drop_record", "fake_context", "raw_event"]

STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
    12: "NEW_SYN_RECV",
}
# The 6.12 numbering of include/net/rstreason.h (a fixture: real runs read the running kernel's).
RESET_REASONS = {
    0: "NOT_SPECIFIED",
    1: "NO_SOCKET",
    2: "TCP_INVALID_ACK_SEQUENCE",
    6: "TCP_FLAGS",
    9: "TCP_TIMEWAIT_SOCKET",
    11: "TCP_ABORT_ON_CLOSE",
    14: "TCP_STATE",
    15: "TCP_KEEPALIVE_TIMEOUT",
}
NAMES = TcpNames(STATES, RESET_REASONS, {0: "Open", 3: "Recovery", 4: "Loss"}, "fixture")
STATE = {name: value for value, name in STATES.items()}
REASON = {name: value for value, name in RESET_REASONS.items()}
KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81100000 T bpf_trace_run2
ffffffff81100100 T __bpf_trace_net_dev_queue
ffffffff81200000 T __dev_queue_xmit
ffffffff81300000 T nf_send_reset
ffffffff81400000 T reject_tg
ffffffff81500000 T ipt_do_table
ffffffff81600000 T nf_hook_slow
ffffffff81700000 T ip_local_deliver
ffffffff81800000 T ip_rcv
ffffffff81900000 T _etext
"""


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def fake_context(tmp_path: Path) -> KernelContext:
    kallsyms_file = tmp_path / "kallsyms"
    kallsyms_file.write_text(KALLSYMS)
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "netns").mkdir(exist_ok=True)
    (tmp_path / "netns" / "srv").touch()
    netns = NetnsNames(proc_root=str(tmp_path / "proc"), netns_dirs=[str(tmp_path / "netns")])
    return KernelContext(
        NAMES, Kallsyms(str(kallsyms_file)), netns, SocketOwners(proc_root=str(tmp_path / "proc"))
    )


def _packed(address: str | None) -> bytes:
    if address is None:
        return bytes(16)
    return ipaddress.ip_address(address).packed.ljust(16, b"\0")


def raw_event(
    kind: EventKind,
    local: tuple[str, int] | None = None,
    remote: tuple[str, int] | None = None,
    *,
    state: str | None = None,
    old_state: str | None = None,
    frames: tuple[int, ...] = (),
    **fields: Any,
) -> RawTcpEvent:
    """A tcp_event as the kernel would send it, decoded the way the session decodes it."""
    event = TcpEventC()
    event.kind = kind
    event.state = STATE[state] if state else 0xFF
    event.old_state = STATE[old_state] if old_state else 0xFF
    address = (local or remote or ("0.0.0.0", 0))[0]
    event.family = 6 if ":" in address else 4
    if local is not None:
        event.laddr[:] = _packed(local[0])
        event.lport = local[1]
    if remote is not None:
        event.raddr[:] = _packed(remote[0])
        event.rport = remote[1]
    for name, value in fields.items():
        if name == "comm" or name == "owner_comm" or name == "ifname":
            value = value.encode()
        setattr(event, name, value)
    return decode_event(event, frames)


def drop_record(
    source: tuple[str, int],
    destination: tuple[str, int],
    flags: int,
    *,
    reason: str = "NETFILTER_DROP",
    rule: str | None = None,
    netns: int = 4026532999,
    netns_name: str | None = "srv",
    time: float = 1.0,
) -> DropRecord:
    netfilter = {"hook": "input", "table": "filter", "chain": "INPUT", "rule": rule} if rule else None
    return make_drop_record(
        time=time,
        reason=reason,
        reason_code=6,
        location="nf_hook_slow+0x9a",
        packet=PacketTuple(4, 6, source[0], destination[0], source[1], destination[1], flags, length=60),
        owner=Owner(None, "kernel", "kernel"),
        netns=netns,
        netns_name=netns_name,
        ifname="veth0",
        ifindex=2,
        cpu=0,
        sk_state=None,
        stack=None,
        source=None,
        netfilter=netfilter,
    )
