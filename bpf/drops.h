/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared between drops.bpf.c and userspace. Fixed-width types only. Python's ctypes mirrors are generated
 * from the compiled object's BTF (src/netsleuth/_generated/drops_abi.py, `make bpf`) and every member's name,
 * offset and size is checked against the object again at load.
 */
#ifndef NETSLEUTH_DROPS_H
#define NETSLEUTH_DROPS_H

#include "packet.h"

#include "emit.h"

enum drops_limits {
	DROPS_MAX_FRAMES = NS_MAX_FRAMES,
	DROPS_EXAMPLE_FRAMES = 12,
	DROPS_MAX_SNAPLEN = 2048,
	DROPS_MAX_GROUPS = 8192,
	DROPS_REASON_FILTER_SIZE = 1024,
	/* How long a CPU reuses the stack it unwound for a netfilter drop's hook (struct drop_hook_path). */
	DROPS_HOOK_PATH_NS = 10 * 1000 * 1000,
};

/* The per-CPU `drop_stats` array is one block of enum ns_stat (bpf/emit.h). */

/* Read-only configuration, set by the loader before load (the object's .rodata). Zero means "no filter". */
struct drops_config {
	__u32 netns;		   /* netns inode to keep */
	__u32 sample_every;	   /* emit one event in N (1 = all); totals stay exact */
	__u16 snaplen;		   /* packet bytes to copy into each event (pcap) */
	__u16 port;		   /* either end */
	__u16 sport;
	__u16 dport;
	__u8 l4proto;		   /* IPPROTO_*; valid when filter_l4proto */
	__u8 filter_l4proto;
	__u8 family;		   /* 4 or 6 */
	__u8 filter_reasons;	   /* 1: keep only reasons in `reason_filter`, 2: drop those in it */
	__u8 filter_host;	   /* check `host_filter` LPM for either address */
	__u8 filter_src;
	__u8 filter_dst;
	__u8 filter_owner;	   /* --pid / --comm: the task itself, or a socket in owner_inodes */
	__u8 want_stack;
	__u8 emit_events;	   /* 0 in --summary mode: only count */
	__u8 filter_dev;
	/* What the kernel offers is read from its BTF at load (drops.bpf.c); these two make the program behave as
	 * on a kernel without it (NETSLEUTH_DROPS_FALLBACK, the tests of the older kernels' paths). */
	__u8 ignore_reason;	   /* 1: do not read `reason` (nor rx_sk), as before 5.17: events and groups carry 0
				    * and userspace infers the reason from the location (kernel/inferred_reasons.py) */
	__u8 ignore_task_btf;	   /* 1: bpf_get_current_task and copies, as before 5.11 */
	__u8 filter_netns;	   /* keep only namespaces in `netns_filter` (instead of `netns`) */
	char dev[16];
	__u32 pid;		   /* --pid (tgid); 0 = any */
	__u32 self_tgid;	   /* netsleuth's own process: its tools' purged netlink sockets are not counted
				    * (bpf/own_sockets.bpf.h); 0 = count everything */
	char comm[16];		   /* --comm; empty = any */
	__u64 thread_size;	   /* THREAD_SIZE of this kernel, for ns_in_task */
};

/* One drop as sent to userspace: this header, then `nr_frames` u64 kernel addresses, then `caplen` bytes of
 * the packet starting at its network header. */
struct drop_event {
	__u64 time_ns;		/* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u64 location;		/* the address that freed the skb */
	__u64 sock_ino;		/* inode of the socket the packet belongs to; 0 when none */
	__u32 reason;		/* the kernel's drop reason; 0 when it is not read (has_reason()) */
	__u32 netns;
	__u32 pid;		/* tgid of the task the drop happened in, 0 in softirq/hardirq */
	__u32 tid;
	__u32 ifindex;
	__u32 skb_len;
	__u32 cpu;
	__u16 caplen;
	__u16 nr_frames;
	struct packet_tuple tuple;
	__u8 in_task;		/* 1: process context, so pid/comm are the task that dropped it; 0: softirq/irq */
	__u8 kthread;		/* that task is a kernel thread (ksoftirqd, a NAPI thread...) */
	__u8 sk_state;		/* TCP state of the owning socket, 0xff when none */
	__u8 pad[5];
	char comm[16];
	char ifname[16];
};

struct drop_group_key {
	__u64 location;
	__u32 reason;
	__u32 netns;
};

struct drop_group {
	__u64 count;
	__u64 bytes;
	struct drop_event example;
	__u64 example_frames[DROPS_EXAMPLE_FRAMES];
};

/*
 * The kind of drop this CPU counted last, and how many drops of it (and their bytes) are not yet in its
 * drop_groups entry. A storm of one kind then costs a compare and two plain adds per drop instead of a hash
 * lookup and two locked adds; the run goes into the group when a drop of another kind comes to this CPU
 * (that drop is added to its own group directly, and its kind is the one the next run counts).
 * Userspace adds the runs still pending (per-CPU `drop_runs`) when it reads the groups; `flushes` is odd
 * while a run is being added, and a reader that sees it change reads again.
 */
struct drop_run {
	struct drop_group_key key;
	__u64 count;
	__u64 bytes;
	__u64 flushes;
};

/*
 * The stack this CPU last unwound for a NETFILTER_DROP event, and the drop it was unwound for. Without --stack
 * the frames serve only to name the netfilter hook (src/netsleuth/firewall/hooks.py: the frame after
 * nf_hook_slow), and unwinding costs ~2 µs per drop on this kernel, four times the rest of the program: a storm
 * of one flow dropped by one rule would spend most of the sender's CPU on it. The next drop on this CPU with
 * the same path - location, netns, device, task (or none, in softirq) and the same packet: addresses, ports,
 * protocol, TCP flags and length - is given these frames for up to DROPS_HOOK_PATH_NS, and then the stack is
 * unwound again. Identical packets from one task through one device meet the same rules in the same order, so
 * they are dropped in the same hook unless the ruleset changes (or a rule counts or samples packets), and a
 * change is seen within that time. --stack unwinds every event.
 */
struct drop_hook_path {
	__u64 taken_ns;		/* when the frames were unwound; 0: nothing yet */
	__u64 location;
	__u32 netns;
	__u32 ifindex;
	__u32 tid;		/* 0 in softirq/hardirq */
	__u32 bytes;		/* of frames */
	struct packet_tuple tuple;
	__u64 frames[DROPS_MAX_FRAMES];
};

/* The enums userspace mirrors that no map or variable uses: drops.bpf.c keeps them in its BTF (bpf/abi.h). */
struct drops_abi_types {
	enum ns_stat stat;
	enum ns_emit_limits emit_limits;
	enum drops_limits limits;
};

#endif /* NETSLEUTH_DROPS_H */
