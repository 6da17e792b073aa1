/* SPDX-License-Identifier: GPL-2.0 */
/*
 * netsleuth's own footprint, told apart exactly: the netlink sockets netsleuth and the tools it runs sent on.
 *
 * Naming a firewall rule means reading the namespace's ruleset: netsleuth runs iptables-nft-save and nft
 * there. iptables-nft-save (1.8) asks the kernel for a match's revision with NLM_F_ACK on a socket of its
 * own and closes it without reading the ACK, which the kernel frees as a QUEUE_PURGE drop of that namespace
 * (netlink_sock_destruct, from an RCU callback: by then no task is there to blame). So the sockets are
 * marked while they are used: on sock:sock_send_length (6.3), in the sending task, a netlink socket that
 * netsleuth (`self_tgid`) or a process it started sends on is remembered by its socket cookie, which no other
 * socket gets while the system runs; a drop program then leaves QUEUE_PURGE drops of those sockets out of
 * what it counts for the host, and counts them in `own_drops`.
 *
 * Local type flavors (___own): libbpf matches them to the kernel's struct sock_common and task_struct by
 * name, so the shared kernel header, and every other object, stays as it is.
 */
#ifndef NETSLEUTH_OWN_SOCKETS_BPF_H
#define NETSLEUTH_OWN_SOCKETS_BPF_H

#include "netsleuth.bpf.h"

enum ns_own_limits {
	NS_OWN_SOCKETS = 1024, /* netlink sockets remembered (least recently used go first) */
	NS_AF_NETLINK = 16,
};

typedef struct {
	__s64 counter;
} atomic64_t___own;

struct sock_common___own {
	unsigned short skc_family;
	atomic64_t___own skc_cookie; /* 0 until something asks for the socket's cookie */
} __attribute__((preserve_access_index));

struct task_struct___own {
	int tgid;
	struct task_struct___own *real_parent;
} __attribute__((preserve_access_index));

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, NS_OWN_SOCKETS);
	__type(key, __u64); /* socket cookie */
	__type(value, __u8);
} own_sockets SEC(".maps");

/* The drops left out as netsleuth's own (userspace sums the CPUs). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} own_drops SEC(".maps");

/* Is `sk` a socket netsleuth's own processes sent on? Read through probe reads: asked of purges only. */
static __always_inline bool ns_own_socket(struct sock *sk)
{
	__u64 cookie;

	if (!sk)
		return false;
	cookie = BPF_CORE_READ((struct sock_common___own *)sk, skc_cookie.counter);
	return cookie && bpf_map_lookup_elem(&own_sockets, &cookie);
}

static __always_inline void ns_count_own(void)
{
	__u32 zero = 0;
	__u64 *count = bpf_map_lookup_elem(&own_drops, &zero);

	if (count)
		*count += 1;
}

/* In the sending task: remember a netlink socket that netsleuth or a child of it (the tools it runs) sends
 * on. Every other send on the host costs a compare or two. */
static __always_inline int ns_mark_own(struct sock *sk, __u32 self_tgid)
{
	struct task_struct___own *task;
	__u64 cookie;
	__u8 one = 1;

	if (!self_tgid || !sk || BPF_CORE_READ((struct sock_common___own *)sk, skc_family) != NS_AF_NETLINK)
		return 0;
	task = (struct task_struct___own *)bpf_get_current_task_btf();
	if (BPF_CORE_READ(task, tgid) != self_tgid && BPF_CORE_READ(task, real_parent, tgid) != self_tgid)
		return 0;
	cookie = bpf_get_socket_cookie(sk);
	bpf_map_update_elem(&own_sockets, &cookie, &one, BPF_ANY);
	return 0;
}

/* The marker, one per variant of the object's programs (their names end like the kfree_skb programs', so
 * a ProgramSession loads it with the same variant). The typed tracepoint is what gives the socket's cookie;
 * a raw tracepoint cannot ask for it, so that variant marks nothing (the run says so). */
#define NS_OWN_SOCKET_MARKERS(prefix, self_tgid)                                                        \
	SEC("tp_btf/sock_send_length")                                                                  \
	int BPF_PROG(prefix##_tp_btf, struct sock *sk)                                                  \
	{                                                                                               \
		return ns_mark_own(sk, self_tgid);                                                      \
	}                                                                                               \
	SEC("tp_btf/sock_send_length")                                                                  \
	int BPF_PROG(prefix##_tp_btf_tr, struct sock *sk)                                               \
	{                                                                                               \
		return ns_mark_own(sk, self_tgid);                                                      \
	}                                                                                               \
	SEC("raw_tp/sock_send_length")                                                                  \
	int prefix##_raw_tp(void *ctx)                                                                  \
	{                                                                                               \
		return 0;                                                                               \
	}

#endif /* NETSLEUTH_OWN_SOCKETS_BPF_H */
