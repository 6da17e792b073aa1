// SPDX-License-Identifier: GPL-2.0
/*
 * netsleuth route: the kernel's IPv4 and IPv6 route lookups and what became of their next hops.
 *
 *   fib:fib_table_lookup(tb_id, flp, nhc, err)   one call per table the policy rules try (net/ipv4/fib_trie.c):
 *        err 0 with the chosen next hop, a reject route's error (blackhole -EINVAL, unreachable -EHOSTUNREACH,
 *        prohibit -EACCES, throw -ENETUNREACH... with nhc NULL) or -EAGAIN when the table has no match.
 *   fib6:fib6_table_lookup(net, res, table, flp)   the same per IPv6 table (net/ipv6/route.c): the result's
 *        RTN_* type is turned into the same errors; the table's null entry is a miss.
 *   neigh:neigh_create / neigh_update / neigh_timer_handler / neigh_event_send_dead (net/core/neighbour.c):
 *        the next hop's ARP/ND entry created, resolved, failed (the timer gave up: NUD_FAILED), dead.
 *   skb:kfree_skb with a NEIGH_* drop reason: packets lost while their next hop did not resolve.
 *   net:netif_receive_skb: remembers, per CPU, the namespace of the packet being received (below).
 *
 * An IPv4 lookup carries no namespace (an IPv6 one does: its `net`): with a next hop, its device's; in a task's own context (connect, sendmsg),
 * the task's; in softirq, the namespace of the packet the CPU is receiving - input routing runs on the CPU
 * that received the packet, right after net:netif_receive_skb fired for it.
 *
 * Every matching event is counted exactly per kind (`route_stats`) and by decision in `route_groups` before
 * it is offered to the ring buffer, where it may be sampled away or lost; both are counted.
 */
#include "netsleuth.bpf.h"
#include "netsleuth_kernel_more.h"
#include <bpf/bpf_tracing.h>
#include "route.h"
#include "abi.h"
#include "emit.bpf.h"
#include "filter_maps.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* include/uapi/asm-generic/errno*.h */
#define EAGAIN 11
#define EINVAL 22
#define EACCES 13
#define EHOSTUNREACH 113
/* include/net/neighbour.h NUD_* */
#define NUD_INCOMPLETE 0x01
#define NUD_FAILED 0x20
#define NUD_VALID 0xde /* PERMANENT | NOARP | REACHABLE | PROBE | STALE | DELAY */

const volatile struct route_config cfg = {
	.sample_every = 1,
};

NS_ABI_KEEP(route_abi_types);

NS_STATS_MAP(route_stats, ROUTE_EV_KINDS * NS_STAT_COUNT);
NS_GROUP_MAP(route_groups, struct route_group_key, struct route_group, ROUTE_MAX_GROUPS);

/* The namespace of the packet this CPU received last (see the header comment). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} rx_netns SEC(".maps");

/* The NEIGH_* drop reasons of the running kernel (read from its BTF by userspace). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ROUTE_NEIGH_REASONS);
	__type(key, __u32);
	__type(value, __u8);
} neigh_reasons SEC(".maps");

struct route_scratch {
	struct route_event event;
	struct route_group fresh;
	struct route_group_key key;
	__u8 header[NS_HEADER_BYTES];
};

NS_SCRATCH_MAP(scratch, struct route_scratch);

static __always_inline void count(__u8 kind, enum ns_stat stat)
{
	ns_count(&route_stats, kind * NS_STAT_COUNT + stat);
}

static __always_inline struct route_scratch *seen_scratch(__u8 kind)
{
	__u32 zero = 0;
	struct route_scratch *buf;

	count(kind, NS_STAT_SEEN);
	buf = bpf_map_lookup_elem(&scratch, &zero);
	if (!buf)
		return 0;
	__builtin_memset(&buf->event, 0, sizeof(buf->event));
	buf->event.kind = kind;
	buf->event.time_ns = bpf_ktime_get_ns();
	buf->event.cpu = bpf_get_smp_processor_id();
	return buf;
}

static __always_inline __u32 device_netns(const bool direct, struct net_device *dev)
{
	return dev ? ns_net_inum_rd(direct, NS_RD(direct, dev, nd_net.net)) : 0;
}

/* The current task's namespace, or 0 without one (an exiting task has no nsproxy). */
static __always_inline __u32 task_netns(void)
{
	struct task_struct___more *task = (void *)bpf_get_current_task();
	struct nsproxy *nsproxy = BPF_CORE_READ(task, nsproxy);

	return nsproxy ? ns_net_inum(BPF_CORE_READ(nsproxy, net_ns)) : 0;
}

static __always_inline __u32 received_netns(void)
{
	__u32 zero = 0;
	__u32 *inum = bpf_map_lookup_elem(&rx_netns, &zero);

	return inum ? *inum : 0;
}

/* Who is running, for --pid/--comm and the event: only meaningful in a task's own context. */
static __always_inline void fill_task(void *ctx, struct route_event *e)
{
	bool kthread = false;

	e->in_task = ns_in_task(ctx, cfg.thread_size, &kthread) && !kthread;
	if (e->in_task) {
		__u32 tid;

		ns_current_task(&e->pid, &tid, e->comm);
	}
}

static __always_inline bool owner_matches(const struct route_event *e)
{
	if (!cfg.filter_owner)
		return true;
	return e->in_task && ns_task_matches(e->pid, e->comm, cfg.pid, cfg.comm);
}

static __always_inline bool flow_matches(const struct route_event *e)
{
	if (cfg.filter_l4proto && e->l4proto != cfg.l4proto)
		return false;
	if ((cfg.port || cfg.sport || cfg.dport) &&
	    !ns_ports_match(cfg.port, cfg.sport, cfg.dport, e->sport, e->dport))
		return false;
	return ns_addresses_match(cfg.filter_host, cfg.filter_src, cfg.filter_dst, e->family, e->saddr, e->daddr);
}

static __always_inline bool dev_matches(const struct route_event *e)
{
	return !cfg.filter_dev || ns_name_matches(e->ifname, cfg.dev);
}

/* Count the event in its group (first and last time, an example) and offer it to the ring buffer. */
static __always_inline void finish(struct route_scratch *buf)
{
	struct route_event *e = &buf->event;
	struct route_group_key *key = &buf->key;
	struct route_group *group;
	__u32 base = e->kind * NS_STAT_COUNT;

	count(e->kind, NS_STAT_MATCHED);
	__builtin_memset(key, 0, sizeof(*key));
	__builtin_memcpy(key->saddr, e->saddr, 16);
	__builtin_memcpy(key->daddr, e->daddr, 16);
	__builtin_memcpy(key->gw, e->gw, 16);
	key->netns = e->netns;
	key->table = e->table;
	key->err = e->err;
	key->ifindex = e->ifindex;
	key->iif = e->iif;
	key->reason = e->reason;
	key->kind = e->kind;
	key->family = e->family;
	key->neigh_kind = e->neigh_kind;
	group = bpf_map_lookup_elem(&route_groups, key);
	if (!group) {
		buf->fresh.count = 1;
		buf->fresh.first_ns = e->time_ns;
		buf->fresh.last_ns = e->time_ns;
		buf->fresh.example = *e;
		group = ns_group_insert(&route_groups, key, &buf->fresh, &route_stats, base);
	}
	if (group) {
		__sync_fetch_and_add(&group->count, 1);
		group->last_ns = e->time_ns;
	}
	if (!(cfg.emit_mask & (1U << e->kind)) || !ns_emit_wanted(&route_stats, base, cfg.sample_every))
		return;
	ns_output(&route_stats, base, e, sizeof(*e));
}

/* A packet's lookup or drop: counted, grouped and maybe sent when it passes every filter. */
static __always_inline int finish_if_matching(struct route_scratch *buf)
{
	struct route_event *e = &buf->event;

	if (!ns_netns_matches(cfg.netns, cfg.filter_netns, e->netns))
		return 0;
	if (!flow_matches(e) || !owner_matches(e) || !dev_matches(e))
		return 0;
	finish(buf);
	return 0;
}

/* What every lookup event shares once its key and result are in: who ran it, its namespace (the lookup's own
 * `net` when the tracepoint gives one, else see the header comment), the filters, and the count. */
static __always_inline int lookup_done(const bool direct, void *ctx, struct route_scratch *buf,
				       struct net_device *dev, __u32 lookup_netns)
{
	struct route_event *e = &buf->event;

	fill_task(ctx, e);
	if (dev)
		ns_device_rd(direct, dev, &e->ifindex, e->ifname);
	if (lookup_netns) {
		e->netns = lookup_netns;
		e->netns_from = 4;
	} else if (dev) {
		e->netns = device_netns(direct, dev);
		e->netns_from = 1;
	} else if (e->in_task) {
		e->netns = task_netns();
		e->netns_from = 2;
	} else {
		e->netns = received_netns();
		e->netns_from = 3;
	}
	return finish_if_matching(buf);
}

/* --failed keeps only reject routes: successes and misses are counted as seen and go no further. */
static __always_inline struct route_scratch *lookup_start(__u8 family, int err)
{
	__u8 kind = err == -EAGAIN ? ROUTE_EV_MISS : ROUTE_EV_LOOKUP;

	if ((cfg.errors_only && (kind == ROUTE_EV_MISS || err == 0)) || (cfg.family && cfg.family != family)) {
		count(kind, NS_STAT_SEEN);
		return 0;
	}
	return seen_scratch(kind);
}

static __always_inline void lookup_ports(const bool direct, struct route_event *e, union flowi_uli *uli)
{
	if (e->l4proto == IPPROTO_TCP || e->l4proto == IPPROTO_UDP || e->l4proto == IPPROTO_SCTP) {
		e->sport = bpf_ntohs(NS_RD(direct, uli, ports.sport));
		e->dport = bpf_ntohs(NS_RD(direct, uli, ports.dport));
	}
}

static __always_inline int on_fib_lookup(const bool direct, void *ctx, __u32 table, struct flowi4 *flp,
					 struct fib_nh_common *nhc, int err)
{
	struct route_scratch *buf = lookup_start(4, err);
	struct route_event *e;
	struct net_device *dev = 0;

	if (!buf)
		return 0;
	e = &buf->event;
	e->table = table;
	e->err = err;
	e->family = 4;
	e->oif = NS_RD(direct, flp, __fl_common.flowic_oif);
	e->iif = NS_RD(direct, flp, __fl_common.flowic_iif);
	e->mark = NS_RD(direct, flp, __fl_common.flowic_mark);
	e->scope = NS_RD(direct, flp, __fl_common.flowic_scope);
	e->l4proto = NS_RD(direct, flp, __fl_common.flowic_proto);
	{
		__be32 saddr = NS_RD(direct, flp, saddr);
		__be32 daddr = NS_RD(direct, flp, daddr);

		__builtin_memcpy(e->saddr, &saddr, 4);
		__builtin_memcpy(e->daddr, &daddr, 4);
	}
	lookup_ports(direct, e, &flp->uli);
	if (nhc) {
		dev = NS_RD(direct, nhc, nhc_dev);
		e->gw_family = NS_RD(direct, nhc, nhc_gw_family);
		if (e->gw_family == AF_INET) {
			__be32 gw = NS_RD(direct, nhc, nhc_gw.ipv4);

			e->gw_family = 4;
			__builtin_memcpy(e->gw, &gw, 4);
		} else if (e->gw_family == AF_INET6) {
			e->gw_family = 6;
			BPF_CORE_READ_INTO(&e->gw, nhc, nhc_gw.ipv6);
		} else {
			e->gw_family = 0;
		}
	}
	return lookup_done(direct, ctx, buf, dev, 0);
}

/* net/ipv6/route.c fib6_prop[]: the error a route of each RTN_* type gives (ip6_rt_type_to_error), the same
 * codes IPv4's fib_props[] gives, so both families read alike. */
static __always_inline int fib6_type_error(__u8 type)
{
	switch (type) {
	case 6:  /* RTN_BLACKHOLE */
	case 10: /* RTN_NAT */
	case 11: /* RTN_XRESOLVE */
		return -EINVAL;
	case 7: /* RTN_UNREACHABLE */
		return -EHOSTUNREACH;
	case 8: /* RTN_PROHIBIT */
		return -EACCES;
	case 9: /* RTN_THROW */
		return -EAGAIN;
	default:
		return 0;
	}
}

/* fib6:fib6_table_lookup(net, res, table, flp) fires once per table fib6_table_lookup() searched
 * (net/ipv6/route.c). A table with no matching prefix answers the namespace's fib6_null_entry: the tracepoint
 * itself tests `res->f6i == net->ipv6.fib6_null_entry`; here it is a miss (-EAGAIN), as IPv4 reports it, and
 * the rules go on to the next table. */
static __always_inline int on_fib6_lookup(const bool direct, void *ctx, struct net *net, struct fib6_result *res,
					  struct fib6_table *table, struct flowi6 *flp)
{
	struct fib6_info *f6i, *null_entry;
	struct route_scratch *buf;
	struct route_event *e;
	struct net_device *dev = 0;
	struct fib6_nh *nh;
	int err;

	if (!res || !table || !flp)
		return 0;
	f6i = NS_RD(direct, res, f6i);
	null_entry = net ? NS_RD(direct, (struct net___ipv6 *)net, ipv6.fib6_null_entry) : 0;
	err = !f6i || f6i == null_entry ? -EAGAIN : fib6_type_error(NS_RD(direct, res, fib6_type));
	buf = lookup_start(6, err);
	if (!buf)
		return 0;
	e = &buf->event;
	e->table = NS_RD(direct, table, tb6_id);
	e->err = err;
	e->family = 6;
	e->oif = NS_RD(direct, flp, __fl_common.flowic_oif);
	e->iif = NS_RD(direct, flp, __fl_common.flowic_iif);
	e->mark = NS_RD(direct, flp, __fl_common.flowic_mark);
	e->l4proto = NS_RD(direct, flp, __fl_common.flowic_proto);
	BPF_CORE_READ_INTO(&e->saddr, flp, saddr);
	BPF_CORE_READ_INTO(&e->daddr, flp, daddr);
	lookup_ports(direct, e, &flp->uli);
	/* A reject route has a next hop too (dev lo); like IPv4's, only a route that forwards names one. */
	nh = err == 0 ? NS_RD(direct, res, nh) : 0;
	if (nh) {
		dev = NS_RD(direct, nh, nh_common.nhc_dev);
		if (NS_RD(direct, nh, nh_common.nhc_gw_family) == AF_INET6) {
			e->gw_family = 6;
			BPF_CORE_READ_INTO(&e->gw, nh, nh_common.nhc_gw.ipv6);
		}
	}
	return lookup_done(direct, ctx, buf, dev, net ? ns_net_inum_rd(direct, net) : 0);
}

static __always_inline int on_receive(const bool direct, struct sk_buff *skb)
{
	__u32 zero = 0;
	__u32 *inum = bpf_map_lookup_elem(&rx_netns, &zero);

	if (inum)
		*inum = device_netns(direct, NS_RD(direct, skb, dev));
	return 0;
}

/* A neighbour event about the entry for `key` (4 or 16 bytes by family) on `dev`. */
static __always_inline int neigh_event(const bool direct, void *ctx, __u8 neigh_kind, int family,
				       struct net_device *dev, const void *key, __u8 nud_state)
{
	struct route_scratch *buf;
	struct route_event *e;

	if (cfg.errors_only && (neigh_kind == ROUTE_NEIGH_CREATED || neigh_kind == ROUTE_NEIGH_RESOLVED)) {
		count(ROUTE_EV_NEIGH, NS_STAT_SEEN);
		return 0;
	}
	buf = seen_scratch(ROUTE_EV_NEIGH);
	if (!buf || !key)
		return 0;
	e = &buf->event;
	e->neigh_kind = neigh_kind;
	e->nud_state = nud_state;
	if (family == AF_INET) {
		e->family = 4;
		bpf_probe_read_kernel(e->daddr, 4, key);
	} else if (family == AF_INET6) {
		e->family = 6;
		bpf_probe_read_kernel(e->daddr, 16, key);
	} else {
		return 0; /* DECnet, MPLS...: not a next hop of IP routes */
	}
	if (cfg.family && e->family != cfg.family)
		return 0; /* -4/-6: ARP or neighbour discovery only */
	if (dev) {
		ns_device_rd(direct, dev, &e->ifindex, e->ifname);
		e->netns = device_netns(direct, dev);
		e->netns_from = 1;
	}
	fill_task(ctx, e);
	if (!ns_netns_matches(cfg.netns, cfg.filter_netns, e->netns))
		return 0;
	if (!dev_matches(e))
		return 0;
	finish(buf);
	return 0;
}

static __always_inline int neigh_event_of(const bool direct, void *ctx, __u8 neigh_kind, struct neighbour *n,
					  __u8 nud_state)
{
	struct neigh_table *tbl;

	if (!n)
		return 0;
	tbl = NS_RD(direct, n, tbl);
	return neigh_event(direct, ctx, neigh_kind, tbl ? NS_RD(direct, tbl, family) : 0, NS_RD(direct, n, dev),
			   (void *)n->primary_key, nud_state);
}

static __always_inline int on_neigh_create(const bool direct, void *ctx, struct neigh_table *tbl,
					   struct net_device *dev, const void *pkey)
{
	return neigh_event(direct, ctx, ROUTE_NEIGH_CREATED, tbl ? NS_RD(direct, tbl, family) : 0, dev, pkey,
			   NUD_INCOMPLETE);
}

/* neigh_update fires before the state changes: n->nud_state is the old state, `new_state` the new one. */
static __always_inline int on_neigh_update(const bool direct, void *ctx, struct neighbour *n, __u8 new_state)
{
	__u8 old_state;

	if (!n)
		return 0;
	old_state = NS_RD(direct, n, nud_state);
	if ((old_state & NUD_INCOMPLETE) && (new_state & NUD_VALID))
		return neigh_event_of(direct, ctx, ROUTE_NEIGH_RESOLVED, n, new_state);
	if (new_state == NUD_FAILED && old_state != NUD_FAILED)
		return neigh_event_of(direct, ctx, ROUTE_NEIGH_FAILED, n, new_state);
	return 0;
}

/* The timer gives up after the last unanswered probe: it sets NUD_FAILED itself (no neigh_update). */
static __always_inline int on_neigh_timer(const bool direct, void *ctx, struct neighbour *n)
{
	__u8 state;

	if (!n)
		return 0;
	state = NS_RD(direct, n, nud_state);
	if (state != NUD_FAILED)
		return 0;
	return neigh_event_of(direct, ctx, ROUTE_NEIGH_FAILED, n, state);
}

static __always_inline int on_neigh_dead(const bool direct, void *ctx, struct neighbour *n)
{
	return neigh_event_of(direct, ctx, ROUTE_NEIGH_DEAD, n, n ? NS_RD(direct, n, nud_state) : 0);
}

/* A packet a FAILED neighbour held, freed from neigh_invalidate(): arp_error_report() frees it with
 * SKB_DROP_REASON_NEIGH_FAILED, but ndisc_error_report() (IPv6) with plain kfree_skb(), NOT_SPECIFIED
 * (net/ipv6/ndisc.c). Both run only for a NUD_FAILED entry, so the drop's location tells it whatever its reason. */
static __always_inline bool freed_by_failed_neighbour(__u64 location)
{
	for (int site = 0; site < ROUTE_NEIGH_FREE_SITES; site++) {
		if (location >= cfg.neigh_free_start[site] && location < cfg.neigh_free_end[site])
			return true;
	}
	return false;
}

static __always_inline int on_drop(const bool direct, void *ctx, struct sk_buff *skb, void *location,
				   __u32 reason)
{
	struct route_scratch *buf;
	struct route_event *e;
	struct packet_tuple tuple = {};
	unsigned char *l3;

	if (!bpf_map_lookup_elem(&neigh_reasons, &reason)) {
		if (!cfg.neigh_failed_reason || !freed_by_failed_neighbour((__u64)location))
			return 0;
		reason = cfg.neigh_failed_reason;
	}
	buf = seen_scratch(ROUTE_EV_DROP);
	if (!buf)
		return 0;
	e = &buf->event;
	e->reason = reason;
	ns_parse_packet_rd(direct, skb, &tuple, &l3);
	e->family = tuple.family;
	e->l4proto = tuple.l4proto;
	__builtin_memcpy(e->saddr, tuple.saddr, 16);
	__builtin_memcpy(e->daddr, tuple.daddr, 16);
	if (tuple.has_ports && tuple.l4proto != IPPROTO_ICMP && tuple.l4proto != IPPROTO_ICMPV6) {
		e->sport = tuple.sport;
		e->dport = tuple.dport;
	}
	{
		struct net_device *dev = NS_RD(direct, skb, dev);

		if (dev) {
			ns_device_rd(direct, dev, &e->ifindex, e->ifname);
			e->netns = device_netns(direct, dev);
			e->netns_from = 1;
		}
	}
	fill_task(ctx, e);
	return finish_if_matching(buf);
}

/* One body, two entry points per hook: tp_btf (typed arguments, direct reads) and raw_tp (copies). */
#define ROUTE_ENTRY(name, tracepoint, handler, ...)                           \
	SEC("tp_btf/" tracepoint)                                             \
	int BPF_PROG(name##_b)                                                \
	{                                                                     \
		unsigned long long *args = ctx;                               \
		return handler(true, __VA_ARGS__);                            \
	}                                                                     \
	SEC("raw_tp/" tracepoint)                                             \
	int BPF_PROG(name##_r)                                                \
	{                                                                     \
		unsigned long long *args = ctx;                               \
		return handler(false, __VA_ARGS__);                           \
	}

ROUTE_ENTRY(route_fib, "fib_table_lookup", on_fib_lookup, ctx, (__u32)args[0], (struct flowi4 *)args[1],
	    (struct fib_nh_common *)args[2], (int)args[3])
ROUTE_ENTRY(route_fib6, "fib6_table_lookup", on_fib6_lookup, ctx, (struct net *)args[0],
	    (struct fib6_result *)args[1], (struct fib6_table *)args[2], (struct flowi6 *)args[3])
ROUTE_ENTRY(route_rx, "netif_receive_skb", on_receive, (struct sk_buff *)args[0])
ROUTE_ENTRY(route_ncreate, "neigh_create", on_neigh_create, ctx, (struct neigh_table *)args[0],
	    (struct net_device *)args[1], (const void *)args[2])
ROUTE_ENTRY(route_nupdate, "neigh_update", on_neigh_update, ctx, (struct neighbour *)args[0], (__u8)args[2])
ROUTE_ENTRY(route_ntimer, "neigh_timer_handler", on_neigh_timer, ctx, (struct neighbour *)args[0])
ROUTE_ENTRY(route_ndead, "neigh_event_send_dead", on_neigh_dead, ctx, (struct neighbour *)args[0])
ROUTE_ENTRY(route_drop, "kfree_skb", on_drop, ctx, (struct sk_buff *)args[0], (void *)args[1], (__u32)args[2])
