/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Kernel types read by route, snoop, softirq and profile, beside the ones every program uses
 * (netsleuth_kernel.h). As there, every struct carries preserve_access_index: libbpf relocates each field
 * against the running kernel's BTF, so only the names and types here must exist in the target kernel.
 * task_struct is already declared in netsleuth_kernel.h; its other fields are read through the
 * `task_struct___more` flavour (libbpf ignores the ___suffix when it matches types).
 */
#ifndef NETSLEUTH_KERNEL_MORE_H
#define NETSLEUTH_KERNEL_MORE_H

/* include/uapi/linux/bpf.h enum bpf_map_type, the members netsleuth_kernel.h does not list. */
enum {
	BPF_MAP_TYPE_PERCPU_HASH = 5,
	BPF_MAP_TYPE_STACK_TRACE = 7,
};

/* bpf_get_stackid() flags (include/uapi/linux/bpf.h); BPF_F_USER_STACK is in netsleuth_kernel.h. */
#define BPF_F_FAST_STACK_CMP (1ULL << 9)
#define BPF_F_REUSE_STACKID (1ULL << 10)

/* include/net/flow.h: the key of an IPv4 route lookup (fib:fib_table_lookup's `flp`). The 6.13+ kernels
 * carry dscp_t flowic_dscp where older ones had __u8 flowic_tos; only fields common to both are read. */
struct flowi_common {
	int flowic_oif;
	int flowic_iif;
	__u32 flowic_mark;
	__u8 flowic_scope;
	__u8 flowic_proto;
} __attribute__((preserve_access_index));

union flowi_uli {
	struct {
		__be16 dport;
		__be16 sport;
	} ports;
} __attribute__((preserve_access_index));

struct flowi4 {
	struct flowi_common __fl_common;
	__be32 saddr;
	__be32 daddr;
	union flowi_uli uli;
} __attribute__((preserve_access_index));

/* include/net/ip_fib.h: the next hop a successful lookup chose. */
struct fib_nh_common {
	struct net_device *nhc_dev;
	int nhc_oif;
	__u8 nhc_gw_family;
	union {
		__be32 ipv4;
		struct in6_addr ipv6;
	} nhc_gw;
} __attribute__((preserve_access_index));

/* include/net/flow.h: the key of an IPv6 route lookup (fib6:fib6_table_lookup's `flp`). */
struct flowi6 {
	struct flowi_common __fl_common;
	struct in6_addr daddr;
	struct in6_addr saddr;
	union flowi_uli uli;
} __attribute__((preserve_access_index));

/* include/net/ip6_fib.h: what fib6_table_lookup() found - the route (f6i), its next hop and its type (RTN_*).
 * A table without a match answers net->ipv6.fib6_null_entry (an RTN_UNREACHABLE stand-in). */
struct fib6_info;

struct fib6_nh {
	struct fib_nh_common nh_common;
} __attribute__((preserve_access_index));

struct fib6_result {
	struct fib6_nh *nh;
	struct fib6_info *f6i;
	__u8 fib6_type;
} __attribute__((preserve_access_index));

struct fib6_table {
	__u32 tb6_id;
} __attribute__((preserve_access_index));

struct netns_ipv6 {
	struct fib6_info *fib6_null_entry;
} __attribute__((preserve_access_index));

struct net___ipv6 {
	struct netns_ipv6 ipv6;
} __attribute__((preserve_access_index));

/* include/net/neighbour.h */
struct neigh_table {
	int family;
} __attribute__((preserve_access_index));

struct neighbour {
	struct neigh_table *tbl;
	__u8 nud_state;
	__u8 dead;
	struct net_device *dev;
	__u8 primary_key[0];
} __attribute__((preserve_access_index));

struct nsproxy {
	struct net *net_ns;
} __attribute__((preserve_access_index));

struct task_struct___more {
	struct nsproxy *nsproxy;
	int pid;
	int tgid;
	struct task_struct___more *real_parent;
	char comm[16];
} __attribute__((preserve_access_index));

/* The status do_exit() stored (code << 8 | signal), read at sched:sched_process_exit. */
struct task_struct___exit {
	int exit_code;
} __attribute__((preserve_access_index));

/* include/uapi/linux/bpf_perf_event.h: a perf_event program's context; only passed on to bpf_get_stackid. */
struct bpf_perf_event_data;

/* include/linux/netdevice.h: the NAPI instance napi:napi_poll reports on. */
struct napi_struct {
	struct net_device *dev;
	int weight;
	unsigned int napi_id;
} __attribute__((preserve_access_index));

/* include/linux/binfmts.h: what sched:sched_process_exec ran. */
struct linux_binprm {
	const char *filename;
} __attribute__((preserve_access_index));

#endif /* NETSLEUTH_KERNEL_MORE_H */
