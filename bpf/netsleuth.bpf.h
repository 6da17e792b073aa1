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

#define PF_KTHREAD 0x00200000 /* include/linux/sched.h */

/*
 * Process context or not, without the preempt count (a per-CPU variable BPF can read only when it is in
 * kallsyms): x86-64 and arm64 run softirqs and hardirqs on per-CPU IRQ stacks (do_softirq_own_stack), so
 * the tracepoint's frame lies inside the current task's stack exactly when it runs in that task's context.
 * The frame is located by `ctx`: bpf_trace_run*() builds the argument array on the kernel stack, whereas
 * our own r10 may point at a per-CPU private stack (6.13+ JIT). `thread_size` is THREAD_SIZE, which
 * userspace reads from the kernel config.
 */
static __always_inline bool ns_in_task(void *ctx, __u64 thread_size, bool *kthread)
{
	/* bpf_get_current_task_btf() is a trusted BTF pointer in every program type: read it directly. */
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 stack = (__u64)task->stack;
	__u64 frame = (__u64)ctx;

	*kthread = task->flags & PF_KTHREAD;
	/* Compared, not subtracted: the verifier allows no arithmetic between a context pointer and a scalar. */
	return frame >= stack && frame < stack + thread_size;
}

/*
 * NS_RD(direct, ptr, field): one field of a kernel struct. tp_btf programs get BTF-typed pointers that the
 * verifier lets us dereference (a single load, faults handled by the exception table); raw_tp programs must
 * copy with bpf_probe_read_kernel. `direct` is a compile-time constant in every entry point, so each program
 * keeps only its own kind of read. Every helper below takes it; the ones without `_rd` always copy.
 */
#define NS_RD(direct, ptr, field) ((direct) ? (ptr)->field : BPF_CORE_READ(ptr, field))

static __always_inline __u32 ns_net_inum_rd(const bool direct, struct net *net)
{
	return net ? NS_RD(direct, net, ns.inum) : 0;
}

static __always_inline __u32 ns_net_inum(struct net *net)
{
	return ns_net_inum_rd(false, net);
}

/* A socket we may read sk_socket from: request and timewait socks are smaller structs without it. */
static __always_inline bool ns_sk_fullsock_rd(const bool direct, struct sock *sk)
{
	unsigned char state = NS_RD(direct, sk, __sk_common.skc_state);

	return state != TCP_TIME_WAIT && state != TCP_NEW_SYN_RECV;
}

/* The inode userspace sees as socket:[N] in /proc/PID/fd, which names the owning processes. */
static __always_inline __u64 ns_sock_ino_rd(const bool direct, struct sock *sk)
{
	struct socket *socket;
	struct file *file;
	struct inode *inode;

	if (!sk || !ns_sk_fullsock_rd(direct, sk))
		return 0;
	socket = NS_RD(direct, sk, sk_socket);
	file = socket ? NS_RD(direct, socket, file) : 0;
	inode = file ? NS_RD(direct, file, f_inode) : 0;
	return inode ? NS_RD(direct, inode, i_ino) : 0;
}

static __always_inline __u64 ns_sock_ino(struct sock *sk)
{
	return ns_sock_ino_rd(false, sk);
}

/* The running task's ids and name, for an event in its own context. Returns pid_tgid. */
static __always_inline __u64 ns_current_task(__u32 *pid, __u32 *tid, char *comm)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();

	*pid = pid_tgid >> 32;
	*tid = (__u32)pid_tgid;
	bpf_get_current_comm(comm, 16);
	return pid_tgid;
}

/* A device's index and name (both left alone without a device). */
static __always_inline void ns_device_rd(const bool direct, struct net_device *dev, __u32 *ifindex, char *ifname)
{
	if (!dev)
		return;
	*ifindex = NS_RD(direct, dev, ifindex);
	/* The macro copies sizeof(*dst) bytes at most: the destination must be typed as the 16-byte array. */
	BPF_CORE_READ_STR_INTO((char(*)[16])ifname, dev, name);
}

#define NS_HEADER_BYTES 64 /* IPv6 (40) + the first 14 bytes of TCP, or IPv4 with up to 36 bytes of options */

/* Fill `tuple` from the first NS_HEADER_BYTES bytes at the network header (already copied to `hdr`). */
static __always_inline void ns_parse_headers(const __u8 *hdr, struct packet_tuple *tuple)
{
	const __u8 *transport;
	__u8 l4proto;

	if ((hdr[0] >> 4) == 4) {
		__u8 ihl = (hdr[0] & 0xf) * 4;

		tuple->family = 4;
		l4proto = hdr[9];
		__builtin_memcpy(tuple->saddr, hdr + 12, 4);
		__builtin_memcpy(tuple->daddr, hdr + 16, 4);
		tuple->l4proto = l4proto;
		if (((hdr[6] << 8) | hdr[7]) & 0x1fff) /* a later fragment carries no L4 header */
			return;
		if (ihl < 20 || ihl > NS_HEADER_BYTES - 14)
			return;
		transport = hdr + (ihl & 0x3f);
	} else if ((hdr[0] >> 4) == 6) {
		tuple->family = 6;
		l4proto = hdr[6];
		__builtin_memcpy(tuple->saddr, hdr + 8, 16);
		__builtin_memcpy(tuple->daddr, hdr + 24, 16);
		tuple->l4proto = l4proto;
		transport = hdr + 40;
	} else {
		return;
	}
	if (l4proto == IPPROTO_TCP || l4proto == IPPROTO_UDP || l4proto == IPPROTO_SCTP ||
	    l4proto == IPPROTO_UDPLITE) {
		tuple->sport = (transport[0] << 8) | transport[1];
		tuple->dport = (transport[2] << 8) | transport[3];
		tuple->has_ports = 1;
		if (l4proto == IPPROTO_TCP)
			tuple->tcp_flags = transport[13];
	} else if (l4proto == IPPROTO_ICMP || l4proto == IPPROTO_ICMPV6) {
		tuple->sport = transport[0];
		tuple->dport = transport[1];
		tuple->has_ports = 1;
	}
}

/*
 * Fill `tuple` from the skb's headers with a single copy of NS_HEADER_BYTES. Output packets have
 * network_header set before any netfilter hook; received ones get it in __netif_receive_skb_core. An unset
 * header reads as ~0 (6.x) and leaves family 0. `*l3` is set to the network header for later copies.
 */
static __always_inline void ns_parse_packet_rd(const bool direct, struct sk_buff *skb, struct packet_tuple *tuple,
					       unsigned char **l3)
{
	unsigned char *head = NS_RD(direct, skb, head);
	__u16 network_header = NS_RD(direct, skb, network_header);
	unsigned char *data = NS_RD(direct, skb, data);
	unsigned int len = NS_RD(direct, skb, len);
	__u8 hdr[NS_HEADER_BYTES];

	tuple->ethertype = bpf_ntohs(NS_RD(direct, skb, protocol));
	*l3 = 0;
	if (network_header == (__u16)~0U || !head)
		return;
	*l3 = head + network_header;
	/* len counts from skb->data; the network header may sit before it (received) or after it (sent). */
	tuple->l3_len = len + (__u32)(data - head) - network_header;
	/* Reading past a short packet stays inside the skb's head allocation (skb_shared_info follows). */
	if (bpf_probe_read_kernel(hdr, sizeof(hdr), *l3))
		return;
	ns_parse_headers(hdr, tuple);
}

static __always_inline void ns_parse_packet(struct sk_buff *skb, struct packet_tuple *tuple, unsigned char **l3)
{
	ns_parse_packet_rd(false, skb, tuple, l3);
}

/* A 16-byte kernel name (comm, ifname) against a configured one; both NUL-terminated within 16 bytes. */
static __always_inline bool ns_name_matches(const char *name, const volatile char *wanted)
{
	for (int i = 0; i < 16; i++) {
		if (name[i] != wanted[i])
			return false;
		if (!name[i])
			return true;
	}
	return true;
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
