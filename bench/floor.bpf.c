// SPDX-License-Identifier: GPL-2.0
/*
 * The floor of tracing a tracepoint: tp_btf programs that do nothing. What a storm loses with them attached
 * is what the kernel's dispatch costs (the tracepoint's static branch taken, bpf_trace_run's recursion guard
 * and RCU section, the call): no BPF tracer of those tracepoints can keep more of the untraced rate.
 * The _clk programs read the clock once and do nothing else: the least a tracer that times softirqs (raise ->
 * entry -> exit) must do on top of the floor.
 * Built and attached by the benchmarks (bench/floor_tracer.py); not part of the product.
 */
#include "netsleuth.bpf.h"
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

#define FLOOR(name, tracepoint)     \
	SEC("tp_btf/" tracepoint)   \
	int BPF_PROG(name)          \
	{                           \
		return 0;           \
	}

FLOOR(kfree_skb_floor, "kfree_skb")
FLOOR(sirq_raise_floor, "softirq_raise")
FLOOR(sirq_entry_floor, "softirq_entry")
FLOOR(sirq_exit_floor, "softirq_exit")
FLOOR(napi_poll_floor, "napi_poll")

#define CLOCKED(name, tracepoint)           \
	SEC("tp_btf/" tracepoint)           \
	int BPF_PROG(name)                  \
	{                                   \
		bpf_ktime_get_ns();         \
		return 0;                   \
	}

CLOCKED(sirq_raise_clk, "softirq_raise")
CLOCKED(sirq_entry_clk, "softirq_entry")
CLOCKED(sirq_exit_clk, "softirq_exit")
