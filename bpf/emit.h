/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What every netsleuth program shares with userspace about counting and emitting events (bpf/emit.bpf.h is
 * the kernel side). Constants are enum values, not #defines, so they reach the object's BTF and
 * src/netsleuth/bpf/abigen.py generates their Python names from it (the modules in src/netsleuth/_generated/).
 */
#ifndef NETSLEUTH_EMIT_H
#define NETSLEUTH_EMIT_H

/* One block of per-CPU counters per kind of event. Every MATCHED event is EMITTED, SAMPLED or LOST (or not
 * offered at all when its kind is only counted), so userspace can always say what became of each one. */
enum ns_stat {
	NS_STAT_SEEN = 0,	/* the hook fired for this kind, before filters */
	NS_STAT_MATCHED = 1,	/* passed every filter: the exact total */
	NS_STAT_EMITTED = 2,	/* sent to the ring buffer */
	NS_STAT_SAMPLED = 3,	/* left out on purpose: 1-in-N sampling or a ring buffer more than half full */
	NS_STAT_LOST = 4,	/* the ring buffer had no room: a loss, always reported */
	NS_STAT_UNGROUPED = 5,	/* counted in MATCHED but the group table was full */
	NS_STAT_COUNT = 6,
};

enum ns_emit_limits {
	NS_RINGBUF_BYTES = 8 << 20,
	NS_MAX_FRAMES = 32,	/* kernel stack frames an event can carry */
};

#endif /* NETSLEUTH_EMIT_H */
