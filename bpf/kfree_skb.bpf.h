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
/* Whether rx_sk is passed: `cfg.has_rx_sk` unless the program says otherwise (drops.bpf.c asks the BTF). */
#ifndef NS_KFREE_SKB_HAS_RX_SK
#define NS_KFREE_SKB_HAS_RX_SK cfg.has_rx_sk
#endif

#define NS_KFREE_SKB_ENTRY(name, section, direct, handler)                                              \
	SEC(section)                                                                                    \
	int BPF_PROG(name)                                                                              \
	{                                                                                               \
		unsigned long long *args = ctx;                                                         \
                                                                                                        \
		return handler(ctx, (struct sk_buff *)args[0], (void *)args[1],                          \
			       NS_KFREE_SKB_HAS_REASON ? (__u32)args[2] : 0,                            \
			       NS_KFREE_SKB_HAS_RX_SK ? (struct sock *)args[3] : 0, direct);            \
	}

#define NS_KFREE_SKB_PROGRAMS(tp_btf_name, raw_tp_name, handler)                                        \
	NS_KFREE_SKB_ENTRY(tp_btf_name, "tp_btf/kfree_skb", true, handler)                              \
	NS_KFREE_SKB_ENTRY(raw_tp_name, "raw_tp/kfree_skb", false, handler)

/*
 * A third entry point, tp_btf with its pointer arguments made untrusted first, for programs that want the
 * shortest load. tp_btf arguments are trusted pointers, and since 6.4 the verifier asks, at every load of a
 * struct pointer out of a trusted one (skb->dev, skb->sk, rx_sk->skc_net...), whether that field is marked
 * trusted or RCU-safe: up to four searches by name through the kernel's whole BTF (150,000 types), at each
 * visit of the instruction. For drops.bpf.c that was 15-25 ms of its 20-30 ms verification (of a start
 * that takes about 150 ms); read through untrusted pointers it verifies in 4-5 ms. The reads are the same
 * (every load through a BTF pointer is an exception-table-protected load) and bpf_rdonly_cast is turned
 * into a register move by the verifier, so the program runs exactly as fast.
 * bpf_rdonly_cast is a kfunc of 6.3: on older kernels the weak extern stays unresolved, the kernel refuses
 * this entry point and the loader falls back to the plain tp_btf one (bpf/program_session.py variants).
 */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;

#define NS_KFREE_SKB_UNTRUSTED_ENTRY(name, handler)                                                     \
	SEC("tp_btf/kfree_skb")                                                                         \
	int BPF_PROG(name)                                                                              \
	{                                                                                               \
		unsigned long long *args = ctx;                                                         \
		struct sk_buff *skb =                                                                   \
			bpf_rdonly_cast((void *)args[0], bpf_core_type_id_kernel(struct sk_buff));      \
		struct sock *rx_sk = NS_KFREE_SKB_HAS_RX_SK                                             \
					     ? bpf_rdonly_cast((void *)args[3],                         \
							       bpf_core_type_id_kernel(struct sock))    \
					     : 0;                                                       \
                                                                                                        \
		return handler(ctx, skb, (void *)args[1], NS_KFREE_SKB_HAS_REASON ? (__u32)args[2] : 0, \
			       rx_sk, true);                                                            \
	}

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
