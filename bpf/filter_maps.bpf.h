/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The maps behind the shared filters, declared once for every program that filters packets (drops.bpf.c,
 * tcp.bpf.c, dns.bpf.c, route.bpf.c), and the one network namespace check every object uses. An object that
 * filters by namespace only (snoop, softirq, profile) defines NS_FILTER_NETNS_ONLY before including this: it
 * gets netns_filter and ns_netns_matches, none of the packet maps. Names and layouts are the contract with
 * src/netsleuth/diagnostics/filter_maps.py, which fills them (netsleuth.bpf.abigen checks each object has
 * them: ModuleSpec.filter).
 */
#ifndef NETSLEUTH_FILTER_MAPS_BPF_H
#define NETSLEUTH_FILTER_MAPS_BPF_H

#include "packet.h"

#ifndef NS_FILTER_NETNS_ONLY
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
#endif /* !NS_FILTER_NETNS_ONLY */

/* --k8s-namespace (and a role's Kubernetes namespaces): the inodes of the network namespaces to keep, when a
 * filter names several (the pods of one Kubernetes namespace); one namespace is the config's `netns`. Not
 * preallocated: most runs never fill it, and a preallocated map costs its whole size at every start. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, __u8);
} netns_filter SEC(".maps");

/* The namespace filter of a configuration (its `netns` and `filter_netns`): the set in netns_filter when
 * `in_set`, else one inode (0 = any). Every object checks a namespace with this, and nothing else. */
static __always_inline bool ns_netns_matches(__u32 want, __u8 in_set, __u32 netns)
{
	if (in_set)
		return bpf_map_lookup_elem(&netns_filter, &netns) != NULL;
	return !want || netns == want;
}

/* ns_netns_matches on an inode that costs reads to find (the current task's): `netns` is evaluated only when
 * a namespace filter is on. */
#define NS_NETNS_WANTED(want, in_set, netns) (!(want) && !(in_set) ? true : ns_netns_matches(want, in_set, netns))

#ifndef NS_FILTER_NETNS_ONLY

/* The port filters of a configuration (0 = any) against a packet's or socket's two ends. */
static __always_inline bool ns_ports_match(__u16 port, __u16 sport, __u16 dport, __u16 source, __u16 dest)
{
	if (port && source != port && dest != port)
		return false;
	if (sport && source != sport)
		return false;
	return !dport || dest == dport;
}

/* --host (either end), --src, --dst against the LPM maps above; an event that is not IP matches none. */
static __always_inline bool ns_addresses_match(bool host, bool src, bool dst, __u8 family, const __u8 *source,
					       const __u8 *dest)
{
	if (!host && !src && !dst)
		return true;
	if (family != 4 && family != 6)
		return false;
	if (host && !ns_addr_in(&host_filter, family, source) && !ns_addr_in(&host_filter, family, dest))
		return false;
	if (src && !ns_addr_in(&src_filter, family, source))
		return false;
	return !dst || ns_addr_in(&dst_filter, family, dest);
}

/* --pid / --comm against one task (0 and an empty name match any). */
static __always_inline bool ns_task_matches(__u32 pid, const char *comm, __u32 want_pid,
					    const volatile char *want_comm)
{
	return (!want_pid || pid == want_pid) && (!want_comm[0] || ns_name_matches(comm, want_comm));
}

/* A socket held by one of the selected processes (userspace keeps owner_inodes in step with /proc). */
static __always_inline bool ns_owned_inode(__u64 ino)
{
	return ino && bpf_map_lookup_elem(&owner_inodes, &ino);
}
#endif /* !NS_FILTER_NETNS_ONLY */

#endif /* NETSLEUTH_FILTER_MAPS_BPF_H */
