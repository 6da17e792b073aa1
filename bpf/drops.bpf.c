// SPDX-License-Identifier: GPL-2.0
/*
 * netsleuth drops: every skb the kernel frees with a drop reason (tracepoint skb:kfree_skb).
 *
 * Every matching drop is counted exactly, in the kernel, by reason x location x netns (`drop_groups`) and in
 * the per-CPU `drop_stats`. Only then is an event offered to the ring buffer, and it may be sampled away on
 * purpose (1-in-N, or while the buffer is more than half full so the consumer can catch up) or lost when the
 * buffer is full; both are counted, so no drop is ever unaccounted for.
 *
 * Older kernels are served by what the running kernel's BTF says when libbpf loads the program (CO-RE
 * existence checks, below): skb:kfree_skb passes no `reason` before 5.17 (it is not read, and userspace infers
 * it from the location) and no rx_sk before 6.11, and there is no bpf_get_current_task_btf before 5.11 (the
 * current task's fields are copied instead); `cfg.ignore_reason` and `cfg.ignore_task_btf` force those paths
 * on a newer kernel. Before 5.8 there are no ring buffers: `ns_use_perfbuf`, set by the loader, sends events to
 * per-CPU perf buffers, counted the same way (bpf/emit.bpf.h).
 */
#define NS_EMIT_PERF_FALLBACK
#define NS_KFREE_SKB_HAS_REASON has_reason()
#define NS_KFREE_SKB_HAS_RX_SK has_rx_sk()
#include "netsleuth.bpf.h"
#include <bpf/bpf_tracing.h>
#include "drops.h"
#include "abi.h"
#include "emit.bpf.h"
#include "filter_maps.bpf.h"
#include "stack.bpf.h"

char LICENSE[] SEC("license") = "GPL";

const volatile struct drops_config cfg = {
	.sample_every = 1,
};

/*
 * The kernel's own types, as far as the program asks about them. libbpf relocates each question against the
 * running kernel's BTF while it loads the program (it reads that BTF anyway), so userspace looks nothing up
 * before load: a start does not parse the kernel's BTF a second time. The ___ns suffix keeps these local
 * (libbpf matches names without it).
 */
enum skb_drop_reason___ns {
	SKB_NOT_DROPPED_YET___ns,
	SKB_CONSUMED___ns,
	SKB_DROP_REASON_NETFILTER_DROP___ns,
	SKB_DROP_REASON_QUEUE_PURGE___ns,
};

/* skb:kfree_skb's record (include/trace/events/skb.h): its fields came with the tracepoint's arguments. */
struct trace_event_raw_kfree_skb___ns {
	void *rx_sk;			     /* 6.11, "net: add rx_sk to trace_kfree_skb" */
	enum skb_drop_reason___ns reason;    /* 5.17, c504e5c2f964 "net: skb: introduce kfree_skb_reason()" */
} __attribute__((preserve_access_index));

enum bpf_func_id___ns {
	BPF_FUNC_get_current_task_btf___ns,  /* 5.11 */
};

/* This kernel's number for a drop reason, ~0 when it has no such reason (never a reason's number). */
#define KERNEL_REASON(name)                                                                  \
	(bpf_core_enum_value_exists(enum skb_drop_reason___ns, name##___ns)                  \
		 ? (__u32)bpf_core_enum_value(enum skb_drop_reason___ns, name##___ns)        \
		 : ~0U)

static __always_inline bool has_reason(void)
{
	return !cfg.ignore_reason && bpf_core_field_exists(struct trace_event_raw_kfree_skb___ns, reason);
}

static __always_inline bool has_rx_sk(void)
{
	/* The older kernel ignore_reason stands for has neither. */
	return !cfg.ignore_reason && bpf_core_field_exists(struct trace_event_raw_kfree_skb___ns, rx_sk);
}

static __always_inline bool has_task_btf(void)
{
	return !cfg.ignore_task_btf &&
	       bpf_core_enum_value_exists(enum bpf_func_id___ns, BPF_FUNC_get_current_task_btf___ns);
}

#include "kfree_skb.bpf.h"
#include "own_sockets.bpf.h"

NS_ABI_KEEP(drops_abi_types);

NS_STATS_MAP(drop_stats, NS_STAT_COUNT);
NS_GROUP_MAP(drop_groups, struct drop_group_key, struct drop_group, DROPS_MAX_GROUPS);

/* Reasons for --reason / --exclude-reason (cfg.filter_reasons says which). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, DROPS_REASON_FILTER_SIZE);
	__type(key, __u32);
	__type(value, __u8);
} reason_filter SEC(".maps");

struct drop_scratch {
	struct drop_event event;
	__u8 tail[DROPS_MAX_FRAMES * 8 + DROPS_MAX_SNAPLEN];
};

NS_SCRATCH_MAP(scratch, struct drop_scratch);
NS_SCRATCH_MAP(drop_runs, struct drop_run);
NS_SCRATCH_MAP(hook_paths, struct drop_hook_path);

static __always_inline void count(enum ns_stat stat)
{
	ns_count(&drop_stats, stat);
}

static __always_inline bool ports_match(const struct packet_tuple *tuple)
{
	if (!cfg.port && !cfg.sport && !cfg.dport)
		return true;
	if (!tuple->has_ports || tuple->l4proto == IPPROTO_ICMP || tuple->l4proto == IPPROTO_ICMPV6)
		return false;
	return ns_ports_match(cfg.port, cfg.sport, cfg.dport, tuple->sport, tuple->dport);
}

static __always_inline bool addresses_match(const struct packet_tuple *tuple)
{
	if (cfg.family && tuple->family != cfg.family)
		return false;
	return ns_addresses_match(cfg.filter_host, cfg.filter_src, cfg.filter_dst, tuple->family, tuple->saddr,
				  tuple->daddr);
}

static __always_inline bool needs_packet(void)
{
	return cfg.filter_l4proto || cfg.port || cfg.sport || cfg.dport || cfg.family || cfg.filter_host ||
	       cfg.filter_src || cfg.filter_dst;
}

/* ns_in_task for kernels before 5.11, which lack bpf_get_current_task_btf: bpf_get_current_task (4.8) gives the
 * task as a plain number, so its fields are copied. Behind has_task_btf(), a constant at load, so only one of
 * the two helpers is left in the loaded program (the other is dead code the verifier removes before checking
 * helper ids). */
static __always_inline bool in_task_copied(void *ctx, __u64 thread_size, bool *kthread)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 stack = (__u64)BPF_CORE_READ(task, stack);
	__u64 frame = (__u64)ctx;

	*kthread = BPF_CORE_READ(task, flags) & PF_KTHREAD;
	return frame >= stack && frame < stack + thread_size;
}

/* Who was running and whose socket the packet is: what attribution and --pid/--comm need. */
static __always_inline void fill_owner(const bool direct, void *ctx, struct drop_event *event, struct sock *sk)
{
	bool kthread = false;

	event->in_task = has_task_btf() ? ns_in_task(ctx, cfg.thread_size, &kthread)
				      : in_task_copied(ctx, cfg.thread_size, &kthread);
	event->kthread = kthread;
	if (event->in_task)
		ns_current_task(&event->pid, &event->tid, event->comm);
	event->sk_state = 0xff;
	if (sk) {
		event->sock_ino = ns_sock_ino_rd(direct, sk);
		event->sk_state = NS_RD(direct, sk, __sk_common.skc_state);
	}
}

static __always_inline void add_to_group(struct drop_group *group, __u64 count, __u64 bytes)
{
	__sync_fetch_and_add(&group->count, count);
	__sync_fetch_and_add(&group->bytes, bytes);
}

static __always_inline bool same_kind(const struct drop_group_key *a, const struct drop_group_key *b)
{
	return a->location == b->location && a->reason == b->reason && a->netns == b->netns;
}

/* Add this CPU's pending run to its group (bpf/drops.h struct drop_run). */
static __always_inline void flush_run(struct drop_run *run)
{
	struct drop_group *group;

	if (!run->count)
		return;
	run->flushes++;
	group = bpf_map_lookup_elem(&drop_groups, &run->key);
	if (group)
		add_to_group(group, run->count, run->bytes);
	else
		ns_count_n(&drop_stats, NS_STAT_UNGROUPED, run->count); /* userspace forgot the group meanwhile */
	run->count = 0;
	run->bytes = 0;
	run->flushes++;
}

/* The same packet as far as a ruleset can tell two of one flow apart: addresses, ports, protocol, TCP flags
 * and length (a connection's SYN and its later segments can meet different rules in different hooks). The
 * tuple is compared as the six words it is; every event clears it before filling it, padding included. */
static __always_inline bool same_packet(const struct packet_tuple *a, const struct packet_tuple *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	_Static_assert(sizeof(struct packet_tuple) == 6 * sizeof(__u64), "struct packet_tuple is six words");
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4] && x[5] == y[5];
}

/* The frames that name a netfilter drop's hook, into `frames` (room for DROPS_MAX_FRAMES): this CPU's last
 * unwind when the drop took the same path within DROPS_HOOK_PATH_NS (bpf/drops.h struct drop_hook_path),
 * else a fresh one, remembered. Returns the bytes written. */
static __always_inline long hook_frames(void *ctx, const struct drop_event *event, __u64 *frames)
{
	struct drop_hook_path *path;
	__u32 zero = 0;
	long bytes;

	path = bpf_map_lookup_elem(&hook_paths, &zero);
	if (!path)
		return ns_take_stack(ctx, frames, DROPS_MAX_FRAMES * 8);
	if (path->taken_ns && event->time_ns - path->taken_ns < DROPS_HOOK_PATH_NS &&
	    path->location == event->location && path->netns == event->netns &&
	    path->ifindex == event->ifindex && path->tid == event->tid &&
	    same_packet(&path->tuple, &event->tuple)) {
		__builtin_memcpy(frames, path->frames, sizeof(path->frames));
		/* Bounded again for the verifier: it cannot know what a map value holds. */
		return path->bytes < sizeof(path->frames) ? path->bytes : sizeof(path->frames);
	}
	bytes = ns_take_stack(ctx, path->frames, sizeof(path->frames));
	__builtin_memcpy(frames, path->frames, sizeof(path->frames));
	path->bytes = bytes;
	path->taken_ns = bytes ? event->time_ns : 0;
	path->location = event->location;
	path->netns = event->netns;
	path->ifindex = event->ifindex;
	path->tid = event->tid;
	path->tuple = event->tuple;
	return bytes;
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
	struct drop_run *run;
	struct drop_scratch *buf;
	struct drop_event *event;
	struct net_device *dev;
	struct sock *sk;
	unsigned char *l3 = 0;
	bool have_packet = false, have_device = false, have_owner = false, grouped;
	__u32 zero = 0, skb_len;
	__u64 size;

	/* Without reasons the tracepoint fires only for drops (consume_skb has its own before 5.17). */
	if (has_reason() && (reason == KERNEL_REASON(SKB_CONSUMED) || reason == KERNEL_REASON(SKB_NOT_DROPPED_YET)))
		return 0;
	count(NS_STAT_SEEN);

	if (cfg.filter_reasons) {
		bool listed = bpf_map_lookup_elem(&reason_filter, &reason) != 0;

		if (listed != (cfg.filter_reasons == 1))
			return 0;
	}

	/* netsleuth's own footprint is not the host's: the unread messages its own tools' netlink sockets held
	 * when they closed (bpf/own_sockets.bpf.h). Asked of that one reason, only when userspace wants it. */
	if (cfg.self_tgid && reason == KERNEL_REASON(SKB_DROP_REASON_QUEUE_PURGE) &&
	    ns_own_socket(rx_sk ? rx_sk : NS_RD(direct, skb, sk))) {
		ns_count_own();
		return 0;
	}

	buf = bpf_map_lookup_elem(&scratch, &zero);
	if (!buf)
		return 0;
	event = &buf->event;

	dev = NS_RD(direct, skb, dev);
	sk = rx_sk ? rx_sk : NS_RD(direct, skb, sk);
	group_key.netns = ns_skb_netns_rd(direct, dev, sk);
	if (!ns_netns_matches(cfg.netns, cfg.filter_netns, group_key.netns))
		return 0;

	/* Cleared only when some field will be written: the common --summary path never touches the event. */
	if (cfg.filter_dev || needs_packet() || cfg.filter_owner)
		__builtin_memset(event, 0, sizeof(*event));
	if (cfg.filter_dev) {
		ns_device_rd(direct, dev, &event->ifindex, event->ifname);
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
		if (!(event->in_task && ns_task_matches(event->pid, event->comm, cfg.pid, cfg.comm)) &&
		    !ns_owned_inode(event->sock_ino))
			return 0;
	}
	count(NS_STAT_MATCHED);

	skb_len = NS_RD(direct, skb, len);
	group_key.location = (__u64)location;
	group_key.reason = reason;
	run = bpf_map_lookup_elem(&drop_runs, &zero);
	if (!run)
		return 0;
	if (same_kind(&run->key, &group_key)) {
		/* The storm case: the kind this CPU counted last (its group exists) comes again. */
		run->count++;
		run->bytes += skb_len;
		if (!cfg.emit_events)
			return 0;
		grouped = true;
	} else {
		/* Another kind: the pending run goes to its group, and this drop to its own directly (as many
		 * lookups as without runs when kinds alternate); the run starts if the kind comes again. */
		flush_run(run);
		group = bpf_map_lookup_elem(&drop_groups, &group_key);
		grouped = group != 0;
		if (grouped) {
			add_to_group(group, 1, skb_len);
			run->key = group_key;
			if (!cfg.emit_events)
				return 0;
		}
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
		ns_device_rd(direct, dev, &event->ifindex, event->ifname);
	if (!have_packet)
		ns_parse_packet_rd(direct, skb, &event->tuple, &l3);
	if (!have_owner)
		fill_owner(direct, ctx, event, sk);

	if (!grouped) {
		/* First drop of this kind: it becomes the group's example, with a few frames for the hook. Built in
		 * the packet area of the scratch buffer, which is filled only later. */
		struct drop_group *fresh = (struct drop_group *)(buf->tail + DROPS_MAX_FRAMES * 8);

		fresh->count = 1;
		fresh->bytes = skb_len;
		__builtin_memcpy(&fresh->example, event, sizeof(*event));
		fresh->example.nr_frames =
			ns_take_stack(ctx, fresh->example_frames, sizeof(fresh->example_frames)) / 8;
		group = ns_group_insert(&drop_groups, &group_key, fresh, &drop_stats, 0);
		if (group)
			add_to_group(group, 1, skb_len);
	}

	if (!cfg.emit_events || !ns_emit_wanted(&drop_stats, 0, cfg.sample_every))
		return 0;

	size = 0;
	/* --stack, and every event when no reason tells a netfilter drop, unwinds its own stack; a netfilter
	 * drop's frames serve only its hook, the same for a whole flow (hook_frames). */
	if (cfg.want_stack || !has_reason())
		size = ns_take_stack(ctx, buf->tail, DROPS_MAX_FRAMES * 8);
	else if (reason == KERNEL_REASON(SKB_DROP_REASON_NETFILTER_DROP))
		size = hook_frames(ctx, event, (__u64 *)buf->tail);
	event->nr_frames = (__u64)size / 8;
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
	ns_output_ctx(ctx, &drop_stats, 0, buf, size);
	return 0;
}

/* One body, three entry points (bpf/kfree_skb.bpf.h), tried in this order: tp_btf through untrusted pointers
 * (the quickest to verify, 6.3+), tp_btf (5.5+), raw_tp for kernels that refuse tp_btf. */
NS_KFREE_SKB_UNTRUSTED_ENTRY(drops_tp_btf, handle_drop)
/* Loaded only when a run leaves netsleuth's own drops out (cfg.self_tgid): programs own_sent_<variant>. */
NS_OWN_SOCKET_MARKERS(own_sent, cfg.self_tgid)
NS_KFREE_SKB_PROGRAMS(drops_tp_btf_tr, drops_raw_tp, handle_drop)
