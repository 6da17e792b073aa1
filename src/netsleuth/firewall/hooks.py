"""Which netfilter hook dropped a packet, read from the kernel stack of the drop.

Every NETFILTER_DROP comes from `nf_hook_slow()` (net/netfilter/core.c: it frees the skb with
SKB_DROP_REASON_NETFILTER_DROP when a hook returns NF_DROP), and `nf_hook_slow()` is reached through the
inline `NF_HOOK*()` wrappers from one call site per hook. So the frame after `nf_hook_slow` names the hook.

Also the small vocabulary the readers and the matcher share: hook names, verdict kinds and the three-valued
truth of a match (`None` is "cannot tell from the packet alone", e.g. conntrack state).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from netsleuth.packet import PacketTuple

__all__ = ["HOOKS", "PacketAtHook", "Truth", "VerdictKind", "all_of", "hook_from_stack"]

# A match's outcome: True/False when the packet tuple decides it, None when it cannot (marks, ct state...).
Truth = bool | None

# What a rule does when it matches; "continue" is a non-terminal rule (LOG, counter, MARK...).
VerdictKind = Literal["accept", "drop", "continue", "jump", "goto", "return"]


def all_of(truths: Iterable[Truth]) -> Truth:
    """Three-valued AND: one False decides; otherwise any None leaves it undecided."""
    result: Truth = True
    for truth in truths:
        if truth is False:
            return False
        if truth is None:
            result = None
    return result


@dataclass(frozen=True)
class PacketAtHook:
    """The dropped packet as the rules saw it. An interface name is None when unknown and "" when the hook
    has none (no input device at output, no output device at prerouting/input)."""

    packet: PacketTuple
    hook: str
    in_ifname: str | None
    out_ifname: str | None


HOOKS = (
    "prerouting",
    "input",
    "forward",
    "output",
    "postrouting",
    "ingress",
    "egress",
    "bridge-prerouting",
    "bridge-input",
    "bridge-forward",
    "bridge-output",
    "bridge-postrouting",
)

# The function that calls NF_HOOK*() → nf_hook_slow(), and the hook it passes. Sources (Linux 6.x):
_CALLERS = {
    # net/ipv4/ip_input.c: NF_HOOK(NFPROTO_IPV4, NF_INET_PRE_ROUTING) in ip_rcv(); NF_HOOK_LIST in
    # ip_sublist_rcv() (called from ip_list_rcv()); ip_rcv_core() only when a symbolizer blames it.
    "ip_rcv": "prerouting",
    "ip_rcv_core": "prerouting",
    "ip_list_rcv": "prerouting",
    "ip_sublist_rcv": "prerouting",
    # net/ipv6/ip6_input.c: the same for IPv6.
    "ipv6_rcv": "prerouting",
    "ipv6_list_rcv": "prerouting",
    "ip6_sublist_rcv": "prerouting",
    # net/ipv4/xfrm4_input.c, net/ipv6/xfrm6_input.c: decapsulated IPsec packets re-enter PRE_ROUTING.
    "xfrm4_transport_finish": "prerouting",
    "xfrm6_transport_finish": "prerouting",
    # net/ipv4/ip_input.c ip_local_deliver(), net/ipv6/ip6_input.c ip6_input(): NF_INET_LOCAL_IN.
    "ip_local_deliver": "input",
    "ip6_input": "input",
    # net/ipv4/ip_forward.c ip_forward(), net/ipv6/ip6_output.c ip6_forward(): NF_INET_FORWARD; the
    # multicast routers (net/ipv4/ipmr.c, net/ipv6/ip6mr.c) forward through the same hook.
    "ip_forward": "forward",
    "ip6_forward": "forward",
    "ipmr_queue_xmit": "forward",
    "ipmr_queue_fwd_xmit": "forward",
    "ip6mr_forward2": "forward",
    # net/ipv4/ip_output.c __ip_local_out() (ip_local_out() when it is not inlined), net/ipv6/output_core.c
    # __ip6_local_out(), net/ipv6/ip6_output.c ip6_xmit() (TCP over IPv6), raw sockets with IP_HDRINCL
    # (net/ipv4/raw.c, net/ipv6/raw.c), and IPv6 neighbour discovery / MLD (net/ipv6/ndisc.c, mcast.c):
    # NF_INET_LOCAL_OUT.
    "__ip_local_out": "output",
    "ip_local_out": "output",
    "__ip6_local_out": "output",
    "ip6_local_out": "output",
    "ip6_xmit": "output",
    "raw_send_hdrinc": "output",
    "rawv6_send_hdrinc": "output",
    "ndisc_send_skb": "output",
    "mld_sendpack": "output",
    "igmp6_send": "output",
    # net/ipv4/ip_output.c ip_output()/ip_mc_output(), net/ipv6/ip6_output.c ip6_output(), and IPsec output
    # (net/ipv4/xfrm4_output.c, net/ipv6/xfrm6_output.c): NF_INET_POST_ROUTING. ip_finish_output is listed
    # for symbolizers that attribute the inlined NF_HOOK_COND to it.
    "ip_output": "postrouting",
    "ip_mc_output": "postrouting",
    "ip_finish_output": "postrouting",
    "ip6_output": "postrouting",
    "ip6_finish_output": "postrouting",
    "xfrm4_output": "postrouting",
    "xfrm6_output": "postrouting",
    # net/core/dev.c: nf_hook_ingress() is inlined into __netif_receive_skb_core(), nf_hook_egress() into
    # __dev_queue_xmit(); they run the netdev (and inet ingress) chains.
    "__netif_receive_skb_core": "ingress",
    "__dev_queue_xmit": "egress",
    # net/bridge/br_netfilter_hooks.c: br_netfilter hands bridged IP packets to the IPv4/IPv6 hooks
    # (NF_HOOK(NFPROTO_IPV4 or NFPROTO_IPV6, NF_INET_*)), so iptables and ip/ip6/inet chains run there; its
    # *_finish() functions then run the remaining bridge-family hooks through br_nf_hook_thresh().
    "br_nf_pre_routing": "prerouting",
    "br_nf_forward_ip": "forward",
    "br_nf_forward": "forward",
    "br_nf_post_routing": "postrouting",
    "br_nf_pre_routing_finish": "bridge-prerouting",
    "br_nf_pre_routing_finish_ipv6": "bridge-prerouting",
    "br_nf_pre_routing_finish_bridge": "bridge-prerouting",
    "br_nf_forward_finish": "bridge-forward",
    # net/bridge/br_input.c, br_forward.c: NF_HOOK(NFPROTO_BRIDGE, NF_BR_*). br_handle_frame() only on
    # kernels before nf_hook_bridge_pre() (which frees without the NETFILTER_DROP reason).
    "br_handle_frame": "bridge-prerouting",
    "br_pass_frame_up": "bridge-input",
    "br_forward_finish": "bridge-postrouting",
}

# __br_forward() (net/bridge/br_forward.c) passes NF_BR_LOCAL_OUT for frames the bridge device itself
# sends (br_dev_xmit() is then further down the stack) and NF_BR_FORWARD otherwise.
_BRIDGE_FORWARD_OR_OUT = "__br_forward"

# Output-path functions that call ip_local_out()/ip6_local_out() directly: when those are inlined away,
# the first named frame is one of these. Only output hints: input-path functions also sit below output
# hooks (a TCP reset sent while receiving), so they would mislead.
_OUTPUT_HINTS = frozenset(
    {
        "ip_send_skb",
        "ip_push_pending_frames",
        "__ip_queue_xmit",
        "ip_queue_xmit",
        "ip_build_and_send_pkt",
        "udp_send_skb",
        "raw_sendmsg",
        "icmp_push_reply",
        "ip6_send_skb",
        "ip6_push_pending_frames",
        "inet6_csk_xmit",
        "udp_v6_send_skb",
        "rawv6_sendmsg",
        "icmpv6_push_pending_frames",
        "__tcp_transmit_skb",
        "tcp_transmit_skb",
    }
)

# Wrappers between nf_hook_slow() and the real caller when they show up as frames (a symbolizer that
# expands inlines, or a kernel built without inlining them).
_PASS_THROUGH = frozenset(
    {
        "nf_hook",
        "NF_HOOK",
        "NF_HOOK_COND",
        "NF_HOOK_LIST",
        "nf_hook_slow_list",
        "nf_hook_thresh",
        "br_nf_hook_thresh",
        "nf_hook_ingress",
        "nf_hook_egress",
        "nf_ingress",
        "nf_egress",
    }
)

# How far past nf_hook_slow to look when the direct caller is unknown (inlined or renamed).
_MAX_DEPTH = 4


def _function_name(frame: str) -> str:
    """`ip_rcv+0x1d/0xc0 [kernel]` or `ip_sublist_rcv.constprop.0` → the bare function name."""
    name = frame.strip().split(" ", 1)[0].split("+", 1)[0]
    return name.split(".", 1)[0]


def hook_from_stack(frames: Sequence[str], family: int) -> str | None:
    """The hook (one of `HOOKS`) that ran the dropping rule, from the drop's stack (innermost frame first).

    `family` is the packet's (4, 6, or 0 when not IP): a non-IP packet cannot have been dropped by an
    IP-family hook, so only bridge/ingress/egress answers are accepted for it. None when the stack does not
    go through nf_hook_slow or its caller is unknown.
    """
    names = [_function_name(frame) for frame in frames]
    try:
        start = names.index("nf_hook_slow") + 1
    except ValueError:
        return None
    callers = [name for name in names[start:] if name not in _PASS_THROUGH]
    hook: str | None = None
    for depth, name in enumerate(callers[:_MAX_DEPTH]):
        if name == _BRIDGE_FORWARD_OR_OUT:
            hook = "bridge-output" if "br_dev_xmit" in callers[depth:] else "bridge-forward"
        elif name in _CALLERS:
            hook = _CALLERS[name]
        elif name in _OUTPUT_HINTS:
            hook = "output"
        if hook is not None:
            break
    if hook is None:
        return None
    ip_family_hook = not hook.startswith("bridge-") and hook not in ("ingress", "egress")
    if ip_family_hook and family not in (4, 6):
        return None
    return hook
