/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Structs shared between dns.bpf.c and src/netsleuth/_generated/dns_abi.py. Fixed-width types only; the Python
 * side is generated from this object's BTF (`make bpf`: src/netsleuth/bpf/abigen.py), never written by hand.
 */
#ifndef NETSLEUTH_DNS_H
#define NETSLEUTH_DNS_H

#include "packet.h"

/* Limits shared with userspace: enum values, not #defines, so they reach the BTF (bpf/emit.h says why). */
enum dns_limits {
	DNS_QNAME_MAX = 96,		/* wire bytes of the question name kept in the kernel (groups, timeouts) */
	DNS_PAYLOAD_MAX = 1024,		/* DNS message bytes copied into an answer event */
	DNS_DROP_BYTES = 192,		/* bytes from the network header copied into a drop event */
	DNS_MAX_FRAMES = 24,		/* kernel stack of a dropped DNS packet (names the netfilter hook) */
	DNS_MAX_PENDING = 65536,	/* queries waiting for their answer */
	DNS_MAX_GROUPS = 8192,
	DNS_LATENCY_BUCKETS = 100,	/* 4 per power of two of microseconds: 0 us .. ~30 s */
	DNS_RCODES = 16,
};

/* Indices of the per-CPU `dns_stats` array. The first six are bpf/emit.h's enum ns_stat (EventTotals). */
enum dns_stat {
	DNS_STAT_SEEN = 0,	   /* DNS messages at the socket hooks, client or server side, before filters */
	DNS_STAT_MATCHED = 1,	   /* records after filters: answers (joined or not) and drops */
	DNS_STAT_EMITTED = 2,	   /* sent to the ring buffer */
	DNS_STAT_SAMPLED = 3,	   /* left out on purpose: 1-in-N, or the ring more than half full */
	DNS_STAT_LOST = 4,	   /* the ring buffer had no room */
	DNS_STAT_UNGROUPED = 5,	   /* a query or answer the summary table had no room for */
	DNS_STAT_QUERIES = 6,	   /* client queries sent (retransmissions included) */
	DNS_STAT_ANSWERS = 7,	   /* answers joined with their query */
	DNS_STAT_UNMATCHED = 8,	   /* answers with no pending query: asked before the trace, or after --timeout */
	DNS_STAT_UNTRACKED = 9,	   /* queries not remembered: the pending table was full */
	DNS_STAT_RETRANSMITS = 10, /* the same id sent again on the same socket before an answer */
	DNS_STAT_DROPS = 11,	   /* DNS packets the kernel dropped (skb:kfree_skb) */
	DNS_STAT_FILTERED = 12,	   /* answers counted but not sent because --rcode or --slow leaves them out */
	DNS_STAT_COUNT = 13,
};

/* A second block of ns_stat counters, from DNS_CONTEXT_STATS on: drops in namespaces outside --netns, sent
 * only so that a timeout can be joined with its cause there (a firewall in the server's namespace on this
 * host). Kept apart so the filtered totals stay what they say. */
enum dns_context_stats {
	DNS_CONTEXT_STATS = 13,
	DNS_STATS_SIZE = 19,	   /* DNS_CONTEXT_STATS + NS_STAT_COUNT */
};

enum dns_event_kind {
	DNS_EVENT_ANSWER = 1,	 /* an answer joined with its query (`query` is filled) */
	DNS_EVENT_UNMATCHED = 2, /* an answer with no pending query */
	DNS_EVENT_DROP = 3,	 /* a DNS packet freed with a drop reason; frames and packet bytes follow */
};

/* Read-only configuration (.rodata), set by the loader. Zero means "no filter". Ports and addresses are in
 * the query's direction: source = the client, destination = the server. */
struct dns_config {
	__u32 netns;
	__u32 sample_every;
	__u32 pid;
	__u32 rcode_mask;	   /* emit answers whose rcode bit is set; 0 = every rcode */
	__u64 slow_ns;		   /* emit answers at least this slow; 0 = all */
	__u64 thread_size;	   /* THREAD_SIZE, for "does this run on the task's own stack?" */
	__u32 consumed_reason;	   /* SKB_CONSUMED, or ~0 */
	__u32 not_dropped_reason;  /* SKB_NOT_DROPPED_YET, or ~0 */
	__u16 dns_port;		   /* the server port that makes a packet DNS (53) */
	__u16 port;
	__u16 sport;
	__u16 dport;
	__u8 l4proto;
	__u8 filter_l4proto;
	__u8 family;
	__u8 filter_host;
	__u8 filter_src;
	__u8 filter_dst;
	__u8 filter_owner;
	__u8 filter_dev;
	__u8 emit_events;	   /* 0 in --summary mode: only count (drops are still sent) */
	__u8 has_rx_sk;		   /* kfree_skb passes the receiving socket (6.11+) */
	__u8 per_server;	   /* group by server only (the agent's metrics: no process or name labels) */
	__u8 filter_netns;	   /* keep only namespaces in `netns_filter` (instead of `netns`) */
	__u8 pad[4];
	char dev[16];
	char comm[16];
};

/* Who asked what of whom: the summary's key, and what a pending query remembers for a timeout. */
struct dns_group_key {
	__u8 server[16];
	__u32 tgid;		   /* 0 when the query left in softirq (userspace then asks the socket's owner) */
	__u32 netns;
	__u16 qtype;
	__u16 server_port;
	__u8 family;
	__u8 l4proto;
	__u8 qname_len;		   /* wire bytes in qname, the final zero label included when it fits */
	__u8 qname_cut;		   /* the name is longer than DNS_QNAME_MAX */
	char comm[16];
	__u8 qname[DNS_QNAME_MAX];
};

struct dns_pending_key {
	__u64 cookie;		   /* bpf_get_socket_cookie(): the same socket on the way out and in */
	__u16 id;
	__u16 pad[3];
};

struct dns_query {
	struct dns_group_key group;
	__u64 sent_ns;		   /* bpf_ktime_get_ns() of the first send */
	__u64 sock_ino;
	__u8 client[16];
	__u32 tid;
	__u32 ifindex;
	__u16 client_port;
	__u16 query_len;
	__u8 in_task;		   /* sent in the asking task's own context */
	__u8 kthread;
	__u8 retransmits;
	__u8 pad;
};

struct dns_group {
	__u64 queries;
	__u64 answers;
	__u64 retransmits;
	__u64 truncated;
	__u64 answer_records;
	__u64 latency_sum_ns;
	__u64 rcodes[DNS_RCODES];
	__u64 latency[DNS_LATENCY_BUCKETS];
};

/* One record sent to userspace: this header, then `nr_frames` u64 kernel addresses, then `caplen` bytes
 * (answers: the DNS message; drops: the packet from its network header). */
struct dns_event {
	__u64 time_ns;
	__u64 cookie;
	__u64 latency_ns;
	__u64 location;		   /* DROP: the address that freed the skb */
	__u64 sock_ino;		   /* the socket the packet belongs to, 0 when none */
	struct dns_query query;	   /* ANSWER: the joined query */
	struct packet_tuple tuple; /* the packet as seen (an answer: server -> client) */
	__u32 reason;		   /* DROP */
	__u32 netns;
	__u32 pid;		   /* DROP: the current task when in_task */
	__u32 tid;
	__u32 ifindex;
	__u16 dns_len;		   /* the DNS message's length (TCP: without the 2-byte prefix) */
	__u16 caplen;
	__u16 nr_frames;
	__u16 id;
	__u8 kind;		   /* enum dns_event_kind */
	__u8 rcode;
	__u8 flags_hi;		   /* DNS header byte 2: QR, opcode, AA, TC, RD */
	__u8 in_task;
	__u8 kthread;
	__u8 context;		   /* DROP outside the filters: for joining timeouts only, not a record */
	__u8 pad[2];
	char comm[16];
};

/* Every enum userspace mirrors, named in one kept variable so they reach the BTF (bpf/abi.h). */
struct dns_abi_types {
	enum dns_stat stat;
	enum dns_event_kind kind;
	enum dns_limits limits;
	enum dns_context_stats context_stats;
};

#endif /* NETSLEUTH_DNS_H */
