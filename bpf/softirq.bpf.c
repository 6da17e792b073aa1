// SPDX-License-Identifier: GPL-2.0
/*
 * netsleuth softirq: per CPU and vector, how long raised softirqs wait for the CPU (raise -> entry) and how
 * long they run (entry -> exit), as log2 histograms counted in the kernel; per NAPI instance, polls and work
 * against budget (napi:napi_poll); per NET_RX run, whether it stopped on netdev_budget packets or on
 * netdev_budget_usecs - what /proc/net/softnet_stat's time_squeeze lumps together.
 *
 *   irq:softirq_raise(vec)   __raise_softirq_irqoff: the vector's bit set in this CPU's pending mask. Only
 *                            the first raise until the run counts: raising a pending vector changes nothing.
 *   irq:softirq_entry(vec)   handle_softirqs calls the vector's handler (on this CPU, in irq_exit or
 *                            local_bh_enable or ksoftirqd)
 *   irq:softirq_exit(vec)    ... and it returned
 *   napi:napi_poll(napi, work, budget)   one poll of one NAPI instance (net/core/dev.c __napi_poll)
 *
 * Everything is per-CPU maps (no atomics, exact sums); userspace reads each CPU's slot.
 */
#include "netsleuth.bpf.h"
#include "netsleuth_kernel_more.h"
#include <bpf/bpf_tracing.h>
#include "softirq.h"
#define NS_FILTER_NETNS_ONLY
#include "filter_maps.bpf.h"
#include "abi.h"

char LICENSE[] SEC("license") = "GPL";

const volatile struct softirq_config cfg = {};

NS_ABI_KEEP(softirq_abi_types);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct softirq_cpu_state);
} cpu_state SEC(".maps");

/* NAPI instance -> where each CPU counts it (its slot in napi_polls) and its name: each CPU fills its own
 * value on its first poll of the instance, and looks it up again only when its cache
 * (softirq_cpu_state.napi_cache_*) misses. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, SIRQ_MAX_NAPI);
	__type(key, struct napi_key);
	__type(value, struct napi_slot);
} napi_slots SEC(".maps");

/* Per CPU and slot, what the polls did: an array, whose lookup the verifier inlines (a hash lookup is a call
 * that hashes the key and walks a bucket, on every poll). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SIRQ_MAX_NAPI);
	__type(key, __u32);
	__type(value, struct napi_stats);
} napi_polls SEC(".maps");

static __always_inline __u32 log2_bucket(__u64 value)
{
	__u32 bucket = 0;

	/* floor(log2(value)) by halving the search range: five branches instead of up to 31 loop turns on every
	 * event; values past 2^32 land in the last bucket (0 and 1 in the first). */
	if (value >> 32)
		return SIRQ_BUCKETS - 1;
	if (value >> 16) {
		value >>= 16;
		bucket += 16;
	}
	if (value >> 8) {
		value >>= 8;
		bucket += 8;
	}
	if (value >> 4) {
		value >>= 4;
		bucket += 4;
	}
	if (value >> 2) {
		value >>= 2;
		bucket += 2;
	}
	if (value >> 1)
		bucket += 1;
	return bucket;
}

/* A count of packets: bucket 0 holds 0, bucket b >= 1 holds [2^(b-1), 2^b) (bpftrace's hist() buckets), so a
 * run or poll of 1 packet is in the bucket whose lower edge is 1, and userspace labels each bucket by that edge
 * (diagnostics/softirq/counts.py CountHistogram). Counts past 2^30 share the last bucket. */
static __always_inline __u32 count_bucket(__u64 count)
{
	__u32 bucket;

	if (!count)
		return 0;
	bucket = log2_bucket(count) + 1;
	return bucket < SIRQ_BUCKETS ? bucket : SIRQ_BUCKETS - 1;
}

static __always_inline struct softirq_cpu_state *state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cpu_state, &zero);
}

/* vec < SIRQ_MAX_VECTORS (checked by the caller), kind < SIRQ_HIST_KINDS: the masks keep the verifier's
 * bounds without a branch. */
static __always_inline void record(struct softirq_cpu_state *s, __u32 vec, __u32 kind, __u64 ns)
{
	s->hist[((vec * SIRQ_HIST_KINDS + kind) * SIRQ_BUCKETS + log2_bucket(ns)) &
		(SIRQ_MAX_VECTORS * SIRQ_HIST_KINDS * SIRQ_BUCKETS - 1)]++;
}

static __always_inline __u64 *counter(struct softirq_cpu_state *s, __u32 vec, __u32 which)
{
	__u32 index = vec * SIRQ_COUNTERS + which;

	return &s->counts[index < SIRQ_MAX_VECTORS * SIRQ_COUNTERS ? index : 0];
}

/* The verifier does not carry `vec < SIRQ_MAX_VECTORS` through the masked compare the compiler makes of it;
 * a mask it cannot fold away (after the barrier) is a bound the verifier sees. */
static __always_inline __u32 vector_index(__u32 vec)
{
	barrier_var(vec);
	return vec & (SIRQ_MAX_VECTORS - 1);
}

static __always_inline int on_raise(__u32 vec)
{
	struct softirq_cpu_state *s = state();

	if (!s || vec >= SIRQ_MAX_VECTORS)
		return 0;
	vec = vector_index(vec);
	if (!s->raised_ns[vec]) {
		s->raised_ns[vec] = bpf_ktime_get_ns();
		(*counter(s, vec, SIRQ_RAISED))++;
	}
	return 0;
}

static __always_inline int on_entry(__u32 vec)
{
	struct softirq_cpu_state *s = state();
	__u64 now = bpf_ktime_get_ns();

	if (!s || vec >= SIRQ_MAX_VECTORS)
		return 0;
	vec = vector_index(vec);
	(*counter(s, vec, SIRQ_RUNS))++;
	if (s->raised_ns[vec]) {
		__u64 waited = now - s->raised_ns[vec];
		__u64 *max = counter(s, vec, SIRQ_LATENCY_MAX);

		record(s, vec, SIRQ_HIST_LATENCY, waited);
		(*counter(s, vec, SIRQ_MEASURED))++;
		*counter(s, vec, SIRQ_LATENCY_SUM) += waited;
		if (waited > *max)
			*max = waited;
		/* Cleared at entry: handle_softirqs cleared the pending mask before calling handlers, so a raise
		 * from now on is new work for a later run. */
		s->raised_ns[vec] = 0;
	}
	s->entered_ns[vec] = now;
	if (vec == SIRQ_NET_RX) {
		s->run_work = 0;
		s->run_polls = 0;
	}
	return 0;
}

static __always_inline int on_exit(__u32 vec)
{
	struct softirq_cpu_state *s = state();
	__u64 now = bpf_ktime_get_ns();
	__u64 ran, *max;

	if (!s || vec >= SIRQ_MAX_VECTORS)
		return 0;
	vec = vector_index(vec);
	if (!s->entered_ns[vec])
		return 0;
	ran = now - s->entered_ns[vec];
	s->entered_ns[vec] = 0;
	record(s, vec, SIRQ_HIST_DURATION, ran);
	*counter(s, vec, SIRQ_DURATION_SUM) += ran;
	max = counter(s, vec, SIRQ_DURATION_MAX);
	if (ran > *max)
		*max = ran;
	if (vec == SIRQ_NET_RX) {
		s->netrx[NETRX_RUNS]++;
		s->netrx[NETRX_POLLS] += s->run_polls;
		s->netrx[NETRX_WORK] += s->run_work;
		s->netrx_work_hist[count_bucket(s->run_work) & (SIRQ_BUCKETS - 1)]++;
		/* net_rx_action stops when its packet budget is spent or time_limit passed (net/core/dev.c). */
		if (cfg.budget_packets && s->run_work >= cfg.budget_packets)
			s->netrx[NETRX_BUDGET_RUNS]++;
		else if (cfg.budget_ns && ran >= cfg.budget_ns)
			s->netrx[NETRX_TIME_RUNS]++;
	}
	return 0;
}

/* This CPU's slot for a NAPI instance its cache does not hold: the one it took on its first poll of the
 * instance, or a new one; SIRQ_MAX_NAPI when the instance is not counted (--dev filters it out, or the CPU's
 * slots or the map's entries are all taken). */
static __always_inline __u32 napi_find_slot(const bool direct, struct softirq_cpu_state *s, struct net_device *dev,
					    const struct napi_key *key)
{
	struct napi_slot *mine = bpf_map_lookup_elem(&napi_slots, key);
	struct napi_slot fresh = {};
	__u32 ifindex;

	/* Only instances that passed --dev are ever inserted. */
	if (mine && mine->polled)
		return mine->slot;
	/* The name is copied (a string read) only here: to filter by it or to name the instance. */
	ns_device_rd(direct, dev, &ifindex, fresh.ifname);
	if (cfg.filter_dev && !ns_name_matches(fresh.ifname, cfg.dev))
		return SIRQ_MAX_NAPI;
	if (s->napi_slots_used >= SIRQ_MAX_NAPI)
		return SIRQ_MAX_NAPI;
	fresh.slot = s->napi_slots_used;
	fresh.polled = 1;
	if (!mine) {
		if (!bpf_map_update_elem(&napi_slots, key, &fresh, BPF_NOEXIST))
			return s->napi_slots_used++;
		/* Another CPU inserted the instance since our lookup, or the map is full. */
		mine = bpf_map_lookup_elem(&napi_slots, key);
		if (!mine)
			return SIRQ_MAX_NAPI;
	}
	/* Inserted by another CPU: this CPU's value stays zeroed until it fills it. */
	*mine = fresh;
	return s->napi_slots_used++;
}

static __always_inline int on_napi_poll(const bool direct, struct napi_struct *napi, int work, int budget)
{
	struct softirq_cpu_state *s = state();
	struct napi_key key = {};
	struct napi_stats *stats;
	struct net_device *dev;
	__u32 slot, entry;

	if (!s || !napi)
		return 0;
	if (work > 0) {
		s->run_work += work;
		if (work >= budget)
			s->netrx[NETRX_EXHAUSTED_POLLS]++;
	}
	s->run_polls++;
	dev = NS_RD(direct, napi, dev);
	if (dev) {
		key.ifindex = NS_RD(direct, dev, ifindex);
		key.netns = ns_net_inum_rd(direct, NS_RD(direct, dev, nd_net.net));
	}
	if (!ns_netns_matches(cfg.netns, cfg.filter_netns, key.netns))
		return 0;
	key.napi_id = NS_RD(direct, napi, napi_id);
	/* The whole key is compared, not the napi pointer: a freed and reused napi_struct, or a device moved to
	 * another namespace, must not be counted as the instance the entry was filled for. */
	entry = key.napi_id & (SIRQ_NAPI_CACHE - 1);
	slot = s->napi_cache_slot[entry];
	if (!slot || s->napi_cache_key[entry].napi_id != key.napi_id ||
	    s->napi_cache_key[entry].ifindex != key.ifindex || s->napi_cache_key[entry].netns != key.netns) {
		slot = napi_find_slot(direct, s, dev, &key) + 1;
		s->napi_cache_key[entry] = key;
		s->napi_cache_slot[entry] = slot;
	}
	slot -= 1;
	if (slot >= SIRQ_MAX_NAPI)
		return 0;
	stats = bpf_map_lookup_elem(&napi_polls, &slot);
	if (!stats)
		return 0;
	stats->polls++;
	stats->budget = budget;
	if (work <= 0) {
		stats->idle++;
		stats->work_hist[0]++;
		return 0;
	}
	stats->work += work;
	if (work >= budget)
		stats->exhausted++;
	if ((__u64)work > stats->max_work)
		stats->max_work = work;
	stats->work_hist[count_bucket(work) & (SIRQ_BUCKETS - 1)]++;
	return 0;
}

#define SIRQ_ENTRY(name, tracepoint, handler, ...)                            \
	SEC("tp_btf/" tracepoint)                                             \
	int BPF_PROG(name##_b)                                                \
	{                                                                     \
		unsigned long long *args = ctx;                               \
		return handler(__VA_ARGS__);                                  \
	}                                                                     \
	SEC("raw_tp/" tracepoint)                                             \
	int BPF_PROG(name##_r)                                                \
	{                                                                     \
		unsigned long long *args = ctx;                               \
		return handler(__VA_ARGS__);                                  \
	}

SIRQ_ENTRY(sirq_raise, "softirq_raise", on_raise, (__u32)args[0])
SIRQ_ENTRY(sirq_entry, "softirq_entry", on_entry, (__u32)args[0])
SIRQ_ENTRY(sirq_exit, "softirq_exit", on_exit, (__u32)args[0])

SEC("tp_btf/napi_poll")
int BPF_PROG(sirq_napi_b)
{
	unsigned long long *args = ctx;

	return on_napi_poll(true, (struct napi_struct *)args[0], (int)args[1], (int)args[2]);
}

SEC("raw_tp/napi_poll")
int BPF_PROG(sirq_napi_r)
{
	unsigned long long *args = ctx;

	return on_napi_poll(false, (struct napi_struct *)args[0], (int)args[1], (int)args[2]);
}
