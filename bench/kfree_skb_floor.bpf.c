// SPDX-License-Identifier: GPL-2.0
/*
 * The floor of tracing skb:kfree_skb: a tp_btf program that does nothing. What a storm loses with it attached
 * is what the kernel's dispatch costs (the tracepoint's static branch taken, bpf_trace_run4's recursion
 * guard and RCU section, the call): no tracer of this tracepoint can keep more of the untraced rate.
 * Built and loaded by bench/drops_storm.py (bench/floor_tracer.py); not part of the product.
 */
#include "netsleuth.bpf.h"
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

SEC("tp_btf/kfree_skb")
int BPF_PROG(kfree_skb_floor)
{
	return 0;
}
