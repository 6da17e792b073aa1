// SPDX-License-Identifier: GPL-2.0
/*
 * netsleuth tcp: resets (sent, received, and the ones firewall REJECT rules build), state changes and what
 * derives from them (connection lives, connect latency and failures), retransmissions, socket errors, and
 * the drops and memory limits of socket queues. One object for `resets`, `tcp ...` and `conn`; the loader
 * picks the programs a command needs (autoload) and which kinds it emits, groups or stacks (cfg masks).
 *
 * As in drops.bpf.c, every matching event is counted exactly per kind in `tcp_stats` before it is offered to
 * the ring buffer, where it may be sampled away on purpose or lost; both are counted too.
 *
 * Hooks and their arguments on Linux 6.x (include/trace/events/tcp.h, sock.h, skb.h, net.h):
 *   tcp_send_reset(sk, skb, reason)   sk and skb may each be NULL; reason since 6.10
 *   tcp_receive_reset(sk)             from tcp_reset(), before the socket is closed
 *   inet_sock_set_state(sk, old, new) every state change of TCP/SCTP/MPTCP sockets
 *   tcp_retransmit_skb(sk, skb, err)  err since 6.11
 *   tcp_retransmit_synack(sk, req)    sk is the listener
 *   inet_sk_error_report(sk)          sk_err is set
 *   kfree_skb(skb, location, reason, rx_sk)
 *   sock_rcvqueue_full(sk, skb), sock_exceed_buf_limit(sk, prot, allocated, kind)
 *   net_dev_queue(skb)                only RSTs whose stack passes through nf_send_reset{,6} are kept
 */
#include "netsleuth.bpf.h"
#include <bpf/bpf_tracing.h>
#include "tcp.h"
#include "abi.h"
#define NS_EMIT_PERF_FALLBACK /* events_perf + ns_use_perfbuf for kernels without ring buffers */
#include "emit.bpf.h"
#include "filter_maps.bpf.h"
#include "stack.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* include/net/tcp_states.h; stable since 2.6 (it is what /proc/net/tcp and inet_diag report). */
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_SYN_RECV 3
#define TCP_FIN_WAIT1 4
#define TCP_CLOSE 7
#define TCP_CLOSE_WAIT 8
#define TCP_LAST_ACK 9
#define TCP_LISTEN 10
/* include/net/sock.h enum sock_flags; SOCK_LINGER has been bit 4 since 2.6. */
#define SOCK_LINGER_BIT 4
/* include/uapi/linux/tcp.h enum tcp_ca_state */
#define TCP_CA_LOSS 4
#define TCP_FLAG_RST 0x04
#define TLP_FRAMES 8 /* tcp_send_loss_probe sits within the first frames above the tracepoint */

const volatile struct tcp_config cfg = {
	.consumed_reason = ~0U,
	.not_dropped_reason = ~0U,
	.sample_every = 1,
};

NS_ABI_KEEP(tcp_abi_types);

NS_STATS_MAP(tcp_stats, TCP_EV_KINDS * NS_STAT_COUNT);
NS_GROUP_MAP(tcp_groups, struct tcp_group_key, struct tcp_group, TCP_MAX_GROUPS);

/* Socket address -> what the state tracker learnt about it. LRU: sockets we never see close age out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, TCP_MAX_SOCKETS);
	__type(key, __u64);
	__type(value, struct tcp_sock_info);
} sock_infos SEC(".maps");

/* Text of nf_send_reset/nf_send_reset6 (from kallsyms; userspace fills it, also when the module loads later). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TCP_STACK_RANGES);
	__type(key, __u32);
	__type(value, struct tcp_range);
} reject_ranges SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TCP_MAX_LISTEN_PORTS);
	__type(key, __u32);
	__type(value, struct tcp_listener_slots);
} listeners SEC(".maps");

/* kfree_skb reasons that are about a socket's queues (LISTEN_OVERFLOW, SOCKET_RCVBUFF, PROTO_MEM...). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TCP_QUEUE_REASONS);
	__type(key, __u32);
	__type(value, __u8);
} queue_reasons SEC(".maps");

struct tcp_scratch {
	struct tcp_event event;
	__u64 frames[TCP_MAX_FRAMES]; /* right after the event: one ring-buffer record */
	__u8 header[NS_HEADER_BYTES];
	struct tcp_group fresh;
};

NS_SCRATCH_MAP(scratch, struct tcp_scratch);

static __always_inline bool kind_in(__u32 mask, __u8 kind)
{
	return mask & (1U << kind);
}

static __always_inline bool kind_wanted(__u8 kind)
{
	return kind_in(cfg.emit_mask | cfg.group_mask, kind);
}

static __always_inline void count(__u8 kind, enum ns_stat stat)
{
	ns_count(&tcp_stats, kind * NS_STAT_COUNT + stat);
}

static __always_inline struct tcp_scratch *fresh_scratch(__u8 kind)
{
	__u32 zero = 0;
	struct tcp_scratch *buf = bpf_map_lookup_elem(&scratch, &zero);

	if (!buf)
		return 0;
	__builtin_memset(&buf->event, 0, sizeof(buf->event));
	buf->event.kind = kind;
	buf->event.state = TCP_NO_STATE;
	buf->event.old_state = TCP_NO_STATE;
	return buf;
}

/* An event of `kind` whose hook fired: counted as SEEN before any filter. */
static __always_inline struct tcp_scratch *seen_scratch(__u8 kind)
{
	count(kind, NS_STAT_SEEN);
	return fresh_scratch(kind);
}

/* ::ffff:a.b.c.d -> a.b.c.d, so IPv4 filters and joins work for dual-stack sockets. */
static __always_inline bool v4_mapped(const __u8 *addr)
{
	for (int i = 0; i < 10; i++)
		if (addr[i])
			return false;
	return addr[10] == 0xff && addr[11] == 0xff;
}

static __always_inline void unmap_v4(__u8 *addr)
{
	__builtin_memcpy(addr, addr + 12, 4);
	__builtin_memset(addr + 4, 0, 12);
}

/* A socket's endpoints; works for full, request and TIME_WAIT socks (all start with struct sock_common). */
static __always_inline void sock_endpoints(const bool direct, struct sock_common *skc, struct tcp_event *e)
{
	__u16 family = NS_RD(direct, skc, skc_family);

	e->lport = NS_RD(direct, skc, skc_num);
	e->rport = bpf_ntohs(NS_RD(direct, skc, skc_dport));
	if (family == AF_INET) {
		__be32 local = NS_RD(direct, skc, skc_rcv_saddr);
		__be32 remote = NS_RD(direct, skc, skc_daddr);

		e->family = 4;
		__builtin_memcpy(e->laddr, &local, 4);
		__builtin_memcpy(e->raddr, &remote, 4);
	} else if (family == AF_INET6) {
		e->family = 6;
		BPF_CORE_READ_INTO(&e->laddr, skc, skc_v6_rcv_saddr);
		BPF_CORE_READ_INTO(&e->raddr, skc, skc_v6_daddr);
		if (v4_mapped(e->raddr)) {
			e->family = 4;
			unmap_v4(e->raddr);
			if (v4_mapped(e->laddr))
				unmap_v4(e->laddr);
		}
	}
}

/* tcp_set_state(CLOSE) releases the port (inet_put_port zeroes skc_num) before the tracepoints of a closing
 * socket fire; inet_sport still holds it. Only full sockets have it. */
static __always_inline void keep_local_port(struct sock *sk, struct tcp_event *e)
{
	if (!e->lport && ns_sk_fullsock_rd(false, sk))
		e->lport = bpf_ntohs(BPF_CORE_READ((struct inet_sock *)sk, inet_sport));
}

static __always_inline __u32 sock_netns(const bool direct, struct sock *sk)
{
	return ns_net_inum_rd(direct, NS_RD(direct, sk, __sk_common.skc_net.net));
}

static __always_inline __u32 skb_netns(const bool direct, struct sk_buff *skb)
{
	struct net_device *dev = NS_RD(direct, skb, dev);

	return dev ? ns_net_inum_rd(direct, NS_RD(direct, dev, nd_net.net)) : 0;
}

/*
 * Copy the packet's network and transport headers once and describe it. Returns the TCP header's offset in
 * buf->header, or -1 when this is not a TCP segment we can read.
 */
static __always_inline int read_segment(const bool direct, struct sk_buff *skb, struct tcp_scratch *buf,
					struct packet_tuple *tuple)
{
	unsigned char *head = NS_RD(direct, skb, head);
	__u16 network_header = NS_RD(direct, skb, network_header);
	__u8 *hdr = buf->header;
	int transport;

	if (network_header == (__u16)~0U || !head)
		return -1;
	if (bpf_probe_read_kernel(hdr, NS_HEADER_BYTES, head + network_header))
		return -1;
	ns_parse_headers(hdr, tuple);
	if (tuple->l4proto != IPPROTO_TCP || !tuple->has_ports)
		return -1;
	transport = tuple->family == 4 ? (hdr[0] & 0xf) * 4 : 40;
	if (transport < 20 || transport > NS_HEADER_BYTES - 14)
		return -1;
	return transport;
}

static __always_inline __u32 be32_at(const __u8 *p)
{
	return ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | p[3];
}

/* seq, ack, flags and payload length of the TCP segment at `transport` in buf->header. */
static __always_inline void describe_segment(struct tcp_scratch *buf, int transport, const struct packet_tuple *tuple)
{
	struct tcp_event *e = &buf->event;
	const __u8 *hdr = buf->header;
	const __u8 *th;
	__u32 total, headers;

	if (transport < 20 || transport > NS_HEADER_BYTES - 14)
		return;
	th = hdr + transport;
	e->has_trigger = 1;
	e->seq = be32_at(th + 4);
	e->ack = be32_at(th + 8);
	e->tcp_flags = th[13];
	headers = (th[12] >> 4) * 4;
	if (tuple->family == 4) {
		total = (hdr[2] << 8) | hdr[3];
		headers += transport;
	} else {
		total = (hdr[4] << 8) | hdr[5]; /* payload after the fixed header; extension headers not counted */
	}
	e->payload_len = total > headers ? total - headers : 0;
}

/*
 * --sport/--dport and --src/--dst name the ends as the event's record does: an event's source is this side,
 * but for a received RST, whose record is the packet (diagnostics/tcp/resets.py: from the peer to us). Read
 * from the socket's side, `--sport 80` kept the resets a server on :80 sent and not those its clients
 * received from it.
 */
static __always_inline bool flow_matches(const struct tcp_event *e)
{
	const bool inbound = e->kind == TCP_EV_RESET_RECEIVED;

	if (!ns_netns_matches(cfg.netns, cfg.filter_netns, e->netns))
		return false;
	if (cfg.family && e->family != cfg.family)
		return false;
	if (!ns_ports_match(cfg.port, cfg.sport, cfg.dport, inbound ? e->rport : e->lport,
			    inbound ? e->lport : e->rport))
		return false;
	return ns_addresses_match(cfg.filter_host, cfg.filter_src, cfg.filter_dst, e->family,
				  inbound ? e->raddr : e->laddr, inbound ? e->laddr : e->raddr);
}

static __always_inline bool owner_matches(const struct tcp_event *e)
{
	if (!cfg.filter_owner)
		return true;
	if (e->in_task && ns_task_matches(e->pid, e->comm, cfg.pid, cfg.comm))
		return true;
	if (e->owner_pid && ns_task_matches(e->owner_pid, e->owner_comm, cfg.pid, cfg.comm))
		return true;
	return ns_owned_inode(e->sock_ino);
}

/* Time, CPU, the running task, and what the tracker knows about the socket. */
static __always_inline void fill_context(const bool direct, void *ctx, struct tcp_event *e, struct sock *sk)
{
	bool kthread = false;

	e->time_ns = bpf_ktime_get_ns();
	e->cpu = bpf_get_smp_processor_id();
	e->in_task = ns_in_task(ctx, cfg.thread_size, &kthread);
	e->kthread = kthread;
	if (e->in_task)
		ns_current_task(&e->pid, &e->tid, e->comm);
	if (sk) {
		__u64 key = (__u64)sk;
		struct tcp_sock_info *info = bpf_map_lookup_elem(&sock_infos, &key);

		e->sk = key;
		if (info) {
			e->born_ns = info->born_ns;
			e->side = info->side;
			e->owner_pid = info->pid;
			e->sock_ino = info->sock_ino;
			__builtin_memcpy(e->owner_comm, info->comm, sizeof(e->owner_comm));
			if (e->old_state == TCP_NO_STATE)
				e->old_state = info->last_old_state;
			if (!e->lport)
				e->lport = info->lport;
			else if (!info->lport)
				info->lport = e->lport; /* bound after its first transition (connect) */
		}
		/* Accepted after the tracker last saw it: its file exists now. */
		if (!e->sock_ino)
			e->sock_ino = ns_sock_ino_rd(direct, sk);
	}
}

static __always_inline __u64 sock_flags_word(const bool direct, struct sock *sk)
{
	if (bpf_core_field_exists(sk->__sk_common.skc_flags))
		return NS_RD(direct, sk, __sk_common.skc_flags);
	return NS_RD(direct, sk, sk_flags);
}

/* Queues and linger settings of a full TCP socket: what explains an abort. The tcp_sock and
 * inet_connection_sock fields lie beyond struct sock, where a BTF-typed pointer cannot reach: copied. */
static __always_inline void fill_tcp_details(const bool direct, struct tcp_event *e, struct sock *sk)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct inet_connection_sock *icsk = (struct inet_connection_sock *)sk;
	__u64 flags;

	if (!sk || !ns_sk_fullsock_rd(direct, sk))
		return;
	e->sock_flags |= TCP_SOCK_FULL;
	if (NS_RD(direct, sk, sk_socket))
		e->sock_flags |= TCP_SOCK_HAS_FILE;
	flags = sock_flags_word(direct, sk);
	if (flags & (1ULL << SOCK_LINGER_BIT)) {
		e->sock_flags |= TCP_SOCK_LINGER;
		if (!NS_RD(direct, sk, sk_lingertime))
			e->sock_flags |= TCP_SOCK_LINGER_ZERO;
	}
	if (NS_RD(direct, sk, __sk_common.skc_state) == TCP_LISTEN) {
		e->backlog = NS_RD(direct, sk, sk_ack_backlog);
		e->max_backlog = NS_RD(direct, sk, sk_max_ack_backlog);
		e->syn_queue = BPF_CORE_READ(icsk, icsk_accept_queue.qlen.counter);
		return;
	}
	if (NS_RD(direct, sk, sk_protocol) != IPPROTO_TCP)
		return;
	e->unread = BPF_CORE_READ(tp, rcv_nxt) - BPF_CORE_READ(tp, copied_seq);
	e->unsent = BPF_CORE_READ(tp, write_seq) - BPF_CORE_READ(tp, snd_una);
	e->retransmits = BPF_CORE_READ(icsk, icsk_retransmits);
	e->ca_state = BPF_CORE_READ_BITFIELD_PROBED(icsk, icsk_ca_state);
}

static __always_inline long take_stack(void *ctx, struct tcp_scratch *buf)
{
	return ns_take_stack(ctx, buf->frames, sizeof(buf->frames));
}

/* Which fields a --summary groups by, per kind (see tcp.h tcp_group_key). */
static __always_inline void group_key_for(const struct tcp_event *e, struct tcp_group_key *key)
{
	bool flows = cfg.group_flows;

	key->kind = e->kind;
	key->netns = e->netns;
	key->family = e->family;
	switch (e->kind) {
	case TCP_EV_RESET_SENT:
	case TCP_EV_RESET_RECEIVED:
	case TCP_EV_RESET_FIREWALL:
	case TCP_EV_SOCK_DROP:
		key->state = e->state;
		key->reason = e->reason;
		__builtin_memcpy(key->laddr, e->laddr, 16);
		key->lport = e->lport;
		if (flows) {
			__builtin_memcpy(key->raddr, e->raddr, 16);
			key->rport = e->rport;
		}
		break;
	case TCP_EV_STATE:
		key->state = e->state;
		key->old_state = e->old_state;
		break;
	case TCP_EV_LIFE:
	case TCP_EV_CONNECT:
	case TCP_EV_ERROR:
		key->reason = e->kind == TCP_EV_LIFE ? 0 : e->reason;
		key->pid = e->owner_pid;
		if (e->kind == TCP_EV_ERROR)
			key->state = e->state;
		/* A service is its local end, a client's peer its remote end. */
		if (e->side == 2 || flows) {
			__builtin_memcpy(key->laddr, e->laddr, 16);
			key->lport = e->lport;
		}
		if (e->side != 2 || flows) {
			__builtin_memcpy(key->raddr, e->raddr, 16);
			key->rport = e->rport;
		}
		break;
	default: /* retransmits, buffers: per flow */
		key->state = e->state;
		key->retrans_kind = e->retrans_kind;
		key->reason = e->kind == TCP_EV_MEM_LIMIT ? e->reason : 0;
		key->pid = e->owner_pid;
		__builtin_memcpy(key->laddr, e->laddr, 16);
		key->lport = e->lport;
		__builtin_memcpy(key->raddr, e->raddr, 16);
		key->rport = e->rport;
		break;
	}
}

static __always_inline void add_to_group(struct tcp_group *group, const struct tcp_event *e)
{
	/* Locked adds cost tens of ns each on this hot path: only the ones that change something. */
	__sync_fetch_and_add(&group->count, 1);
	if (e->value1)
		__sync_fetch_and_add(&group->sum1, e->value1);
	if (e->value2)
		__sync_fetch_and_add(&group->sum2, e->value2);
	if (e->value3)
		__sync_fetch_and_add(&group->sum3, e->value3);
	if (e->segs)
		__sync_fetch_and_add(&group->segs, e->segs);
	if (e->value1 > group->max1) /* a racing update may win: the maximum is a hint, the counts are exact */
		group->max1 = e->value1;
}

static __always_inline void update_group(void *ctx, struct tcp_scratch *buf, long stack_bytes)
{
	struct tcp_event *e = &buf->event;
	struct tcp_group_key key = {};
	struct tcp_group *group, *fresh;
	long got;

	group_key_for(e, &key);
	group = bpf_map_lookup_elem(&tcp_groups, &key);
	if (group) {
		add_to_group(group, e);
		return;
	}
	/* First event of its kind: it becomes the group's example, with the stack it has (or a fresh one). */
	fresh = &buf->fresh;
	fresh->count = 1;
	fresh->sum1 = e->value1;
	fresh->sum2 = e->value2;
	fresh->sum3 = e->value3;
	fresh->max1 = e->value1;
	fresh->segs = e->segs;
	__builtin_memcpy(&fresh->example, e, sizeof(*e));
	if (stack_bytes > 0) {
		__builtin_memcpy(fresh->example_frames, buf->frames, sizeof(fresh->example_frames));
		got = stack_bytes > (long)sizeof(fresh->example_frames) ? (long)sizeof(fresh->example_frames)
									 : stack_bytes;
	} else {
		got = ns_take_stack(ctx, fresh->example_frames, sizeof(fresh->example_frames));
	}
	fresh->example.nr_frames = (__u64)got / 8;
	group = ns_group_insert(&tcp_groups, &key, fresh, &tcp_stats, e->kind * NS_STAT_COUNT);
	if (group)
		add_to_group(group, e);
}

/* The event in `buf` passed every filter: count it, group it, maybe send it. `stack_bytes` is how much of
 * buf->frames a handler already filled (-1: none taken yet). */
static __always_inline int submit(void *ctx, struct tcp_scratch *buf, long stack_bytes)
{
	struct tcp_event *e = &buf->event;
	__u8 kind = e->kind;
	__u64 size;

	count(kind, NS_STAT_MATCHED);
	if (kind_in(cfg.group_mask, kind))
		update_group(ctx, buf, stack_bytes);
	if (!kind_in(cfg.emit_mask, kind) || !ns_emit_wanted(&tcp_stats, kind * NS_STAT_COUNT, cfg.sample_every))
		return 0;
	if (stack_bytes < 0 && kind_in(cfg.stack_mask, kind))
		stack_bytes = take_stack(ctx, buf);
	if (stack_bytes < 0)
		stack_bytes = 0;
	if (stack_bytes > (long)sizeof(buf->frames))
		stack_bytes = sizeof(buf->frames);
	e->nr_frames = (__u64)stack_bytes / 8;
	size = sizeof(*e) + (__u64)stack_bytes;
	/* The ring buffer, or the perf buffer on kernels without one (bpf/emit.bpf.h). */
	ns_output_ctx(ctx, &tcp_stats, kind * NS_STAT_COUNT, buf, size);
	return 0;
}

/* ---- what every handler shares ----------------------------------------------------------------------------- */

/* A fresh event about socket `sk`: its endpoints, namespace and state (full, request or TIME_WAIT socks). */
static __always_inline struct tcp_scratch *sock_scratch(const bool direct, __u8 kind, struct sock *sk)
{
	struct tcp_scratch *buf = fresh_scratch(kind);

	if (!buf)
		return 0;
	sock_endpoints(direct, (struct sock_common *)sk, &buf->event);
	keep_local_port(sk, &buf->event);
	buf->event.netns = sock_netns(direct, sk);
	buf->event.state = NS_RD(direct, sk, __sk_common.skc_state);
	return buf;
}

/* The endpoints of the segment in `tuple`, from the socket's side: a received segment's destination is the
 * local end, a sent one's source. */
static __always_inline void segment_endpoints(struct tcp_event *e, const struct packet_tuple *tuple, bool received)
{
	e->family = tuple->family;
	__builtin_memcpy(e->laddr, received ? tuple->daddr : tuple->saddr, 16);
	__builtin_memcpy(e->raddr, received ? tuple->saddr : tuple->daddr, 16);
	e->lport = received ? tuple->dport : tuple->sport;
	e->rport = received ? tuple->sport : tuple->dport;
}

/* The filters every event passes: its flow first (cheap), then its owner once the running task and what the
 * tracker knows about the socket are filled in. */
static __always_inline bool event_kept(const bool direct, void *ctx, struct tcp_event *e, struct sock *sk)
{
	if (!flow_matches(e))
		return false;
	fill_context(direct, ctx, e, sk);
	return owner_matches(e);
}

/* The end of most handlers: the filters, then the socket's queues and linger state, then count, group, send. */
static __always_inline int submit_sock_event(const bool direct, void *ctx, struct tcp_scratch *buf, struct sock *sk)
{
	if (!event_kept(direct, ctx, &buf->event, sk))
		return 0;
	fill_tcp_details(direct, &buf->event, sk);
	return submit(ctx, buf, -1);
}

/* ---- resets --------------------------------------------------------------------------------------------- */

static __always_inline int on_send_reset(const bool direct, void *ctx, struct sock *sk, struct sk_buff *skb,
					 __u32 reason)
{
	struct tcp_scratch *buf;
	struct tcp_event *e;

	buf = seen_scratch(TCP_EV_RESET_SENT);
	if (!buf)
		return 0;
	e = &buf->event;
	e->reason = reason;
	if (skb) {
		/* tcp_v4/v6_send_reset: the segment that made us answer with RST; it goes back to its sender. */
		struct packet_tuple tuple = {};
		int transport = read_segment(direct, skb, buf, &tuple);

		if (transport >= 0) {
			segment_endpoints(e, &tuple, true);
			describe_segment(buf, transport, &tuple);
		}
		e->netns = skb_netns(direct, skb);
		e->ifindex = NS_RD(direct, skb, skb_iif);
	} else if (sk) {
		/* tcp_send_active_reset: the socket aborts on its own (close, disconnect, timer). */
		sock_endpoints(direct, (struct sock_common *)sk, e);
		keep_local_port(sk, e);
	}
	if (sk) {
		e->state = NS_RD(direct, sk, __sk_common.skc_state);
		if (!e->netns)
			e->netns = sock_netns(direct, sk);
	}
	return submit_sock_event(direct, ctx, buf, sk);
}

static __always_inline int on_receive_reset(const bool direct, void *ctx, struct sock *sk)
{
	struct tcp_scratch *buf;

	count(TCP_EV_RESET_RECEIVED, NS_STAT_SEEN);
	if (!sk || !(buf = sock_scratch(direct, TCP_EV_RESET_RECEIVED, sk)))
		return 0;
	return submit_sock_event(direct, ctx, buf, sk);
}

static __always_inline bool from_reject_code(const __u64 *frames, long stack_bytes)
{
	for (__u32 i = 0; i < TCP_STACK_RANGES; i++) {
		__u32 key = i;
		struct tcp_range *range = bpf_map_lookup_elem(&reject_ranges, &key);

		if (range && range->start && ns_stack_within(frames, stack_bytes, TCP_MAX_FRAMES, range->start, range->end))
			return true;
	}
	return false;
}

/*
 * REJECT --reject-with tcp-reset (iptables) and `reject with tcp reset` (nftables) build the RST in
 * nf_send_reset()/nf_send_reset6() (net/ipv4/netfilter/nf_reject_ipv4.c, net/ipv6/netfilter/
 * nf_reject_ipv6.c) and send it with ip_local_out()/dev_queue_xmit(): no TCP tracepoint sees it. Every
 * transmitted packet passes net:net_dev_queue synchronously from its sender, so an RST whose stack goes
 * through those functions is a firewall's. Other packets cost a map lookup and a header copy.
 */
static __always_inline int on_net_dev_queue(const bool direct, void *ctx, struct sk_buff *skb)
{
	struct packet_tuple tuple = {};
	struct tcp_scratch *buf;
	struct tcp_event *e;
	__u32 zero = 0;
	struct tcp_range *first = bpf_map_lookup_elem(&reject_ranges, &zero);
	long stack_bytes;
	int transport;

	if (!first || !first->start) /* no reject code in this kernel yet */
		return 0;
	buf = fresh_scratch(TCP_EV_RESET_FIREWALL);
	if (!buf)
		return 0;
	transport = read_segment(direct, skb, buf, &tuple);
	if (transport < 0 || !(tuple.tcp_flags & TCP_FLAG_RST))
		return 0;
	stack_bytes = take_stack(ctx, buf);
	if (!from_reject_code(buf->frames, stack_bytes))
		return 0;
	count(TCP_EV_RESET_FIREWALL, NS_STAT_SEEN);
	e = &buf->event;
	segment_endpoints(e, &tuple, false);
	describe_segment(buf, transport, &tuple);
	e->netns = skb_netns(direct, skb);
	if (!event_kept(direct, ctx, e, 0))
		return 0;
	ns_device_rd(direct, NS_RD(direct, skb, dev), &e->ifindex, e->ifname);
	return submit(ctx, buf, stack_bytes);
}

/* ---- state changes, connection lives, connect latency ------------------------------------------------------ */

/* Add (or remove) a listener in its port's slots; racing updates can lose one: it is then not found. */
static __always_inline void remember_listener(__u32 port, __u64 address, bool listening)
{
	struct tcp_listener_slots fresh = {}, *slots = bpf_map_lookup_elem(&listeners, &port);

	if (!slots) {
		if (!listening)
			return;
		fresh.sk[0] = address;
		bpf_map_update_elem(&listeners, &port, &fresh, BPF_NOEXIST);
		return;
	}
	for (int i = 0; i < TCP_LISTENER_SLOTS; i++) {
		if (listening && !slots->sk[i]) {
			slots->sk[i] = address;
			return;
		}
		if (!listening && slots->sk[i] == address) {
			slots->sk[i] = 0;
			return;
		}
	}
}

/* What one transition tells, computed once for the tracker and every kind derived from it. */
struct transition {
	__u64 now;
	__u64 in_previous;	/* ns spent in the previous state, 0 unknown */
	bool in_task;
	bool kthread;
};

/*
 * The state tracker: remember what this transition tells about the socket (copied to `seen`). It runs on
 * every state change of every TCP socket, so it touches the map once (in place when the socket is known)
 * and walks to the socket's inode only in a task's own syscall.
 */
static __always_inline void track_state(const bool direct, void *ctx, struct sock *sk, int old, int new,
					struct transition *t, struct tcp_sock_info *seen)
{
	__u64 key = (__u64)sk;
	struct tcp_sock_info *info = bpf_map_lookup_elem(&sock_infos, &key);
	bool birth = (old == TCP_CLOSE && (new == TCP_SYN_SENT || new == TCP_LISTEN)) ||
		     (old == TCP_LISTEN && new == TCP_SYN_RECV);
	__u16 port = NS_RD(direct, sk, __sk_common.skc_num);

	t->in_task = ns_in_task(ctx, cfg.thread_size, &t->kthread);
	if (!info || birth) {
		__builtin_memset(seen, 0, sizeof(*seen));
		if (birth) {
			seen->born_ns = t->now;
			/* connect() runs tcp_set_state(SYN_SENT); a child socket is cloned from its listener in
			 * SYN_RECV (inet_csk_clone_lock): the two ways a connection starts. */
			seen->side = new == TCP_SYN_SENT ? 1 : new == TCP_SYN_RECV ? 2 : 0;
		}
	} else {
		t->in_previous = info->changed_ns ? t->now - info->changed_ns : 0;
		__builtin_memcpy(seen, info, sizeof(*seen));
	}
	/* Only a task's own syscall tells who owns the socket: connect() and listen() make the first two
	 * transitions, close()/shutdown() the last two (tcp_close_state); softirq work that happens to run on
	 * a task's stack must not name that task. */
	if (t->in_task && !t->kthread &&
	    ((old == TCP_CLOSE && (new == TCP_SYN_SENT || new == TCP_LISTEN)) ||
	     (old == TCP_ESTABLISHED && new == TCP_FIN_WAIT1) || (old == TCP_CLOSE_WAIT && new == TCP_LAST_ACK))) {
		__u64 ino = ns_sock_ino_rd(direct, sk);
		__u32 tid;

		ns_current_task(&seen->pid, &tid, seen->comm);
		if (ino)
			seen->sock_ino = ino;
	}
	if (port)
		seen->lport = port;
	seen->changed_ns = t->now;
	seen->last_old_state = old;
	if (info && !birth)
		__builtin_memcpy(info, seen, sizeof(*seen));
	else
		bpf_map_update_elem(&sock_infos, &key, seen, BPF_ANY);
	if (new == TCP_LISTEN || (old == TCP_LISTEN && new == TCP_CLOSE))
		remember_listener(port, key, new == TCP_LISTEN);
}

static __always_inline int emit_state_kind(const bool direct, void *ctx, struct sock *sk, __u8 kind, int old,
					   int new, const struct transition *t, const struct tcp_sock_info *info,
					   __u64 value1, __u32 reason)
{
	struct tcp_scratch *buf;
	struct tcp_event *e;

	buf = seen_scratch(kind);
	if (!buf)
		return 0;
	e = &buf->event;
	sock_endpoints(direct, (struct sock_common *)sk, e);
	e->netns = sock_netns(direct, sk);
	e->state = new;
	e->old_state = old;
	e->reason = reason;
	e->value1 = value1;
	if (!e->lport)
		e->lport = info->lport;
	keep_local_port(sk, e);
	if (!flow_matches(e))
		return 0;
	/* Everything else comes from the tracker's fresh entry: no second lookup, no inode walk. */
	e->time_ns = t->now;
	e->cpu = bpf_get_smp_processor_id();
	e->sk = (__u64)sk;
	e->in_task = t->in_task;
	e->kthread = t->kthread;
	/* The task's name is for printed events and --comm; a --summary count does not need it. */
	if (t->in_task && (kind_in(cfg.emit_mask, kind) || cfg.filter_owner))
		ns_current_task(&e->pid, &e->tid, e->comm);
	e->born_ns = info->born_ns;
	e->side = info->side;
	e->owner_pid = info->pid;
	e->sock_ino = info->sock_ino;
	__builtin_memcpy(e->owner_comm, info->comm, sizeof(e->owner_comm));
	if (!owner_matches(e))
		return 0;
	if (new == TCP_CLOSE) {
		struct tcp_sock *tp = (struct tcp_sock *)sk;

		/* tcp_done_with_error() sets sk_err before tcp_done() moves the socket to CLOSE. */
		if (kind == TCP_EV_STATE)
			e->reason = NS_RD(direct, sk, sk_err);
		e->value2 = BPF_CORE_READ(tp, bytes_acked);
		e->value3 = BPF_CORE_READ(tp, bytes_received);
		e->retransmits = BPF_CORE_READ((struct inet_connection_sock *)sk, icsk_retransmits);
		e->unread = BPF_CORE_READ(tp, rcv_nxt) - BPF_CORE_READ(tp, copied_seq);
	}
	return submit(ctx, buf, -1);
}

static __always_inline int on_state(const bool direct, void *ctx, struct sock *sk, int old, int new)
{
	struct tcp_sock_info info;
	struct transition t = {};

	if (!sk || NS_RD(direct, sk, sk_protocol) != IPPROTO_TCP)
		return 0;
	t.now = bpf_ktime_get_ns();
	track_state(direct, ctx, sk, old, new, &t, &info);
	if (kind_wanted(TCP_EV_STATE))
		emit_state_kind(direct, ctx, sk, TCP_EV_STATE, old, new, &t, &info, t.in_previous, 0);
	if (old == TCP_SYN_SENT && (new == TCP_ESTABLISHED || new == TCP_CLOSE) && info.born_ns &&
	    kind_wanted(TCP_EV_CONNECT)) {
		/* tcp_done_with_error() sets sk_err before the socket reaches CLOSE: ECONNREFUSED after an RST,
		 * ETIMEDOUT after the last SYN retransmit; 0 when the application gave up (close()). */
		__u32 error = new == TCP_CLOSE ? NS_RD(direct, sk, sk_err) : 0;

		emit_state_kind(direct, ctx, sk, TCP_EV_CONNECT, old, new, &t, &info, t.now - info.born_ns, error);
	}
	if (new == TCP_CLOSE && old != TCP_SYN_SENT && old != TCP_LISTEN && info.born_ns &&
	    kind_wanted(TCP_EV_LIFE))
		emit_state_kind(direct, ctx, sk, TCP_EV_LIFE, old, new, &t, &info, t.now - info.born_ns, 0);
	return 0;
}

/* ---- retransmissions and errors ---------------------------------------------------------------------------- */

/* Since 6.11 the tracepoint also fires for attempts that __tcp_retransmit_skb() gave up on before it added
 * to TcpRetransSegs: -EBUSY (the previous copy is still in a host queue, common on veth), -EHOSTUNREACH
 * (rebuild_header found no route), -EAGAIN (beyond the peer's window), -ENOMEM (fragmenting/uncloning).
 * Errors from the transmit itself (-ENOBUFS, -EPERM from netfilter, ...) come after the count, so those
 * attempts are segments the kernel counted. Such a record keeps its error and carries 0 segments. */
#define RETRANS_EAGAIN 11
#define RETRANS_ENOMEM 12
#define RETRANS_EBUSY 16
#define RETRANS_EHOSTUNREACH 113

static __always_inline bool retrans_counted(int err)
{
	return err != -RETRANS_EBUSY && err != -RETRANS_EHOSTUNREACH && err != -RETRANS_EAGAIN &&
	       err != -RETRANS_ENOMEM;
}

static __always_inline int on_retransmit(const bool direct, void *ctx, struct sock *sk, struct sk_buff *skb,
					 int err)
{
	struct tcp_scratch *buf;
	struct tcp_event *e;
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	long stack_bytes = -1;

	count(TCP_EV_RETRANS, NS_STAT_SEEN);
	if (!sk || !(buf = sock_scratch(direct, TCP_EV_RETRANS, sk)))
		return 0;
	e = &buf->event;
	e->reason = err;
	if (!event_kept(direct, ctx, e, sk))
		return 0;
	fill_tcp_details(direct, e, sk);
	e->value1 = BPF_CORE_READ(tp, total_retrans);
	e->value2 = BPF_CORE_READ(tp, srtt_us) >> 3; /* srtt_us holds 8 x the smoothed RTT (tcp_rtt_estimator) */
	e->value3 = BPF_CORE_READ(tp, snd_cwnd);
	/* One skb can go out as several segments (TCP builds GSO skbs); TcpRetransSegs counts segments. */
	if (skb && retrans_counted(err))
		e->segs = BPF_CORE_READ((struct tcp_skb_cb *)skb->cb, tcp_gso_segs);
	if (e->state == TCP_SYN_SENT) {
		e->retrans_kind = TCP_RETRANS_SYN;
	} else {
		/* No tracepoint marks a tail loss probe, and icsk_pending still reads ICSK_TIME_LOSS_PROBE when
		 * ACK processing fast-retransmits while a probe is armed; tcp_send_loss_probe() on the stack is
		 * the one unambiguous sign (net/ipv4/tcp_output.c calls __tcp_retransmit_skb from it). */
		if (cfg.tlp.start) {
			stack_bytes = take_stack(ctx, buf);
			if (ns_stack_within(buf->frames, stack_bytes, TLP_FRAMES, cfg.tlp.start, cfg.tlp.end))
				e->retrans_kind = TCP_RETRANS_TLP;
		}
		if (e->retrans_kind != TCP_RETRANS_TLP)
			e->retrans_kind = e->ca_state == TCP_CA_LOSS ? TCP_RETRANS_TIMEOUT
				      : e->ca_state	      ? TCP_RETRANS_FAST
							      : TCP_RETRANS_OTHER;
	}
	return submit(ctx, buf, stack_bytes);
}

static __always_inline int on_synack_retransmit(const bool direct, void *ctx, struct sock *listener,
						struct request_sock *req)
{
	struct tcp_scratch *buf;
	struct tcp_event *e;

	count(TCP_EV_SYNACK_RETRANS, NS_STAT_SEEN);
	if (!listener || !req)
		return 0;
	buf = fresh_scratch(TCP_EV_SYNACK_RETRANS);
	if (!buf)
		return 0;
	e = &buf->event;
	sock_endpoints(direct, (struct sock_common *)req, e);
	e->netns = sock_netns(direct, listener);
	e->state = TCP_NEW_SYN_RECV;
	e->retrans_kind = TCP_RETRANS_SYN;
	e->value1 = NS_RD(direct, req, num_retrans) + 1; /* inet_rtx_syn_ack() counts it after sending */
	e->segs = 1;					 /* tcp_rtx_synack() adds 1 to TcpRetransSegs */
	/* The listener's owner: the service that did not get its ACK. */
	return submit_sock_event(direct, ctx, buf, listener);
}

static __always_inline int on_error_report(const bool direct, void *ctx, struct sock *sk)
{
	struct tcp_scratch *buf;
	struct tcp_event *e;

	count(TCP_EV_ERROR, NS_STAT_SEEN);
	if (!sk || NS_RD(direct, sk, sk_protocol) != IPPROTO_TCP || !(buf = sock_scratch(direct, TCP_EV_ERROR, sk)))
		return 0;
	e = &buf->event;
	e->reason = NS_RD(direct, sk, sk_err);
	/* sk_error_report() for a queued error already taken (e.g. by connect()) has nothing to say. */
	if (!e->reason || !event_kept(direct, ctx, e, sk))
		return 0;
	fill_tcp_details(direct, e, sk);
	e->value1 = BPF_CORE_READ((struct tcp_sock *)sk, total_retrans);
	return submit(ctx, buf, -1);
}

/* ---- socket queues ------------------------------------------------------------------------------------------ */

/*
 * A packet dropped on its way into a socket. Listeners are always of interest (a drop at a listener is
 * about its queues); other sockets only for the queue reasons userspace lists (SOCKET_RCVBUFF, PROTO_MEM,
 * TCP_LISTEN_OVERFLOW...).
 */
static __always_inline int on_kfree_skb(const bool direct, void *ctx, struct sk_buff *skb, __u32 reason,
					struct sock *rx_sk)
{
	struct packet_tuple tuple = {};
	struct tcp_scratch *buf;
	struct tcp_event *e;
	struct sock *sk;
	__u8 state;

	if (reason == cfg.consumed_reason || reason == cfg.not_dropped_reason)
		return 0;
	sk = rx_sk ? rx_sk : NS_RD(direct, skb, sk);
	if (!sk)
		return 0;
	state = NS_RD(direct, sk, __sk_common.skc_state);
	if (state != TCP_LISTEN && !bpf_map_lookup_elem(&queue_reasons, &reason))
		return 0;
	buf = seen_scratch(TCP_EV_SOCK_DROP);
	if (!buf)
		return 0;
	e = &buf->event;
	e->reason = reason;
	e->state = state;
	if (read_segment(direct, skb, buf, &tuple) >= 0 || tuple.family) {
		segment_endpoints(e, &tuple, true);
		e->tcp_flags = tuple.tcp_flags;
		e->has_trigger = tuple.l4proto == IPPROTO_TCP;
	} else {
		sock_endpoints(direct, (struct sock_common *)sk, e);
	}
	e->netns = skb_netns(direct, skb);
	if (!e->netns)
		e->netns = sock_netns(direct, sk);
	if (!event_kept(direct, ctx, e, sk))
		return 0;
	fill_tcp_details(direct, e, sk);
	e->value1 = NS_RD(direct, skb, len);
	if (state != TCP_LISTEN && ns_sk_fullsock_rd(direct, sk)) {
		e->backlog = NS_RD(direct, sk, sk_backlog.rmem_alloc.counter);
		e->max_backlog = NS_RD(direct, sk, sk_rcvbuf);
	}
	ns_device_rd(direct, NS_RD(direct, skb, dev), &e->ifindex, e->ifname);
	return submit(ctx, buf, -1);
}

/* Is `sk` a listener this SYN (to `daddr`) can have reached? Its bound address is the SYN's or a wildcard.
 * The pointer comes from a map, not from the kernel's arguments: every read is a copy. */
static __always_inline bool listener_takes(struct sock *sk, const struct packet_tuple *tuple)
{
	struct tcp_event bound = {};

	if (BPF_CORE_READ(sk, __sk_common.skc_state) != TCP_LISTEN)
		return false;
	sock_endpoints(false, (struct sock_common *)sk, &bound);
	for (int i = 0; i < 16; i++)
		if (bound.laddr[i] && bound.laddr[i] != tuple->daddr[i])
			return false;
	return true;
}

/* sk_acceptq_is_full() (include/net/sock.h). The SYN queue is not checked here: by the time the SYN is
 * consumed a request it created is already counted in it, so a full queue and an accepted SYN look alike;
 * the TcpExt counters (TCPReqQFullDrop, TCPReqQFullDoCookies) tell those apart instead. */
static __always_inline bool queue_full(struct sock *sk)
{
	return BPF_CORE_READ(sk, sk_ack_backlog) > BPF_CORE_READ(sk, sk_max_ack_backlog);
}

/*
 * A SYN a listener could not take is not a drop the kernel names: tcp_conn_request() (net/ipv4/tcp_input.c)
 * counts LINUX_MIB_LISTENOVERFLOWS and returns, and tcp_rcv_state_process() then consume_skb()s the SYN. So
 * every skb consumed from inside tcp_rcv_state_process is checked: a SYN whose listener (found through the
 * `listeners` map: listen() must have happened while we trace) has a full accept queue
 * (sk_acceptq_is_full: more waiting than the backlog). The checks run only for SYNs, the one compare
 * before them for every consumed skb.
 */
static __always_inline int on_consume_skb(const bool direct, void *ctx, struct sk_buff *skb, __u64 location)
{
	struct tcp_listener_slots *slots;
	struct packet_tuple tuple = {};
	struct tcp_scratch *buf;
	struct tcp_event *e;
	struct sock *sk = 0;
	__u32 port;

	if (location < cfg.rcv_state_process.start || location >= cfg.rcv_state_process.end)
		return 0;
	buf = fresh_scratch(TCP_EV_SOCK_DROP);
	if (!buf)
		return 0;
	if (read_segment(direct, skb, buf, &tuple) < 0 || (tuple.tcp_flags & 0x12) != 0x02) /* SYN, no ACK */
		return 0;
	port = tuple.dport;
	slots = bpf_map_lookup_elem(&listeners, &port);
	if (!slots)
		return 0;
	for (int i = 0; i < TCP_LISTENER_SLOTS; i++) {
		struct sock *candidate = (struct sock *)slots->sk[i];

		if (candidate && listener_takes(candidate, &tuple) && queue_full(candidate)) {
			sk = candidate;
			break;
		}
	}
	if (!sk)
		return 0;
	count(TCP_EV_SOCK_DROP, NS_STAT_SEEN);
	e = &buf->event;
	e->reason = TCP_REASON_SYN_ACCEPT_QUEUE_FULL;
	e->state = TCP_LISTEN;
	segment_endpoints(e, &tuple, true);
	e->tcp_flags = tuple.tcp_flags;
	e->has_trigger = 1;
	e->netns = sock_netns(false, sk);
	if (!event_kept(false, ctx, e, sk))
		return 0;
	fill_tcp_details(false, e, sk);
	e->value1 = NS_RD(direct, skb, len);
	return submit(ctx, buf, -1);
}

static __always_inline int on_rcvqueue_full(const bool direct, void *ctx, struct sock *sk, struct sk_buff *skb)
{
	struct tcp_scratch *buf;
	struct tcp_event *e;

	count(TCP_EV_RCVQ_FULL, NS_STAT_SEEN);
	if (!sk || !(buf = sock_scratch(direct, TCP_EV_RCVQ_FULL, sk)))
		return 0;
	e = &buf->event;
	e->reason = NS_RD(direct, sk, sk_protocol);
	if (!event_kept(direct, ctx, e, sk))
		return 0;
	e->backlog = NS_RD(direct, sk, sk_backlog.rmem_alloc.counter);
	e->max_backlog = NS_RD(direct, sk, sk_rcvbuf);
	e->value1 = e->backlog;
	e->value2 = skb ? NS_RD(direct, skb, truesize) : 0;
	e->value3 = e->max_backlog;
	return submit(ctx, buf, -1);
}

static __always_inline int on_mem_limit(const bool direct, void *ctx, struct sock *sk, long allocated,
					int mem_kind)
{
	struct tcp_scratch *buf;
	struct tcp_event *e;

	count(TCP_EV_MEM_LIMIT, NS_STAT_SEEN);
	if (!sk || !(buf = sock_scratch(direct, TCP_EV_MEM_LIMIT, sk)))
		return 0;
	e = &buf->event;
	e->reason = mem_kind; /* SK_MEM_SEND 0, SK_MEM_RECV 1 (include/net/sock.h) */
	if (!event_kept(direct, ctx, e, sk))
		return 0;
	e->value1 = allocated;
	if (mem_kind == 0) {
		e->backlog = NS_RD(direct, sk, sk_wmem_queued);
		e->max_backlog = NS_RD(direct, sk, sk_sndbuf);
	} else {
		e->backlog = NS_RD(direct, sk, sk_backlog.rmem_alloc.counter);
		e->max_backlog = NS_RD(direct, sk, sk_rcvbuf);
	}
	return submit(ctx, buf, -1);
}

/*
 * Two entry points per hook, one body: tp_btf (BTF-typed arguments, read directly) and raw_tp (kernels that
 * refuse tp_btf; every read a copy). Arguments beyond a tracepoint's arity on older kernels are read only
 * behind a cfg constant, so the verifier never sees the access where it would be out of bounds.
 */
#define TCP_ENTRY(name, tracepoint, handler, ...)                             \
	SEC("tp_btf/" tracepoint)                                             \
	int BPF_PROG(name##_b)                                                \
	{                                                                     \
		unsigned long long *args = ctx;                               \
		return handler(true, ctx, __VA_ARGS__);                       \
	}                                                                     \
	SEC("raw_tp/" tracepoint)                                             \
	int BPF_PROG(name##_r)                                                \
	{                                                                     \
		unsigned long long *args = ctx;                               \
		return handler(false, ctx, __VA_ARGS__);                      \
	}

TCP_ENTRY(nst_rst_sent, "tcp_send_reset", on_send_reset, (struct sock *)args[0], (struct sk_buff *)args[1],
	  cfg.has_reset_reason ? (__u32)args[2] : ~0U)
TCP_ENTRY(nst_rst_recv, "tcp_receive_reset", on_receive_reset, (struct sock *)args[0])
TCP_ENTRY(nst_rst_fw, "net_dev_queue", on_net_dev_queue, (struct sk_buff *)args[0])
TCP_ENTRY(nst_state, "inet_sock_set_state", on_state, (struct sock *)args[0], (int)args[1], (int)args[2])
TCP_ENTRY(nst_retrans, "tcp_retransmit_skb", on_retransmit, (struct sock *)args[0], (struct sk_buff *)args[1],
	  cfg.has_retrans_err ? (int)args[2] : 0)
TCP_ENTRY(nst_synack, "tcp_retransmit_synack", on_synack_retransmit, (struct sock *)args[0],
	  (struct request_sock *)args[1])
TCP_ENTRY(nst_error, "inet_sk_error_report", on_error_report, (struct sock *)args[0])
TCP_ENTRY(nst_skdrop, "kfree_skb", on_kfree_skb, (struct sk_buff *)args[0], (__u32)args[2],
	  cfg.has_rx_sk ? (struct sock *)args[3] : 0)
TCP_ENTRY(nst_synq, "consume_skb", on_consume_skb, (struct sk_buff *)args[0], (__u64)args[1])
TCP_ENTRY(nst_rcvq, "sock_rcvqueue_full", on_rcvqueue_full, (struct sock *)args[0], (struct sk_buff *)args[1])
TCP_ENTRY(nst_memlim, "sock_exceed_buf_limit", on_mem_limit, (struct sock *)args[0], (long)args[2],
	  (int)args[3])
