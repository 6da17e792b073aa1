"""The location -> reason table for kernels without drop reasons (netsleuth.kernel.inferred_reasons)."""

from __future__ import annotations

import pytest

from netsleuth.kernel.inferred_reasons import INFERRED_REASONS, UNKNOWN_REASON, infer_reason
from netsleuth.kernel.reasons import load_drop_reasons


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("tcp_v4_rcv+0x7a/0x1100", "NO_SOCKET"),
        ("tcp_v4_rcv", "NO_SOCKET"),
        ("__udp6_lib_rcv+0x3c1", "NO_SOCKET"),
        ("nf_hook_slow+0x44/0xc0", "NETFILTER_DROP"),
        ("udp_queue_rcv_one_skb.isra.0+0x12", "SOCKET_RCVBUFF"),  # a compiler clone of the function
        ("enqueue_to_backlog+0x1f", "CPU_BACKLOG"),
        ("some_driver_rx+0x10", UNKNOWN_REASON),
        ("0xffffffffc0001234", UNKNOWN_REASON),
    ],
)
def test_reason_from_location(location: str, reason: str) -> None:
    assert infer_reason(location) == reason


def test_every_inferred_reason_is_a_reason_this_kernel_names() -> None:
    # The names must be the kernel's own (include/net/dropreason-core.h), so an inferred drop groups and
    # reads like one the kernel named.
    reasons = load_drop_reasons()
    assert all(reasons.value(name) is not None for name in {*INFERRED_REASONS.values(), UNKNOWN_REASON})
