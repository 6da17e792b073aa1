// SPDX-License-Identifier: GPL-2.0
/*
 * netsleuth drops: every skb the kernel frees with a drop reason (tracepoint skb:kfree_skb).
 *
 * Every matching drop is counted exactly, in the kernel, by reason x location x netns (`drop_groups`) and in
 * the per-CPU `drop_stats`. Only then is an event offered to the ring buffer, and it may be sampled away on
 * purpose (1-in-N, or while the buffer is more than half full so the consumer can catch up) or lost when the
 * buffer is full; both are counted, so no drop is ever unaccounted for.
 */
#include "netsleuth.bpf.h"
#include <bpf/bpf_tracing.h>
#include "drops.h"

char LICENSE[] SEC("license") = "GPL";

const volatile struct drops_config cfg = {
	.consumed_reason = ~0U,
	.not_dropped_reason = ~0U,
	.netfilter_reason = ~0U,
	.sample_every = 1,
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROP_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} drop_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, DROPS_MAX_GROUPS);
	__type(key, struct drop_group_key);
	__type(value, struct drop_group);
} drop_groups SEC(".maps");

/* Reasons for --reason / --exclude-reason (cfg.filter_reasons says which). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} reason_filter SEC(".maps");

#include "filter_maps.bpf.h"

struct drop_scratch {
	struct drop_event event;
	__u8 tail[DROPS_MAX_FRAMES * 8 + DROPS_MAX_SNAPLEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct drop_scratch);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sample_counter SEC(".maps");

static __always_inline void count(enum drop_stat stat)
{
	__u32 key = stat;
	__u64 *value = bpf_map_lookup_elem(&drop_stats, &key);

	if (value)
		*value += 1;
}

static __always_inline bool ports_match(const struct packet_tuple *tuple)
{
	if (!cfg.port && !cfg.sport && !cfg.dport)
		return true;
	if (!tuple->has_ports || tuple->l4proto == IPPROTO_ICMP || tuple->l4proto == IPPROTO_ICMPV6)
		return false;
	if (cfg.port && tuple->sport != cfg.port && tuple->dport != cfg.port)
		return false;
	if (cfg.sport && tuple->sport != cfg.sport)
		return false;
	if (cfg.dport && tuple->dport != cfg.dport)
		return false;
	return true;
}

static __always_inline bool addresses_match(const struct packet_tuple *tuple)
{
	if (!cfg.filter_host && !cfg.filter_src && !cfg.filter_dst && !cfg.family)
		return true;
	if (tuple->family != 4 && tuple->family != 6)
		return false;
	if (cfg.family && tuple->family != cfg.family)
		return false;
	if (cfg.filter_host && !ns_addr_in(&host_filter, tuple->family, tuple->saddr) &&
	    !ns_addr_in(&host_filter, tuple->family, tuple->daddr))
		return false;
	if (cfg.filter_src && !ns_addr_in(&src_filter, tuple->family, tuple->saddr))
		return false;
	if (cfg.filter_dst && !ns_addr_in(&dst_filter, tuple->family, tuple->daddr))
		return false;
	return true;
}

static __always_inline bool task_matches(const struct drop_event *event)
{
	if (cfg.pid && event->pid != cfg.pid)
		return false;
	return !cfg.comm[0] || ns_name_matches(event->comm, cfg.comm);
}

static __always_inline bool should_emit(void)
{
	__u32 zero = 0;
	__u64 *counter;

	if (!cfg.emit_events)
		return false;
	/* Back-pressure: past half full, drop to sampling so the consumer catches up instead of losing. */
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > (8 << 20) / 2)
		return false;
	if (cfg.sample_every <= 1)
		return true;
	counter = bpf_map_lookup_elem(&sample_counter, &zero);
	if (!counter)
		return true;
	*counter += 1;
	return *counter % cfg.sample_every == 0;
}

/* The kernel stack into `frames`; returns its size in bytes, 0..DROPS_MAX_FRAMES * 8. */
static __always_inline long take_stack(void *ctx, __u8 *frames)
{
	long got = bpf_get_stack(ctx, frames, DROPS_MAX_FRAMES * 8, 0);

	if (got <= 0)
		return 0;
	return got > DROPS_MAX_FRAMES * 8 ? DROPS_MAX_FRAMES * 8 : got;
}

static __always_inline bool needs_packet(void)
{
	return cfg.filter_l4proto || cfg.port || cfg.sport || cfg.dport || cfg.family || cfg.filter_host ||
	       cfg.filter_src || cfg.filter_dst;
}

static __always_inline void fill_device(const bool direct, struct drop_event *event, struct net_device *dev)
{
	if (dev) {
		event->ifindex = NS_RD(direct, dev, ifindex);
		BPF_CORE_READ_STR_INTO(&event->ifname, dev, name);
	}
}

/* Who was running and whose socket the packet is: what attribution and --pid/--comm need. */
static __always_inline void fill_owner(const bool direct, void *ctx, struct drop_event *event, struct sock *sk)
{
	bool kthread = false;

	event->in_task = ns_in_task(ctx, cfg.thread_size, &kthread);
	event->kthread = kthread;
	if (event->in_task) {
		__u64 pid_tgid = bpf_get_current_pid_tgid();

		event->pid = pid_tgid >> 32;
		event->tid = (__u32)pid_tgid;
		bpf_get_current_comm(&event->comm, sizeof(event->comm));
	}
	event->sk_state = 0xff;
	if (sk) {
		event->sock_ino = ns_sock_ino_rd(direct, sk);
		event->sk_state = NS_RD(direct, sk, __sk_common.skc_state);
	}
}

static __always_inline void add_to_group(struct drop_group *group, __u32 skb_len)
{
	__sync_fetch_and_add(&group->count, 1);
	__sync_fetch_and_add(&group->bytes, skb_len);
}

/*
 * The hot path is kept short for --summary: with no packet or owner filter, a drop of an already-seen kind
 * costs a few reads, one hash lookup and two atomic adds. Everything else (packet, device, owner, stack) is
 * read only when a filter, a new group's example or an emitted event needs it.
 */
static __always_inline int handle_drop(void *ctx, struct sk_buff *skb, void *location, __u32 reason,
				       struct sock *rx_sk, const bool direct)
{
	struct drop_group_key group_key = {};
	struct drop_group *group;
	struct drop_scratch *buf;
	struct drop_event *event;
	struct net_device *dev;
	struct sock *sk;
	unsigned char *l3 = 0;
	bool have_packet = false, have_device = false, have_owner = false;
	__u32 zero = 0, skb_len;
	__u64 size;

	if (reason == cfg.consumed_reason || reason == cfg.not_dropped_reason)
		return 0;
	count(DROP_STAT_SEEN);

	if (cfg.filter_reasons) {
		bool listed = bpf_map_lookup_elem(&reason_filter, &reason) != 0;

		if (listed != (cfg.filter_reasons == 1))
			return 0;
	}

	buf = bpf_map_lookup_elem(&scratch, &zero);
	if (!buf)
		return 0;
	event = &buf->event;

	dev = NS_RD(direct, skb, dev);
	sk = rx_sk ? rx_sk : NS_RD(direct, skb, sk);
	/* The device's netns is where the packet was; a packet not yet given a device belongs to its socket's. */
	group_key.netns = dev ? ns_net_inum_rd(direct, NS_RD(direct, dev, nd_net.net)) : 0;
	if (!group_key.netns && sk)
		group_key.netns = ns_net_inum_rd(direct, NS_RD(direct, sk, __sk_common.skc_net.net));
	if (cfg.netns && group_key.netns != cfg.netns)
		return 0;

	/* Cleared only when some field will be written: the common --summary path never touches the event. */
	if (cfg.filter_dev || needs_packet() || cfg.filter_owner)
		__builtin_memset(event, 0, sizeof(*event));
	if (cfg.filter_dev) {
		fill_device(direct, event, dev);
		have_device = true;
		if (!ns_name_matches(event->ifname, cfg.dev))
			return 0;
	}
	if (needs_packet()) {
		ns_parse_packet_rd(direct, skb, &event->tuple, &l3);
		have_packet = true;
		if (cfg.filter_l4proto && event->tuple.l4proto != cfg.l4proto)
			return 0;
		if (!ports_match(&event->tuple) || !addresses_match(&event->tuple))
			return 0;
	}
	if (cfg.filter_owner) {
		fill_owner(direct, ctx, event, sk);
		have_owner = true;
		/* A drop in the task's own context is matched on the task; in softirq, on the socket's owner. */
		if (!(event->in_task && task_matches(event)) &&
		    !(event->sock_ino && bpf_map_lookup_elem(&owner_inodes, &event->sock_ino)))
			return 0;
	}
	count(DROP_STAT_MATCHED);

	skb_len = NS_RD(direct, skb, len);
	group_key.location = (__u64)location;
	group_key.reason = reason;
	group = bpf_map_lookup_elem(&drop_groups, &group_key);
	if (group) {
		add_to_group(group, skb_len);
		if (!cfg.emit_events)
			return 0;
	}

	if (!(cfg.filter_dev || needs_packet() || cfg.filter_owner))
		__builtin_memset(event, 0, sizeof(*event));
	event->time_ns = bpf_ktime_get_ns();
	event->location = group_key.location;
	event->reason = reason;
	event->netns = group_key.netns;
	event->skb_len = skb_len;
	event->cpu = bpf_get_smp_processor_id();
	if (!have_device)
		fill_device(direct, event, dev);
	if (!have_packet)
		ns_parse_packet_rd(direct, skb, &event->tuple, &l3);
	if (!have_owner)
		fill_owner(direct, ctx, event, sk);

	if (!group) {
		/* First drop of this kind: it becomes the group's example, with a few frames for the hook. Built in
		 * the packet area of the scratch buffer, which is filled only later. */
		struct drop_group *fresh = (struct drop_group *)(buf->tail + DROPS_MAX_FRAMES * 8);
		long got;

		fresh->count = 1;
		fresh->bytes = skb_len;
		__builtin_memcpy(&fresh->example, event, sizeof(*event));
		got = bpf_get_stack(ctx, fresh->example_frames, sizeof(fresh->example_frames), 0);
		fresh->example.nr_frames = got > 0 ? (__u64)got / 8 : 0;
		if (bpf_map_update_elem(&drop_groups, &group_key, fresh, BPF_NOEXIST)) {
			/* Another CPU inserted it first, or the map is full. */
			group = bpf_map_lookup_elem(&drop_groups, &group_key);
			if (group)
				add_to_group(group, skb_len);
			else
				count(DROP_STAT_UNGROUPED);
		}
	}

	if (!should_emit()) {
		if (cfg.emit_events)
			count(DROP_STAT_SAMPLED);
		return 0;
	}

	size = 0;
	if (cfg.want_stack || reason == cfg.netfilter_reason) {
		size = take_stack(ctx, buf->tail);
		event->nr_frames = (__u64)size / 8;
	}
	if (cfg.snaplen && l3 && event->tuple.l3_len) {
		/* Only the linear part is safe to copy: paged data is not behind skb->head. */
		unsigned char *data = NS_RD(direct, skb, data);
		unsigned int linear = skb_len - NS_RD(direct, skb, data_len);
		long available = (long)((data + linear) - l3);
		__u32 caplen = cfg.snaplen;

		if (available < caplen)
			caplen = available > 0 ? available : 0;
		if (caplen > DROPS_MAX_SNAPLEN)
			caplen = DROPS_MAX_SNAPLEN;
		if (caplen && !bpf_probe_read_kernel(buf->tail + size, caplen, l3))
			event->caplen = caplen;
	}
	size += sizeof(*event) + event->caplen;
	if (size > sizeof(*buf))
		size = sizeof(*buf);
	if (bpf_ringbuf_output(&events, buf, size, 0)) {
		count(DROP_STAT_LOST);
		return 0;
	}
	count(DROP_STAT_EMITTED);
	return 0;
}

/* One body, two entry points: tp_btf (BTF-typed arguments) and raw_tp for kernels that refuse tp_btf. */
#define DROPS_ENTRY(name, section, direct)                                                                 \
	SEC(section)                                                                                 \
	int BPF_PROG(name)                                                                           \
	{                                                                                            \
		unsigned long long *args = ctx;                                                      \
                                                                                                     \
		return handle_drop(ctx, (struct sk_buff *)args[0], (void *)args[1], (__u32)args[2],  \
				   cfg.has_rx_sk ? (struct sock *)args[3] : 0, direct);              \
	}

DROPS_ENTRY(drops_tp_btf, "tp_btf/kfree_skb", true)
DROPS_ENTRY(drops_raw_tp, "raw_tp/kfree_skb", false)
