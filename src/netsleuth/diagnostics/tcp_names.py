"""Names of the running kernel's TCP enums: socket states, reset reasons, congestion states.

Read at run time, never from a table that could be another kernel's:
- reset reasons: `enum sk_rst_reason` (include/net/rstreason.h, 6.10+) from /sys/kernel/btf/vmlinux, else
  the tcp:tcp_send_reset tracefs format's __print_symbolic list; kernels before 6.10 have none;
- congestion states: `enum tcp_ca_state` (include/uapi/linux/tcp.h) from BTF;
- socket states: an anonymous enum in include/net/tcp_states.h, which BTF cannot look up by name, so they come
  from the sock:inet_sock_set_state tracefs format; when tracefs is not mounted, from the values /proc/net/tcp
  and inet_diag have exported unchanged since Linux 2.6 (they are user-visible ABI, unlike the reasons).
"""

from __future__ import annotations

import errno
import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "TcpNames",
    "errno_name",
    "errno_number",
    "errno_text",
    "load_tcp_names",
]

_TRACEFS_ROOTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
_VMLINUX = Path("/sys/kernel/btf/vmlinux")
_SYMBOLIC = re.compile(r"\{\s*(\d+)\s*,\s*\"([A-Za-z0-9_]+)\"\s*\}")
# The ABI values of include/net/tcp_states.h, as /proc/net/tcp's `st` column shows them.
_ABI_STATES = {
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


@dataclass(frozen=True)
class TcpNames:
    states: dict[int, str]
    reset_reasons: dict[int, str] | None  # None: this kernel's tcp_send_reset reports no reason
    ca_states: dict[int, str]
    source: str

    def state(self, value: int | None) -> str | None:
        if value is None:
            return None
        return self.states.get(value, f"STATE_{value}")

    def reset_reason(self, value: int) -> str | None:
        if self.reset_reasons is None:
            return None
        return self.reset_reasons.get(value, f"UNKNOWN_{value}")

    def ca_state(self, value: int) -> str:
        return self.ca_states.get(value, str(value))


def errno_name(number: int) -> str:
    """`ECONNREFUSED`, or the number when the platform has no name for it."""
    return errno.errorcode.get(number, str(number))


def errno_number(name: str) -> int:
    """The number of an errno name as `errno_name` gives it (a record's `errno`): `ECONNREFUSED` -> 111."""
    number = getattr(errno, name, None)
    return number if isinstance(number, int) else int(name)


def errno_text(number: int) -> str:
    """`ECONNREFUSED (Connection refused)`."""
    return f"{errno_name(number)} ({os.strerror(number)})"


def _tracefs_symbols(relative: str, field: str, roots: Iterable[Path]) -> dict[int, str] | None:
    """The {value: name} list a tracepoint's print format gives for `REC->field`."""
    for root in roots:
        try:
            text = (root / "events" / relative / "format").read_text()
        except OSError:
            continue
        marker = f"__print_symbolic(REC->{field},"
        start = text.find(marker)
        if start < 0:
            return None
        end = text.find(")", start)
        pairs = _SYMBOLIC.findall(text[start:end])
        return {int(value): name for value, name in pairs} if pairs else None
    return None


def _strip(prefix: str, members: dict[str, int]) -> dict[int, str]:
    return {value: name.removeprefix(prefix) for name, value in members.items() if not name.endswith("_MAX")}


@functools.cache
def load_tcp_names(btf_path: Path = _VMLINUX, tracefs_roots: tuple[Path, ...] = _TRACEFS_ROOTS) -> TcpNames:
    reset_reasons: dict[int, str] | None = None
    ca_states: dict[int, str] = {}
    sources = []
    if btf_path.exists():
        from netsleuth.bpf.btf import Btf

        with Btf.vmlinux(btf_path) as btf:
            members = btf.enum("sk_rst_reason")
            if members:
                reset_reasons = _strip("SK_RST_REASON_", members)
                sources.append("BTF")
            ca_states = _strip("TCP_CA_", btf.enum("tcp_ca_state") or {})
    if reset_reasons is None:
        traced = _tracefs_symbols("tcp/tcp_send_reset", "reason", tracefs_roots)
        if traced:
            reset_reasons = {value: name for value, name in traced.items() if name != "MAX"}
            sources.append("tracefs")
    traced_states = _tracefs_symbols("sock/inet_sock_set_state", "newstate", tracefs_roots)
    if traced_states:
        states = {value: name.removeprefix("TCP_") for value, name in traced_states.items()}
    else:
        states = dict(_ABI_STATES)
    return TcpNames(states, reset_reasons, ca_states, "+".join(sources) or "ABI")
