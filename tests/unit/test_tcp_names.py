"""TCP enum names from the running kernel's tracefs formats (here: recorded copies)."""

from __future__ import annotations

from pathlib import Path

from netsleuth.diagnostics.tcp_names import errno_name, errno_text, load_tcp_names

SET_STATE_FORMAT = """name: inet_sock_set_state
print fmt: "family=%s ... oldstate=%s newstate=%s", __print_symbolic(REC->family, { 2, "AF_INET" }, { 10,
"AF_INET6" }), __print_symbolic(REC->oldstate, { 1, "TCP_ESTABLISHED" }, { 2, "TCP_SYN_SENT" }),
__print_symbolic(REC->newstate, { 1, "TCP_ESTABLISHED" }, { 2, "TCP_SYN_SENT" }, { 10, "TCP_LISTEN" })
"""
SEND_RESET_FORMAT = """name: tcp_send_reset
print fmt: "state=%s reason=%s", REC->state ? __print_symbolic(REC->state, { TCP_ESTABLISHED,
"TCP_ESTABLISHED" }) : "UNKNOWN", __print_symbolic(REC->reason, { 0, "NOT_SPECIFIED" }, { 1, "NO_SOCKET" },
{ 25, "MAX" })
"""


def _tracefs(tmp_path: Path, send_reset: bool) -> Path:
    root = tmp_path / "tracing"
    (root / "events" / "sock" / "inet_sock_set_state").mkdir(parents=True)
    (root / "events" / "sock" / "inet_sock_set_state" / "format").write_text(SET_STATE_FORMAT)
    if send_reset:
        (root / "events" / "tcp" / "tcp_send_reset").mkdir(parents=True)
        (root / "events" / "tcp" / "tcp_send_reset" / "format").write_text(SEND_RESET_FORMAT)
    return root


def test_from_tracefs(tmp_path: Path) -> None:
    names = load_tcp_names(tmp_path / "no-btf", (_tracefs(tmp_path, True),))
    assert names.states == {1: "ESTABLISHED", 2: "SYN_SENT", 10: "LISTEN"}
    assert names.reset_reasons == {0: "NOT_SPECIFIED", 1: "NO_SOCKET"}
    assert names.reset_reason(1) == "NO_SOCKET" and names.reset_reason(77) == "UNKNOWN_77"
    assert names.state(None) is None and names.state(99) == "STATE_99"
    assert names.source == "tracefs"


def test_kernel_without_reset_reasons(tmp_path: Path) -> None:
    names = load_tcp_names(tmp_path / "no-btf", (_tracefs(tmp_path, False),))
    assert names.reset_reasons is None and names.reset_reason(1) is None


def test_without_tracefs_states_fall_back_to_the_abi(tmp_path: Path) -> None:
    names = load_tcp_names(tmp_path / "no-btf", (tmp_path / "nothing",))
    assert names.state(10) == "LISTEN" and names.state(12) == "NEW_SYN_RECV" and names.source == "ABI"


def test_errno_names() -> None:
    assert errno_name(111) == "ECONNREFUSED" and errno_text(110) == "ETIMEDOUT (Connection timed out)"
