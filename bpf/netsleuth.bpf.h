/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Kernel-side helpers shared by every netsleuth program: packet parsing from an skb, netns and socket identity,
 * and "is this process context?". Everything reads through BPF_CORE_READ so one body serves tp_btf and raw_tp.
 */
#ifndef NETSLEUTH_BPF_H
#define NETSLEUTH_BPF_H

#include "netsleuth_kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "packet.h"

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_HLEN 14
#define IPPROTO_ICMP 1
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_ICMPV6 58
#define IPPROTO_SCTP 132
#define IPPROTO_UDPLITE 136
#define AF_INET 2
#define AF_INET6 10
#define TCP_TIME_WAIT 6
#define TCP_NEW_SYN_RECV 12

/* include/linux/preempt.h: in_task() is false while serving a softirq, in hardirq or in NMI. */
#define SOFTIRQ_OFFSET (1U << 8)
#define HARDIRQ_MASK (0xfU << 16)
#define NMI_MASK (0xfU << 20)

extern const int __preempt_count __ksym __weak;
extern const struct pcpu_hot pcpu_hot __ksym __weak;

/* Evaluates to 0 at load time when the weak ksym is missing, so the verifier prunes the branch using it. */
#define ns_ksym_exists(sym) (!!(&(sym)))

/* 1 in process context, 0 in softirq/hardirq/NMI, -1 when this kernel gives no way to tell (not x86). */
static __always_inline int ns_in_task(void)
{
#if defined(__TARGET_ARCH_x86)
	int count;

	if (ns_ksym_exists(__preempt_count))
		count = *(int *)bpf_this_cpu_ptr(&__preempt_count);
	else if (ns_ksym_exists(pcpu_hot))
		count = ((struct pcpu_hot *)bpf_this_cpu_ptr(&pcpu_hot))->preempt_count;
	else
		return -1;
	return !(count & (NMI_MASK | HARDIRQ_MASK | SOFTIRQ_OFFSET));
#else
	return -1;
#endif
}

static __always_inline __u32 ns_net_inum(struct net *net)
{
	return net ? BPF_CORE_READ(net, ns.inum) : 0;
}

/* A socket we may read sk_socket from: request and timewait socks are smaller structs without it. */
static __always_inline bool ns_sk_fullsock(struct sock *sk)
{
	unsigned char state = BPF_CORE_READ(sk, __sk_common.skc_state);

	return state != TCP_TIME_WAIT && state != TCP_NEW_SYN_RECV;
}

/* The inode userspace sees as socket:[N] in /proc/PID/fd, which names the owning processes. */
static __always_inline __u64 ns_sock_ino(struct sock *sk)
{
	if (!sk || !ns_sk_fullsock(sk))
		return 0;
	return BPF_CORE_READ(sk, sk_socket, file, f_inode, i_ino);
}

/*
 * Fill `tuple` from the skb's headers. Output packets have network_header set before any netfilter hook;
 * received ones get it in __netif_receive_skb_core. An unset header reads as ~0 (6.x) and leaves family 0.
 */
static __always_inline void ns_parse_packet(struct sk_buff *skb, struct packet_tuple *tuple, unsigned char **l3)
{
	unsigned char *head = BPF_CORE_READ(skb, head);
	__u16 network_header = BPF_CORE_READ(skb, network_header);
	unsigned char *data = BPF_CORE_READ(skb, data);
	unsigned int len = BPF_CORE_READ(skb, len);
	__u8 first, l4proto = 0;
	unsigned char *transport;

	tuple->ethertype = bpf_ntohs(BPF_CORE_READ(skb, protocol));
	*l3 = 0;
	if (network_header == (__u16)~0U || !head)
		return;
	*l3 = head + network_header;
	/* len counts from skb->data; the network header may sit before it (received) or after it (sent). */
	tuple->l3_len = len + (__u32)(data - head) - network_header;
	if (bpf_probe_read_kernel(&first, 1, *l3))
		return;
	if ((first >> 4) == 4) {
		__u8 ihl = (first & 0xf) * 4;
		__be16 frag_off;

		tuple->family = 4;
		bpf_probe_read_kernel(&l4proto, 1, *l3 + 9);
		bpf_probe_read_kernel(tuple->saddr, 4, *l3 + 12);
		bpf_probe_read_kernel(tuple->daddr, 4, *l3 + 16);
		bpf_probe_read_kernel(&frag_off, 2, *l3 + 6);
		if (bpf_ntohs(frag_off) & 0x1fff) { /* a later fragment carries no L4 header */
			tuple->l4proto = l4proto;
			return;
		}
		transport = *l3 + (ihl < 20 ? 20 : ihl);
	} else if ((first >> 4) == 6) {
		tuple->family = 6;
		bpf_probe_read_kernel(&l4proto, 1, *l3 + 6);
		bpf_probe_read_kernel(tuple->saddr, 16, *l3 + 8);
		bpf_probe_read_kernel(tuple->daddr, 16, *l3 + 24);
		transport = *l3 + 40;
	} else {
		return;
	}
	tuple->l4proto = l4proto;
	if (l4proto == IPPROTO_TCP || l4proto == IPPROTO_UDP || l4proto == IPPROTO_SCTP ||
	    l4proto == IPPROTO_UDPLITE) {
		__be16 ports[2];

		if (bpf_probe_read_kernel(ports, sizeof(ports), transport))
			return;
		tuple->sport = bpf_ntohs(ports[0]);
		tuple->dport = bpf_ntohs(ports[1]);
		tuple->has_ports = 1;
		if (l4proto == IPPROTO_TCP)
			bpf_probe_read_kernel(&tuple->tcp_flags, 1, transport + 13);
	} else if (l4proto == IPPROTO_ICMP || l4proto == IPPROTO_ICMPV6) {
		__u8 type_code[2];

		if (bpf_probe_read_kernel(type_code, sizeof(type_code), transport))
			return;
		tuple->sport = type_code[0];
		tuple->dport = type_code[1];
		tuple->has_ports = 1;
	}
}

/* LPM lookup of one address; family is part of the key so IPv4 prefixes never match IPv6 addresses. */
static __always_inline bool ns_addr_in(void *lpm, __u8 family, const __u8 *addr)
{
	struct lpm_addr_key key = {};

	key.prefixlen = 8 + (family == 4 ? 32 : 128);
	key.family = family;
	__builtin_memcpy(key.addr, addr, 16);
	return bpf_map_lookup_elem(lpm, &key) != 0;
}

#endif /* NETSLEUTH_BPF_H */
