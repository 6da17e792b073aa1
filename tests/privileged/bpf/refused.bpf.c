// SPDX-License-Identifier: GPL-2.0
/* A program the verifier must refuse (it dereferences an untrusted scalar): used to make loads fail on
 * purpose, e.g. to check each failing load gets its own libbpf messages when several run at once. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("raw_tp/sys_enter")
int refused(struct bpf_raw_tracepoint_args *ctx)
{
	return *(int *)(long)ctx->args[0];
}

char LICENSE[] SEC("license") = "GPL";
