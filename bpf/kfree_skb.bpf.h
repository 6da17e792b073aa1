/* SPDX-License-Identifier: GPL-2.0 */
/*
 * skb:kfree_skb, the same way in every program that hooks it for a drop reason (drops.bpf.c, dns.bpf.c):
 * the two entry points of one handler, and where a freed packet was.
 *
 * The tracepoint passes (skb, location, reason) since 5.17 and the receiving socket as a fourth argument
 * since 6.11; the program's config says whether this kernel has it (`cfg.has_rx_sk`, set by userspace from
 * the tracepoint's arity), because an argument the tracepoint does not pass reads as garbage.
 */
#ifndef NETSLEUTH_KFREE_SKB_BPF_H
#define NETSLEUTH_KFREE_SKB_BPF_H

#include "netsleuth.bpf.h"
#include <bpf/bpf_tracing.h>

/*
 * One handler, two entry points: tp_btf (BTF-typed arguments the verifier lets us dereference) and raw_tp for
 * kernels that refuse tp_btf; userspace keeps whichever loads (bpf/program_session.py). `handler` is
 * int handler(void *ctx, struct sk_buff *skb, void *location, __u32 reason, struct sock *rx_sk, bool direct),
 * `direct` a compile-time constant so each program keeps only its own kind of read (NS_RD).
 *
 * `reason` is the third argument since 5.17; a program that must also run without it defines
 * NS_KFREE_SKB_HAS_REASON (e.g. to a `cfg` field) before including this header, and gets 0 when it is false:
 * a read-only switch, so the verifier never sees the read of an argument the tracepoint does not pass.
 */
#ifndef NS_KFREE_SKB_HAS_REASON
#define NS_KFREE_SKB_HAS_REASON 1
#endif

#define NS_KFREE_SKB_ENTRY(name, section, direct, handler)                                              \
	SEC(section)                                                                                    \
	int BPF_PROG(name)                                                                              \
	{                                                                                               \
		unsigned long long *args = ctx;                                                         \
                                                                                                        \
		return handler(ctx, (struct sk_buff *)args[0], (void *)args[1],                          \
			       NS_KFREE_SKB_HAS_REASON ? (__u32)args[2] : 0,                            \
			       cfg.has_rx_sk ? (struct sock *)args[3] : 0, direct);                     \
	}

#define NS_KFREE_SKB_PROGRAMS(tp_btf_name, raw_tp_name, handler)                                        \
	NS_KFREE_SKB_ENTRY(tp_btf_name, "tp_btf/kfree_skb", true, handler)                              \
	NS_KFREE_SKB_ENTRY(raw_tp_name, "raw_tp/kfree_skb", false, handler)

/* The namespace a freed packet was in: its device's is where the packet was; a packet not yet given a device
 * belongs to its socket's. 0 when it has neither. */
static __always_inline __u32 ns_skb_netns_rd(const bool direct, struct net_device *dev, struct sock *sk)
{
	__u32 netns = dev ? ns_net_inum_rd(direct, NS_RD(direct, dev, nd_net.net)) : 0;

	if (!netns && sk)
		netns = ns_net_inum_rd(direct, NS_RD(direct, sk, __sk_common.skc_net.net));
	return netns;
}

#endif /* NETSLEUTH_KFREE_SKB_BPF_H */
