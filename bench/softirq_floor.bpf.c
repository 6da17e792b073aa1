// SPDX-License-Identifier: GPL-2.0
/*
 * The floor of tracing what `netsleuth softirq` traces: tp_btf programs that do nothing, on the same four
 * tracepoints (bpf/softirq.bpf.c). What a storm loses with them attached is what the kernel's dispatch costs
 * (the tracepoint's static branch taken, bpf_trace_run's recursion guard and RCU section, the indirect call):
 * no tracer of these tracepoints can keep more of the untraced rate. Built and loaded by
 * bench/softirq_storm.py; not part of the product.
 */
#include "netsleuth.bpf.h"
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

SEC("tp_btf/softirq_raise")
int BPF_PROG(sfloor_raise)
{
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(sfloor_entry)
{
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(sfloor_exit)
{
	return 0;
}

SEC("tp_btf/napi_poll")
int BPF_PROG(sfloor_napi)
{
	return 0;
}
