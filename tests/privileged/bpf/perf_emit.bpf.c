// SPDX-License-Identifier: GPL-2.0
/* Test program for src/netsleuth/bpf/perfbuf.py: each run emits one 248-byte record to a perf event array
 * and counts, as every netsleuth program does for its ring buffer, whether it got there (EMITTED) or not
 * (LOST: that CPU's buffer was full). Run with BPF_PROG_TEST_RUN, so the test decides exactly how many. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");

enum { EMITTED = 0, LOST = 1 };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

struct record {
	__u64 seq;
	__u8 payload[240];
};

SEC("raw_tp/sys_enter")
int perf_emit(struct bpf_raw_tracepoint_args *ctx)
{
	struct record record = {};
	__u32 key;
	__u64 *count;

	record.seq = ctx->args[0];
	record.payload[0] = 0xab;
	key = bpf_perf_event_output(ctx, &events, BPF_F_CURRENT_CPU, &record, sizeof(record)) ? LOST : EMITTED;
	count = bpf_map_lookup_elem(&counts, &key);
	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
