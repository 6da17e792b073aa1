"""Drop reasons inferred from where a packet was freed, for kernels whose skb:kfree_skb has no `reason`.

`reason` came to skb:kfree_skb in Linux 5.17 ("net: skb: introduce kfree_skb_reason()").
Before it (Ubuntu 22.04's 5.15, Amazon Linux 2's 5.10, Ubuntu 20.04's 5.4) the tracepoint passes only the
skb and `location`, the return address of the kfree_skb() call. The function holding that address is where
the kernel decided to drop, and for the functions below one cause dominates, so the reason the later kernels
name there is inferred from it. An inferred reason is a guess from the code location, not the kernel's word:
every output built from it must say so (netsleuth marks it `inferred`).

Each entry names the kernel source that frees the packet in 5.4-5.16; the names are those of
`enum skb_drop_reason` (include/net/dropreason-core.h), which later kernels report at the same places.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["INFERRED_REASONS", "UNKNOWN_REASON", "infer_reason"]

# For a location outside the table: what kfree_skb() itself passes since 5.17 (kfree_skb_reason(skb,
# SKB_DROP_REASON_NOT_SPECIFIED)), the honest answer for a free that names no cause.
UNKNOWN_REASON = "NOT_SPECIFIED"

INFERRED_REASONS: MappingProxyType[str, str] = MappingProxyType(
    {
        # net/netfilter/core.c nf_hook_slow(): `case NF_DROP: kfree_skb(skb);` - a rule's DROP verdict.
        "nf_hook_slow": "NETFILTER_DROP",
        # net/netfilter/nf_tables_core.c nft_do_chain(): newer kernels free a packet an nftables rule
        # dropped right there (NF_DROP_REASON), which is where this 6.18 reports NETFILTER_DROP.
        "nft_do_chain": "NETFILTER_DROP",
        # net/ipv4/tcp_ipv4.c tcp_v4_rcv(): `no_tcp_socket:` answers with tcp_v4_send_reset() and falls into
        # `discard_it: kfree_skb(skb)`; checksum and header errors free there too, far more rarely.
        "tcp_v4_rcv": "NO_SOCKET",
        # net/ipv6/tcp_ipv6.c tcp_v6_rcv(): the same labels for IPv6.
        "tcp_v6_rcv": "NO_SOCKET",
        # net/ipv4/udp.c __udp4_lib_rcv(): no socket for the port -> icmp_send(ICMP_PORT_UNREACH) then
        # kfree_skb(skb) (UDP_MIB_NOPORTS).
        "__udp4_lib_rcv": "NO_SOCKET",
        # net/ipv6/udp.c __udp6_lib_rcv(): the same for IPv6 (ICMPV6_PORT_UNREACH).
        "__udp6_lib_rcv": "NO_SOCKET",
        # net/ipv4/udp.c __udp_queue_rcv_skb(): __udp_enqueue_schedule_skb() failed with -ENOMEM (the socket's
        # receive buffer is full: UDP_MIB_RCVBUFERRORS), then kfree_skb(skb).
        "__udp_queue_rcv_skb": "SOCKET_RCVBUFF",
        # net/ipv4/udp.c udp_queue_rcv_one_skb(): `if (sk_rcvqueues_full(sk, sk->sk_rcvbuf)) goto drop;`
        # (socket filters also end at `drop:`).
        "udp_queue_rcv_one_skb": "SOCKET_RCVBUFF",
        # net/ipv6/udp.c: the IPv6 twins of the two above.
        "__udpv6_queue_rcv_skb": "SOCKET_RCVBUFF",
        "udpv6_queue_rcv_one_skb": "SOCKET_RCVBUFF",
        # net/core/dev.c enqueue_to_backlog(): the CPU's input backlog is longer than netdev_max_backlog
        # (softnet_data dropped++), then kfree_skb(skb).
        "enqueue_to_backlog": "CPU_BACKLOG",
        # net/core/dev.c __netif_receive_skb_core(): no handler took the protocol -> `drop:` rx_dropped++,
        # kfree_skb(skb).
        "__netif_receive_skb_core": "UNHANDLED_PROTO",
        # net/ipv4/ip_input.c ip_protocol_deliver_rcu(): no handler for the IP protocol ->
        # icmp_send(ICMP_PROT_UNREACH), kfree_skb(skb).
        "ip_protocol_deliver_rcu": "IP_NOPROTO",
    }
)


def _base_name(function: str) -> str:
    """`tcp_v4_rcv` for `tcp_v4_rcv+0x7a/0x1100` or a compiler clone such as `foo.isra.0`."""
    return function.split("+", 1)[0].split(".", 1)[0]


def infer_reason(function: str) -> str:
    """The reason a newer kernel names at the function that freed the packet (a symbol, with or without
    +offset), or UNKNOWN_REASON."""
    return INFERRED_REASONS.get(_base_name(function), UNKNOWN_REASON)
