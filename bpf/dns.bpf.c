// SPDX-License-Identifier: GPL-2.0
/*
 * netsleuth dns: every DNS query a process sends and the answer its socket receives, joined in the kernel.
 *
 * Hooks (why: docs/dns.md). cgroup_skb egress/ingress on the cgroup v2 root sees every socket of every
 * process in every network namespace, at the socket itself: a query on its way out of the sending socket (in
 * the sender's own syscall for UDP), an answer when the receiving socket's filter runs (sk_filter, before a
 * full receive buffer can refuse it). The socket cookie is the same on the way out and in, so (cookie, DNS id)
 * joins an answer to its query whatever the namespace, NAT or address family. skb:kfree_skb adds the DNS
 * packets the kernel dropped, so a timeout can be tied to its cause.
 *
 * Counting is exact and in the kernel: per-CPU `dns_stats`, and per (process, server, name, type) groups with
 * answers by rcode and a latency histogram. Answer events are offered to the ring buffer afterwards and may
 * be filtered out by --rcode/--slow, sampled or lost (each counted apart). Timeouts are the pending queries userspace finds older than
 * --timeout; it deletes them, so a late answer finds nothing and is counted as unmatched, never twice.
 */
#include "netsleuth.bpf.h"
#include <bpf/bpf_tracing.h>
#include "dns.h"
#include "abi.h"
#include "emit.bpf.h"
#include "filter_maps.bpf.h"
#include "kfree_skb.bpf.h"
#include "stack.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/*
 * The socket-filter context (include/uapi/linux/bpf.h, UAPI: the verifier rewrites these offsets, so the
 * layout is fixed and must not be CO-RE relocated). Only the fields up to `ifindex` are read here.
 */
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 mark;
	__u32 queue_mapping;
	__u32 protocol;
	__u32 vlan_present;
	__u32 vlan_tci;
	__u32 vlan_proto;
	__u32 priority;
	__u32 ingress_ifindex;
	__u32 ifindex;
};

/* The kernel's struct sk_buff behind a program's __sk_buff context (kfunc, Linux 6.3+). */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

const volatile struct dns_config cfg = {
	.sample_every = 1,
	.dns_port = 53,
	.consumed_reason = ~0U,
	.not_dropped_reason = ~0U,
};

NS_ABI_KEEP(dns_abi_types);

NS_STATS_MAP(dns_stats, DNS_STATS_SIZE);
NS_GROUP_MAP(dns_groups, struct dns_group_key, struct dns_group, DNS_MAX_GROUPS);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, DNS_MAX_PENDING);
	__type(key, struct dns_pending_key);
	__type(value, struct dns_query);
} pending SEC(".maps");

struct dns_scratch {
	struct dns_event event;
	__u8 tail[DNS_MAX_FRAMES * 8 + DNS_PAYLOAD_MAX];
	struct dns_query query;	     /* a query being built, or the pending one copied before its delete */
	struct dns_group fresh;	     /* a zeroed group to insert */
};

NS_SCRATCH_MAP(scratch, struct dns_scratch);

/* What the socket hooks read of one packet. */
struct dns_packet {
	struct packet_tuple tuple;
	__u32 dns_off;		/* offset of the DNS header in the skb (from the network header) */
	__u32 dns_len;
	__u8 header[12];
};

static __always_inline void count(enum dns_stat stat)
{
	ns_count(&dns_stats, stat);
}

/* The drops filters (bpf/filter_maps.bpf.h), on a tuple in the query's direction (client -> server). */
static __always_inline bool tuple_matches(const struct packet_tuple *tuple)
{
	if (cfg.filter_l4proto && tuple->l4proto != cfg.l4proto)
		return false;
	if (cfg.family && tuple->family != cfg.family)
		return false;
	return ns_ports_match(cfg.port, cfg.sport, cfg.dport, tuple->sport, tuple->dport) &&
	       ns_addresses_match(cfg.filter_host, cfg.filter_src, cfg.filter_dst, tuple->family, tuple->saddr,
				  tuple->daddr);
}

static __always_inline void reverse_tuple(const struct packet_tuple *in, struct packet_tuple *out)
{
	*out = *in;
	__builtin_memcpy(out->saddr, in->daddr, 16);
	__builtin_memcpy(out->daddr, in->saddr, 16);
	out->sport = in->dport;
	out->dport = in->sport;
}

/*
 * IP and UDP/TCP headers of a packet at a socket hook, where the context's data starts at the network header.
 * Only what can be DNS of the wanted side passes: a query leaving for port `dns_port`, an answer arriving
 * from it. IPv6 extension headers and IPv4 fragments are not followed (DNS clients do not send them).
 */
static __always_inline bool parse_dns(struct __sk_buff *skb, bool egress, struct dns_packet *pkt)
{
	__u8 ip[40], l4[20];
	__u32 len = skb->len, l4off;
	__u8 proto;

	if (bpf_skb_load_bytes(skb, 0, ip, 20))
		return false;
	if ((ip[0] >> 4) == 4) {
		l4off = (ip[0] & 0xf) * 4;
		if (l4off < 20 || (((ip[6] << 8) | ip[7]) & 0x3fff))
			return false;
		proto = ip[9];
		pkt->tuple.family = 4;
		__builtin_memcpy(pkt->tuple.saddr, ip + 12, 4);
		__builtin_memcpy(pkt->tuple.daddr, ip + 16, 4);
	} else if ((ip[0] >> 4) == 6) {
		if (bpf_skb_load_bytes(skb, 0, ip, 40))
			return false;
		l4off = 40;
		proto = ip[6];
		pkt->tuple.family = 6;
		__builtin_memcpy(pkt->tuple.saddr, ip + 8, 16);
		__builtin_memcpy(pkt->tuple.daddr, ip + 24, 16);
	} else {
		return false;
	}
	if (proto != IPPROTO_UDP && proto != IPPROTO_TCP)
		return false;
	if (bpf_skb_load_bytes(skb, l4off, l4, 8))
		return false;
	pkt->tuple.sport = (l4[0] << 8) | l4[1];
	pkt->tuple.dport = (l4[2] << 8) | l4[3];
	if (egress ? pkt->tuple.dport != cfg.dns_port : pkt->tuple.sport != cfg.dns_port)
		return false;
	pkt->tuple.l4proto = proto;
	pkt->tuple.has_ports = 1;
	pkt->tuple.l3_len = len;
	if (proto == IPPROTO_UDP) {
		pkt->dns_off = l4off + 8;
		if (len < pkt->dns_off + 12)
			return false;
		pkt->dns_len = len - pkt->dns_off;
	} else {
		__u8 prefix[2];
		__u32 doff;

		if (bpf_skb_load_bytes(skb, l4off, l4, 20))
			return false;
		pkt->tuple.tcp_flags = l4[13];
		doff = (l4[12] >> 4) * 4;
		/* DNS over TCP: a 2-byte length, then the message. Segments without a message start (handshake,
		 * ACKs, the rest of a long answer) are not DNS messages. */
		if (doff < 20 || len < l4off + doff + 2 + 12)
			return false;
		if (bpf_skb_load_bytes(skb, l4off + doff, prefix, 2))
			return false;
		pkt->dns_off = l4off + doff + 2;
		pkt->dns_len = (prefix[0] << 8) | prefix[1];
		if (pkt->dns_len < 12)
			return false;
	}
	pkt->dns_off &= 0xff; /* at most 60 + 60 + 2: keeps the offset provably small */
	if (bpf_skb_load_bytes(skb, pkt->dns_off, pkt->header, 12))
		return false;
	return true;
}

/* Runs on the task's own stack (process context), not an IRQ stack: see ns_in_task in netsleuth.bpf.h. Our
 * frame is located by a local's address: socket-filter programs run on the kernel stack, never a private one. */
static __always_inline bool on_task_stack(bool *kthread)
{
	struct task_struct *task = bpf_get_current_task_btf();
	volatile __u64 marker = 0;
	__u64 stack = (__u64)task->stack;
	__u64 frame = (__u64)&marker;

	*kthread = task->flags & PF_KTHREAD;
	return frame >= stack && frame < stack + cfg.thread_size;
}

/* The process's name: its thread group leader's comm (dig sends from a thread named isc-net-0000). A CO-RE
 * flavor of task_struct (the ___ suffix is dropped when libbpf matches it to the kernel's type). */
struct task_struct___leader {
	struct task_struct___leader *group_leader;
	char comm[16];
} __attribute__((preserve_access_index));

static __always_inline void process_name(char *comm)
{
	struct task_struct___leader *task = (void *)bpf_get_current_task();

	if (BPF_CORE_READ_STR_INTO((char(*)[16])comm, task, group_leader, comm) <= 0)
		bpf_get_current_comm(comm, 16);
}

static __always_inline __u64 socket_inode(struct __sk_buff *skb, __u32 *netns)
{
	struct sk_buff *kskb = bpf_cast_to_kern_ctx(skb);
	struct sock *sk = kskb->sk;

	*netns = sk ? ns_net_inum_rd(true, sk->__sk_common.skc_net.net) : 0;
	return ns_sock_ino_rd(true, sk);
}

static __always_inline bool dev_matches(struct __sk_buff *skb)
{
	struct sk_buff *kskb = bpf_cast_to_kern_ctx(skb);
	struct net_device *dev = kskb->dev;
	char name[16] = {};

	if (!dev)
		return false;
	bpf_probe_read_kernel_str(name, sizeof(name), dev->name);
	return ns_name_matches(name, cfg.dev);
}

/*
 * The question's name (wire format) into the key, its length, and the query type after it. A global function:
 * the verifier checks it once on its own instead of once per path into it, which keeps the label walk cheap.
 */
__noinline int read_question(struct __sk_buff *skb, __u32 name_off, __u32 dns_len, struct dns_group_key *key)
{
	__u64 available, at = 0;
	bool ended = false;
	__u8 qtype[2];

	if (!key || dns_len <= 12)
		return 0;
	/* Opaque masks the compiler cannot fold away: the verifier must see the bound on the very register
	 * that sizes or indexes a copy. */
	available = dns_len - 12;
	asm volatile("%0 &= 127" : "+r"(available));
	if (available > DNS_QNAME_MAX)
		available = DNS_QNAME_MAX;
	if (available < 1 || bpf_skb_load_bytes(skb, name_off, key->qname, available))
		return 0;
	/* At most DNS_QNAME_MAX / 2 labels fit. */
	for (int label = 0; label < DNS_QNAME_MAX / 2; label++) {
		__u64 index = at;
		__u8 length;

		if (at >= available)
			break;
		asm volatile("%0 &= 127" : "+r"(index));
		if (index >= DNS_QNAME_MAX)
			break;
		length = key->qname[index];
		if (length == 0) {
			at += 1;
			ended = true;
			break;
		}
		if (length > 63) /* a compression pointer or garbage: not a plain question */
			break;
		at += length + 1;
	}
	if (at > available)
		at = available;
	/* Load the name again over zeroes, so the key holds nothing after it (equal names, equal keys). */
	__builtin_memset(key->qname, 0, DNS_QNAME_MAX);
	asm volatile("%0 &= 127" : "+r"(at));
	if (at < 1 || at > DNS_QNAME_MAX)
		return 0;
	if (bpf_skb_load_bytes(skb, name_off, key->qname, at))
		return 0;
	key->qname_len = at;
	key->qname_cut = !ended;
	if (ended && !bpf_skb_load_bytes(skb, name_off + at, qtype, 2))
		key->qtype = (qtype[0] << 8) | qtype[1];
	return 0;
}

static __always_inline struct dns_group *group_of(struct dns_scratch *buf, const struct dns_group_key *key,
						  bool create)
{
	struct dns_group *group = bpf_map_lookup_elem(&dns_groups, key);

	if (group || !create)
		return group;
	__builtin_memset(&buf->fresh, 0, sizeof(buf->fresh));
	/* BPF_NOEXIST: another CPU may have inserted it meanwhile; then use theirs. */
	bpf_map_update_elem(&dns_groups, key, &buf->fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&dns_groups, key);
}

static __always_inline void handle_query(struct __sk_buff *skb, struct dns_packet *pkt, struct dns_scratch *buf)
{
	struct dns_pending_key key = {};
	struct dns_query *query = &buf->query;
	struct dns_query *existing;
	struct dns_group *group;
	__u32 netns = 0;
	__u64 sock_ino;
	bool kthread = false;

	sock_ino = socket_inode(skb, &netns);
	if (!ns_netns_matches(cfg.netns, cfg.filter_netns, netns))
		return;
	if (!tuple_matches(&pkt->tuple))
		return;
	if (cfg.filter_dev && !dev_matches(skb))
		return;

	__builtin_memset(query, 0, sizeof(*query));
	query->in_task = on_task_stack(&kthread);
	query->kthread = kthread;
	if (query->in_task && !kthread) {
		__u64 pid_tgid = bpf_get_current_pid_tgid();

		query->group.tgid = pid_tgid >> 32;
		query->tid = (__u32)pid_tgid;
		process_name(query->group.comm);
	}
	if (cfg.filter_owner && !(query->group.tgid && ns_task_matches(query->group.tgid, query->group.comm, cfg.pid,
								   cfg.comm)) &&
	    !ns_owned_inode(sock_ino))
		return;
	count(DNS_STAT_QUERIES);

	__builtin_memcpy(query->group.server, pkt->tuple.daddr, 16);
	query->group.server_port = pkt->tuple.dport;
	query->group.netns = netns;
	query->group.family = pkt->tuple.family;
	query->group.l4proto = pkt->tuple.l4proto;
	read_question(skb, pkt->dns_off + 12, pkt->dns_len, &query->group);
	__builtin_memcpy(query->client, pkt->tuple.saddr, 16);
	query->client_port = pkt->tuple.sport;
	query->sent_ns = bpf_ktime_get_ns();
	query->sock_ino = sock_ino;
	query->query_len = pkt->dns_len;
	query->ifindex = skb->ifindex;

	if (cfg.per_server) {
		/* The agent's groups: a long-running exporter must not fill the table with names and processes. */
		query->group.tgid = 0;
		query->group.netns = 0;
		query->group.qtype = 0;
		query->group.qname_len = 0;
		query->group.qname_cut = 0;
		__builtin_memset(query->group.comm, 0, sizeof(query->group.comm));
		__builtin_memset(query->group.qname, 0, sizeof(query->group.qname));
	}
	group = group_of(buf, &query->group, true);
	if (group)
		__sync_fetch_and_add(&group->queries, 1);
	else
		count(DNS_STAT_UNGROUPED);

	key.cookie = bpf_get_socket_cookie(skb);
	key.id = (pkt->header[0] << 8) | pkt->header[1];
	if (bpf_map_update_elem(&pending, &key, query, BPF_NOEXIST) == 0)
		return;
	/* The same id again on the same socket before an answer: a resolver's retransmission. The latency the
	 * application sees still runs from the first send, so the pending query is kept. */
	existing = bpf_map_lookup_elem(&pending, &key);
	if (existing) {
		existing->retransmits += 1;
		count(DNS_STAT_RETRANSMITS);
		if (group)
			__sync_fetch_and_add(&group->retransmits, 1);
	} else {
		count(DNS_STAT_UNTRACKED);
	}
}

/* Microseconds into 4 buckets per power of two (bucket b >= 4 starts at (4 + b % 4) << (b / 4 - 1)). */
static __always_inline __u32 latency_bucket(__u64 latency_ns)
{
	__u64 us = latency_ns / 1000, v;
	__u32 log = 0, bucket;

	if (us < 4)
		return us;
	v = us;
	if (v >> 32) { v >>= 32; log += 32; }
	if (v >> 16) { v >>= 16; log += 16; }
	if (v >> 8) { v >>= 8; log += 8; }
	if (v >> 4) { v >>= 4; log += 4; }
	if (v >> 2) { v >>= 2; log += 2; }
	if (v >> 1) { log += 1; }
	bucket = (log - 1) * 4 + ((us >> (log - 2)) & 3);
	return bucket < DNS_LATENCY_BUCKETS ? bucket : DNS_LATENCY_BUCKETS - 1;
}

static __always_inline void emit(struct dns_scratch *buf, struct __sk_buff *skb, const struct dns_packet *pkt)
{
	struct dns_event *event = &buf->event;
	__u64 caplen = pkt->dns_len, room = skb->len - pkt->dns_off, size;

	if (!ns_emit_wanted(&dns_stats, 0, cfg.sample_every))
		return;
	if (caplen > room) /* TCP: a message longer than this segment */
		caplen = room;
	if (caplen > DNS_PAYLOAD_MAX)
		caplen = DNS_PAYLOAD_MAX;
	asm volatile("%0 &= 2047" : "+r"(caplen)); /* a bound the verifier sees on the sizing register */
	if (caplen < 1 || caplen > DNS_PAYLOAD_MAX || bpf_skb_load_bytes(skb, pkt->dns_off, buf->tail, caplen))
		caplen = 0;
	event->caplen = caplen;
	size = sizeof(*event) + caplen;
	if (size > sizeof(*event) + DNS_PAYLOAD_MAX)
		size = sizeof(*event) + DNS_PAYLOAD_MAX;
	ns_output(&dns_stats, 0, buf, size);
}

static __always_inline bool answer_wanted(__u8 rcode, __u64 latency_ns)
{
	if (cfg.rcode_mask && !(cfg.rcode_mask & (1U << (rcode & 0xf))))
		return false;
	return !cfg.slow_ns || latency_ns >= cfg.slow_ns;
}

static __always_inline void handle_answer(struct __sk_buff *skb, struct dns_packet *pkt, struct dns_scratch *buf)
{
	struct dns_pending_key key = {};
	struct dns_event *event = &buf->event;
	struct dns_query *found;
	struct dns_group *group;
	__u8 rcode = pkt->header[3] & 0xf;
	__u16 ancount = (pkt->header[6] << 8) | pkt->header[7];
	__u64 now = bpf_ktime_get_ns();

	key.cookie = bpf_get_socket_cookie(skb);
	key.id = (pkt->header[0] << 8) | pkt->header[1];
	found = bpf_map_lookup_elem(&pending, &key);
	/* Copied before the delete: a preallocated element is reused at once by the next insert. The delete
	 * decides who owns the query: us (an answer), or userspace's timeout sweep (then this answer is late). */
	if (found)
		__builtin_memcpy(&buf->query, found, sizeof(buf->query));
	if (found && bpf_map_delete_elem(&pending, &key) == 0) {
		__u64 latency = now - buf->query.sent_ns;

		count(DNS_STAT_ANSWERS);
		count(DNS_STAT_MATCHED);
		group = group_of(buf, &buf->query.group, false);
		if (group) {
			__u32 bucket = latency_bucket(latency);

			__sync_fetch_and_add(&group->answers, 1);
			__sync_fetch_and_add(&group->rcodes[rcode], 1);
			__sync_fetch_and_add(&group->answer_records, ancount);
			__sync_fetch_and_add(&group->latency_sum_ns, latency);
			if (pkt->header[2] & 0x02)
				__sync_fetch_and_add(&group->truncated, 1);
			if (bucket < DNS_LATENCY_BUCKETS)
				__sync_fetch_and_add(&group->latency[bucket], 1);
		} else {
			count(DNS_STAT_UNGROUPED);
		}
		if (!cfg.emit_events)
			return;
		if (!answer_wanted(rcode, latency)) {
			count(DNS_STAT_FILTERED); /* the user's filter, not sampling: no answer is missing */
			return;
		}
		__builtin_memset(event, 0, sizeof(*event));
		__builtin_memcpy(&event->query, &buf->query, sizeof(event->query));
		event->kind = DNS_EVENT_ANSWER;
		event->latency_ns = latency;
		event->sock_ino = buf->query.sock_ino;
		event->netns = buf->query.group.netns;
	} else {
		struct packet_tuple forward;
		__u32 netns = 0;
		__u64 sock_ino = socket_inode(skb, &netns);

		if (!ns_netns_matches(cfg.netns, cfg.filter_netns, netns))
			return;
		reverse_tuple(&pkt->tuple, &forward);
		if (!tuple_matches(&forward))
			return;
		if (cfg.filter_dev && !dev_matches(skb))
			return;
		if (cfg.filter_owner && !ns_owned_inode(sock_ino))
			return;
		count(DNS_STAT_UNMATCHED);
		count(DNS_STAT_MATCHED);
		if (!cfg.emit_events)
			return;
		__builtin_memset(event, 0, sizeof(*event));
		event->kind = DNS_EVENT_UNMATCHED;
		event->sock_ino = sock_ino;
		event->netns = netns;
	}
	event->time_ns = now;
	event->cookie = key.cookie;
	event->tuple = pkt->tuple;
	event->ifindex = skb->ifindex;
	event->dns_len = pkt->dns_len;
	event->id = key.id;
	event->rcode = rcode;
	event->flags_hi = pkt->header[2];
	emit(buf, skb, pkt);
}

static __always_inline void handle_socket_packet(struct __sk_buff *skb, bool egress)
{
	struct dns_packet pkt = {};
	struct dns_scratch *buf;
	__u32 zero = 0;
	bool response;

	if (!parse_dns(skb, egress, &pkt))
		return;
	count(DNS_STAT_SEEN);
	response = pkt.header[2] & 0x80;
	/* The client side only: queries it sends, answers it receives. A server's side of the same exchange
	 * (queries in, answers out) also passes through these hooks and is not counted twice. */
	if (egress == response)
		return;
	buf = bpf_map_lookup_elem(&scratch, &zero);
	if (!buf)
		return;
	if (egress)
		handle_query(skb, &pkt, buf);
	else
		handle_answer(skb, &pkt, buf);
}

/* A socket filter must say whether the packet passes: always 1, netsleuth only watches. */
SEC("cgroup_skb/egress")
int dns_egress(struct __sk_buff *skb)
{
	handle_socket_packet(skb, true);
	return 1;
}

SEC("cgroup_skb/ingress")
int dns_ingress(struct __sk_buff *skb)
{
	handle_socket_packet(skb, false);
	return 1;
}

/*
 * A DNS packet freed with a drop reason, with what names its cause later: the reason, the dropping function,
 * the stack (the netfilter hook), the socket (its owner when a receive buffer is full) and the packet bytes
 * (the DNS id that joins it to a query). Rare, so every one is sent, also in --summary mode.
 */
static __always_inline int handle_drop(void *ctx, struct sk_buff *skb, void *location, __u32 reason,
				       struct sock *rx_sk, const bool direct)
{
	struct dns_scratch *buf;
	struct dns_event *event;
	struct net_device *dev;
	struct sock *sk;
	unsigned char *l3 = 0;
	__u32 zero = 0, caplen, stats_base;
	long frames;
	bool kthread = false;

	if (reason == cfg.consumed_reason || reason == cfg.not_dropped_reason)
		return 0;
	buf = bpf_map_lookup_elem(&scratch, &zero);
	if (!buf)
		return 0;
	event = &buf->event;
	__builtin_memset(&event->tuple, 0, sizeof(event->tuple));
	ns_parse_packet_rd(direct, skb, &event->tuple, &l3);
	if (event->tuple.l4proto != IPPROTO_UDP && event->tuple.l4proto != IPPROTO_TCP)
		return 0;
	if (event->tuple.sport != cfg.dns_port && event->tuple.dport != cfg.dns_port)
		return 0;
	dev = NS_RD(direct, skb, dev);
	sk = rx_sk ? rx_sk : NS_RD(direct, skb, sk);
	event->netns = ns_skb_netns_rd(direct, dev, sk);
	/* Outside --netns: still sent (its own counters), so a timeout in the traced namespace can be joined
	 * with the drop of its query or answer elsewhere on this host (e.g. the server's firewall). */
	stats_base = ns_netns_matches(cfg.netns, cfg.filter_netns, event->netns) ? 0 : DNS_CONTEXT_STATS;
	if (!stats_base)
		count(DNS_STAT_DROPS);
	ns_count(&dns_stats, stats_base + NS_STAT_MATCHED);
	event->context = stats_base != 0;

	__builtin_memset(&event->query, 0, sizeof(event->query));
	event->kind = DNS_EVENT_DROP;
	event->time_ns = bpf_ktime_get_ns();
	event->location = (__u64)location;
	event->reason = reason;
	event->cookie = 0;
	event->latency_ns = 0;
	event->sock_ino = sk ? ns_sock_ino_rd(direct, sk) : 0;
	event->ifindex = dev ? NS_RD(direct, dev, ifindex) : 0;
	event->in_task = ns_in_task(ctx, cfg.thread_size, &kthread);
	event->kthread = kthread;
	event->pid = 0;
	event->tid = 0;
	__builtin_memset(event->comm, 0, sizeof(event->comm));
	if (event->in_task)
		ns_current_task(&event->pid, &event->tid, event->comm);
	event->dns_len = 0;
	event->id = 0;
	event->rcode = 0;
	event->flags_hi = 0;

	frames = ns_take_stack(ctx, buf->tail, DNS_MAX_FRAMES * 8);
	asm volatile("%0 &= 255" : "+r"(frames)); /* a bound the verifier sees on the register it sizes with */
	if (frames > DNS_MAX_FRAMES * 8)
		frames = DNS_MAX_FRAMES * 8;
	event->nr_frames = (__u64)frames / 8;
	caplen = event->tuple.l3_len < DNS_DROP_BYTES ? event->tuple.l3_len : DNS_DROP_BYTES;
	event->caplen = 0;
	/* Reading past a short packet stays inside the skb's head allocation, as drops.bpf.c does. */
	if (l3 && caplen && !bpf_probe_read_kernel(buf->tail + frames, DNS_DROP_BYTES, l3))
		event->caplen = caplen;
	if (!ns_emit_wanted(&dns_stats, stats_base, cfg.sample_every))
		return 0;
	ns_output(&dns_stats, stats_base, buf, sizeof(*event) + frames + DNS_DROP_BYTES);
	return 0;
}

NS_KFREE_SKB_PROGRAMS(dns_drop_b, dns_drop_r, handle_drop)
