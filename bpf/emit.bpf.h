/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Counting, grouping and emitting events, the same way in every netsleuth program: each matching event is
 * counted exactly in a per-CPU stats array (blocks of NS_STAT_COUNT, bpf/emit.h) before it is offered to the
 * ring buffer, where it may be sampled away on purpose (1-in-N, or while the buffer is more than half full so
 * the consumer catches up instead of losing) or lost when the buffer is full; both are counted too.
 *
 * The maps `events` and `sample_counter` are declared here once; a program declares its own stats array and
 * group table with NS_STATS_MAP / NS_GROUP_MAP, under the names userspace reads.
 */
#ifndef NETSLEUTH_EMIT_BPF_H
#define NETSLEUTH_EMIT_BPF_H

#include "emit.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, NS_RINGBUF_BYTES);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sample_counter SEC(".maps");

/*
 * Kernels without ring buffers (BPF_MAP_TYPE_RINGBUF is 5.8+): a program that defines NS_EMIT_PERF_FALLBACK
 * before including this header also gets a perf event array `events_perf` and the switch `ns_use_perfbuf`,
 * set by userspace before load (netsleuth.bpf.program_session.PerfFallback). With the switch on, every ring
 * buffer helper below sits in a branch the verifier knows is never taken (the switch is read-only data it
 * can see), so it is removed as dead code and the retired `events` map (turned into an array by
 * netsleuth.bpf.perfbuf.retire_ring_buffer_map) is never used. Programs that do not opt in keep exactly the
 * ring buffer code they had.
 */
#ifdef NS_EMIT_PERF_FALLBACK
const volatile __u8 ns_use_perfbuf = 0;

struct {
	__uint(type, 4); /* BPF_MAP_TYPE_PERF_EVENT_ARRAY; libbpf sizes it to the possible CPUs */
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events_perf SEC(".maps");
#define NS_USE_PERFBUF ns_use_perfbuf
#else
#define NS_USE_PERFBUF 0
#endif

#define NS_STATS_MAP(name, entries)                             \
	struct {                                                \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);        \
		__uint(max_entries, entries);                   \
		__type(key, __u32);                             \
		__type(value, __u64);                           \
	} name SEC(".maps")

#define NS_GROUP_MAP(name, key_type, value_type, entries)       \
	struct {                                                \
		__uint(type, BPF_MAP_TYPE_HASH);                \
		__uint(max_entries, entries);                   \
		__type(key, key_type);                          \
		__type(value, value_type);                      \
	} name SEC(".maps")

/* A per-CPU scratch buffer of `value_type` (events are too large for the 512-byte BPF stack). */
#define NS_SCRATCH_MAP(name, value_type)                        \
	struct {                                                \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);        \
		__uint(max_entries, 1);                         \
		__type(key, __u32);                             \
		__type(value, value_type);                      \
	} name SEC(".maps")

/* Per-CPU counters need no atomics: each CPU adds to its own slot and userspace sums them. */
static __always_inline void ns_count(void *stats, __u32 index)
{
	__u64 *value = bpf_map_lookup_elem(stats, &index);

	if (value)
		*value += 1;
}

static __always_inline void ns_count_n(void *stats, __u32 index, __u64 n)
{
	__u64 *value = bpf_map_lookup_elem(stats, &index);

	if (value)
		*value += n;
}

static __always_inline bool ns_should_emit(__u32 sample_every)
{
	__u32 zero = 0;
	__u64 *counter;

	/* Back-pressure: past half full, drop to sampling so the consumer catches up instead of losing. A perf
	 * buffer has no fill level to ask: there only 1-in-N sampling applies, and a full buffer is LOST. */
	if (!NS_USE_PERFBUF && bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > NS_RINGBUF_BYTES / 2)
		return false;
	if (sample_every <= 1)
		return true;
	counter = bpf_map_lookup_elem(&sample_counter, &zero);
	if (!counter)
		return true;
	*counter += 1;
	return *counter % sample_every == 0;
}

/* Is the event that passed every filter to be sent? When not (sampled away), that is counted in the block of
 * stats that starts at `stats_base`. */
static __always_inline bool ns_emit_wanted(void *stats, __u32 stats_base, __u32 sample_every)
{
	if (ns_should_emit(sample_every))
		return true;
	ns_count(stats, stats_base + NS_STAT_SAMPLED);
	return false;
}

/* Send a record to the ring buffer and count whether it got there. */
static __always_inline void ns_output(void *stats, __u32 stats_base, void *record, __u64 size)
{
	if (bpf_ringbuf_output(&events, record, size, 0))
		ns_count(stats, stats_base + NS_STAT_LOST);
	else
		ns_count(stats, stats_base + NS_STAT_EMITTED);
}

#ifdef NS_EMIT_PERF_FALLBACK
/* ns_output to whichever buffer this kernel has (the program's context is what bpf_perf_event_output
 * needs); a record the perf buffer had no room for is counted LOST exactly as a full ring buffer's, and the
 * kernel reports the same loss to the consumer (PERF_RECORD_LOST). */
static __always_inline void ns_output_ctx(void *ctx, void *stats, __u32 stats_base, void *record, __u64 size)
{
	if (!ns_use_perfbuf) {
		ns_output(stats, stats_base, record, size);
		return;
	}
	if (bpf_perf_event_output(ctx, &events_perf, 0xffffffffULL /* BPF_F_CURRENT_CPU */, record, size))
		ns_count(stats, stats_base + NS_STAT_LOST);
	else
		ns_count(stats, stats_base + NS_STAT_EMITTED);
}
#endif

/*
 * Insert `fresh` (a group that already holds this event) under `key`. Returns 0 when it went in; otherwise the
 * group another CPU inserted first, to which the caller adds the event, or 0 after counting UNGROUPED when
 * the table is full.
 */
static __always_inline void *ns_group_insert(void *groups, const void *key, const void *fresh, void *stats,
					     __u32 stats_base)
{
	void *group;

	if (!bpf_map_update_elem(groups, key, fresh, BPF_NOEXIST))
		return 0;
	group = bpf_map_lookup_elem(groups, key);
	if (!group)
		ns_count(stats, stats_base + NS_STAT_UNGROUPED);
	return group;
}

#endif /* NETSLEUTH_EMIT_BPF_H */
