/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The maps behind the shared packet filters, declared once for every program that filters packets
 * (drops.bpf.c, tcp.bpf.c). Their names and layouts are the contract with
 * src/netsleuth/diagnostics/filter_maps.py, which fills them.
 */
#ifndef NETSLEUTH_FILTER_MAPS_BPF_H
#define NETSLEUTH_FILTER_MAPS_BPF_H

#include "packet.h"

#define NS_LPM_MAP(name)                                     \
	struct {                                             \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);         \
		__uint(max_entries, 256);                    \
		__uint(map_flags, BPF_F_NO_PREALLOC);        \
		__type(key, struct lpm_addr_key);            \
		__type(value, __u8);                         \
	} name SEC(".maps")

/* --host (either address), --src, --dst: prefixes keyed with the family (bpf/packet.h lpm_addr_key). */
NS_LPM_MAP(host_filter);
NS_LPM_MAP(src_filter);
NS_LPM_MAP(dst_filter);

/* --pid / --comm for events in softirq: inodes of the sockets the selected processes hold, kept in step
 * with /proc by userspace. Events in a task's own context are matched on the task directly. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u8);
} owner_inodes SEC(".maps");

#endif /* NETSLEUTH_FILTER_MAPS_BPF_H */
