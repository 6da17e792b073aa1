/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared between route.bpf.c and userspace. Fixed-width types only; the Python mirrors are generated
 * from the object's BTF (src/netsleuth/_generated/route_abi.py, `make bpf`) and checked again at load.
 */
#ifndef NETSLEUTH_ROUTE_H
#define NETSLEUTH_ROUTE_H

#include "emit.h"
#include "packet.h"

enum route_limits {
	ROUTE_MAX_GROUPS = 8192,
	ROUTE_NEIGH_REASONS = 16,
	ROUTE_NEIGH_FREE_SITES = 2,
};

/* What one event is about; each kind has its own block of enum ns_stat in `route_stats`. */
enum route_event_kind {
	ROUTE_EV_LOOKUP = 0,	/* fib(6):fib(6)_table_lookup that decided: a route (err 0) or a reject route (err < 0) */
	ROUTE_EV_MISS = 1,	/* ... a table with no matching prefix (-EAGAIN): the rules go on to the next */
	ROUTE_EV_NEIGH = 2,	/* neigh:*: a next hop's neighbour entry was created, failed, resolved or is dead */
	ROUTE_EV_DROP = 3,	/* skb:kfree_skb with a NEIGH_* reason: a packet lost waiting for its next hop */
	ROUTE_EV_KINDS = 4,
};

/* route_event.neigh_kind */
enum route_neigh_kind {
	ROUTE_NEIGH_CREATED = 1,	/* neigh:neigh_create: resolution starts (ARP/ND solicitation) */
	ROUTE_NEIGH_FAILED = 2,		/* neigh:neigh_timer_handler left it NUD_FAILED: nobody answered */
	ROUTE_NEIGH_DEAD = 3,		/* neigh:neigh_event_send_dead: a packet sent to a dead entry */
	ROUTE_NEIGH_RESOLVED = 4,	/* neigh:neigh_update to a NUD_VALID state: the next hop answered */
};

/* Read-only configuration (the object's .rodata). Zero means "no filter". */
struct route_config {
	__u64 thread_size;	/* THREAD_SIZE of this kernel, for ns_in_task */
	/* [start, end) of the kernel functions that free the packets a FAILED neighbour held (neigh_invalidate,
	 * ndisc_error_report, from kallsyms) and the NEIGH_FAILED reason value such drops are counted under. */
	__u64 neigh_free_start[ROUTE_NEIGH_FREE_SITES];
	__u64 neigh_free_end[ROUTE_NEIGH_FREE_SITES];
	__u32 neigh_failed_reason;
	__u32 pad0;
	__u32 netns;		/* netns inode to keep */
	__u32 sample_every;	/* emit one event in N (1 = all); totals stay exact */
	__u32 pid;		/* --pid (tgid), for lookups made in a task's own context */
	__u32 emit_mask;	/* 1 << kind: send events of this kind to userspace */
	char comm[16];
	char dev[16];		/* --dev: the next hop's / neighbour's / dropped packet's device */
	__u16 port;
	__u16 sport;
	__u16 dport;
	__u8 l4proto;
	__u8 filter_l4proto;
	__u8 filter_host;
	__u8 filter_src;
	__u8 filter_dst;
	__u8 filter_owner;	/* --pid/--comm */
	__u8 filter_dev;
	__u8 errors_only;	/* --failed: only reject routes, failed/dead neighbours and drops */
	__u8 family;		/* -4/-6: 4 or 6, 0 both */
	__u8 filter_netns;	/* keep only namespaces in `netns_filter` (instead of `netns`) */
	__u8 pad[2];
};

/* One event as sent to userspace. Lookups: the flow key, table, result and chosen next hop. Neighbour
 * events: daddr is the neighbour's address, ifindex/ifname its device. Drops: the packet's tuple and device. */
struct route_event {
	__u64 time_ns;		/* CLOCK_MONOTONIC */
	__u32 netns;
	__u32 table;		/* routing table id (fib_table_lookup's tb_id, fib6_table.tb6_id) */
	__s32 err;		/* 0: a route; -EINVAL blackhole, -EHOSTUNREACH unreachable, -EACCES prohibit,
				 * -ENETUNREACH throw, -EAGAIN no match in this table */
	__u32 oif;		/* the lookup's output interface constraint (0: none) */
	__u32 iif;		/* the input interface for a forwarded/received packet (loopback index for output) */
	__u32 mark;		/* fwmark */
	__u32 ifindex;		/* the chosen next hop's device / the neighbour's / the dropped packet's */
	__u32 reason;		/* ROUTE_EV_DROP: the kernel's drop reason */
	__u32 pid;		/* current task (tgid) when in_task */
	__u32 cpu;
	__u16 sport;
	__u16 dport;
	__u8 saddr[16];		/* IPv4 in the first 4 bytes */
	__u8 daddr[16];
	__u8 gw[16];		/* gateway of the chosen next hop (gw_family 0: directly connected) */
	__u8 kind;		/* enum route_event_kind */
	__u8 family;		/* 4 or 6 (neighbours, drops) */
	__u8 gw_family;
	__u8 l4proto;
	__u8 scope;
	__u8 neigh_kind;	/* enum route_neigh_kind */
	__u8 nud_state;		/* the neighbour's state after the event (NUD_* bits) */
	__u8 in_task;
	__u8 netns_from;	/* how netns was found: 1 next-hop device, 2 the task, 3 the packet received on this CPU,
				 * 4 the lookup's own struct net (fib6) */
	__u8 pad[7];
	char comm[16];
	char ifname[16];
};

/* What --summary and `diagnose` count by: the decision, not the packet (ports and pids left out). */
struct route_group_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u8 gw[16];
	__u32 netns;
	__u32 table;
	__s32 err;
	__u32 ifindex;
	__u32 iif;
	__u32 reason;
	__u8 kind;
	__u8 family;
	__u8 neigh_kind;
	__u8 pad[5];
};

struct route_group {
	__u64 count;
	__u64 first_ns;
	__u64 last_ns;
	struct route_event example;
};

struct route_abi_types {
	enum ns_stat stat;
	enum ns_emit_limits emit_limits;
	enum route_limits limits;
	enum route_event_kind kind;
	enum route_neigh_kind neigh_kind;
};

#endif /* NETSLEUTH_ROUTE_H */
