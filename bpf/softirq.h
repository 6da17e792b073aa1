/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared between softirq.bpf.c and userspace. Fixed-width types only; the Python mirrors are generated
 * from the object's BTF (src/netsleuth/_generated/softirq_abi.py, `make bpf`) and checked again at load.
 */
#ifndef NETSLEUTH_SOFTIRQ_H
#define NETSLEUTH_SOFTIRQ_H

enum softirq_limits {
	SIRQ_MAX_VECTORS = 16,	/* NR_SOFTIRQS is 10 since 4.x; room for more (userspace names them) */
	SIRQ_BUCKETS = 32,	/* log2 buckets: of nanoseconds, b holds [2^b, 2^(b+1)) (0 also in bucket 0); of packets,
				 * 0 holds 0 and b >= 1 holds [2^(b-1), 2^b) (softirq.bpf.c count_bucket) */
	SIRQ_MAX_NAPI = 1024,	/* NAPI instances tracked (per CPU: slots of napi_polls) */
	SIRQ_NAPI_CACHE = 8,	/* per CPU: NAPI instances whose slot it remembers (a power of two) */
	SIRQ_NET_RX = 3,	/* NET_RX_SOFTIRQ (include/linux/interrupt.h; unchanged since 2.6) */
};

/* Histograms (softirq_cpu_state.hist): [vector][kind][bucket]. */
enum softirq_hist_kind {
	SIRQ_HIST_LATENCY = 0,	/* raise -> entry: how long the work waited for the CPU */
	SIRQ_HIST_DURATION = 1,	/* entry -> exit: how long the handler ran */
	SIRQ_HIST_KINDS = 2,
};

/* Counters (softirq_cpu_state.counts): [vector][counter]. */
enum softirq_counter {
	SIRQ_RAISED = 0,	/* softirq_raise while not already raised */
	SIRQ_RUNS = 1,		/* softirq_entry */
	SIRQ_MEASURED = 2,	/* runs whose raise we saw (the latency histogram's count) */
	SIRQ_LATENCY_SUM = 3,	/* ns */
	SIRQ_LATENCY_MAX = 4,
	SIRQ_DURATION_SUM = 5,	/* ns, over the runs with an entry we saw */
	SIRQ_DURATION_MAX = 6,
	SIRQ_COUNTERS = 7,
};

/* NET_RX runs (softirq_cpu_state.netrx): what net_rx_action did in each run, from the napi:napi_poll
 * events between its softirq_entry and softirq_exit. */
enum netrx_counter {
	NETRX_RUNS = 0,
	NETRX_POLLS = 1,
	NETRX_WORK = 2,		/* packets (work) summed over the polls */
	NETRX_BUDGET_RUNS = 3,	/* runs whose work reached netdev_budget: stopped on the packet budget */
	NETRX_TIME_RUNS = 4,	/* runs that lasted netdev_budget_usecs or longer: stopped on time */
	NETRX_EXHAUSTED_POLLS = 5, /* polls with work == budget: that NAPI had more and is polled again */
	NETRX_COUNTERS = 6,
};

/* Read-only configuration (the object's .rodata). */
struct softirq_config {
	__u64 budget_ns;	/* net.core.netdev_budget_usecs in ns */
	__u32 budget_packets;	/* net.core.netdev_budget */
	__u32 netns;		/* --netns: only NAPI instances of devices in it (vectors are per CPU) */
	char dev[16];		/* --dev: only this device's NAPI instances */
	__u8 filter_dev;
	__u8 filter_netns;	/* keep only namespaces in `netns_filter` (instead of `netns`) */
	__u8 pad[6];
};

/* One NAPI instance, by device and id. */
struct napi_key {
	__u32 netns;
	__u32 ifindex;
	__u32 napi_id;
	__u32 pad;
};

/* Where one CPU keeps one NAPI instance's counters (the per-CPU value of the `napi_slots` hash, keyed by
 * napi_key): its slot in the per-CPU `napi_polls` array, and its device's name when that CPU first polled
 * it. Each CPU numbers its own slots, so handing one out needs no atomic operation. */
struct napi_slot {
	__u32 slot;
	__u32 polled;		/* 1: this CPU polled the instance (slot is its own); 0: never here */
	char ifname[16];
};

/* Per CPU (the map is per-CPU): what the polls of one NAPI instance did there. */
struct napi_stats {
	__u64 polls;
	__u64 work;		/* packets handled */
	__u64 exhausted;	/* polls with work == budget */
	__u64 idle;		/* polls with no work */
	__u64 max_work;
	__u32 budget;		/* the budget of the last poll (the NAPI weight, usually 64) */
	__u32 pad;
	__u64 work_hist[SIRQ_BUCKETS]; /* polls by packets (count_bucket) */
};

/* Everything one CPU keeps (the single entry of the per-CPU `cpu_state` array): the state between the hooks
 * and every counter and histogram, so each event makes one map lookup (a few per event cost as much as the
 * rest of the program); a poll of a known NAPI instance one more, in the napi_polls array. */
struct softirq_cpu_state {
	__u64 raised_ns[SIRQ_MAX_VECTORS];
	__u64 entered_ns[SIRQ_MAX_VECTORS];
	__u64 run_work;		/* NET_RX: packets of this run so far */
	__u64 run_polls;
	__u64 counts[SIRQ_MAX_VECTORS * SIRQ_COUNTERS];
	__u64 hist[SIRQ_MAX_VECTORS * SIRQ_HIST_KINDS * SIRQ_BUCKETS];
	__u64 netrx[NETRX_COUNTERS];
	__u64 netrx_work_hist[SIRQ_BUCKETS]; /* NET_RX runs by packets (count_bucket) */
	/* The NAPI instances this CPU polled last, by napi_id modulo SIRQ_NAPI_CACHE, and their napi_polls
	 * slots plus one (0: nothing cached; SIRQ_MAX_NAPI + 1: not counted, filtered out by --dev or no slot
	 * left). A CPU polls the same few instances over and over, and comparing a key costs far less than a
	 * hash lookup. */
	struct napi_key napi_cache_key[SIRQ_NAPI_CACHE];
	__u32 napi_cache_slot[SIRQ_NAPI_CACHE];
	__u32 napi_slots_used;	/* this CPU's slots handed out */
	__u32 pad;
};

struct softirq_abi_types {
	enum softirq_limits limits;
	enum softirq_hist_kind hist_kind;
	enum softirq_counter counter;
	enum netrx_counter netrx_counter;
	struct softirq_cpu_state state;
};

#endif /* NETSLEUTH_SOFTIRQ_H */
