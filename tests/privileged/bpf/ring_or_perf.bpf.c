// SPDX-License-Identifier: GPL-2.0
/* The ring buffer -> perf buffer fallback, forced on a kernel that has both: one object declares a ring
 * buffer and a perf event array and picks one with a `const volatile` switch set before load. With
 * use_perf = 1 userspace also retires the ring buffer map (perfbuf.retire_ring_buffer_map), as it must on a
 * kernel without BPF_MAP_TYPE_RINGBUF; the ring buffer branch is dead code the verifier never walks. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

const volatile __u8 use_perf = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events_perf SEC(".maps");

enum { EMITTED = 0, LOST = 1 };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

struct record {
	__u64 seq;
	__u64 marker;
};

SEC("raw_tp/sys_enter")
int ring_or_perf(struct bpf_raw_tracepoint_args *ctx)
{
	struct record record = { .seq = ctx->args[0], .marker = 0x6e6574736c657568 };
	__u32 key;
	__u64 *count;
	long err;

	if (use_perf)
		err = bpf_perf_event_output(ctx, &events_perf, BPF_F_CURRENT_CPU, &record, sizeof(record));
	else
		err = bpf_ringbuf_output(&events, &record, sizeof(record), 0);
	key = err ? LOST : EMITTED;
	count = bpf_map_lookup_elem(&counts, &key);
	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
