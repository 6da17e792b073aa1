// SPDX-License-Identifier: GPL-2.0
/*
 * netsleuth profile: on-CPU sampling. Userspace opens a software CPU clock perf event on every CPU at --hz
 * (perf_event_open, PERF_COUNT_SW_CPU_CLOCK) and attaches `profile_sample` to each; every sample takes the
 * kernel and user stacks into a stack map (bpf_get_stackid: identical stacks share one id) and counts
 * (pid, kernel stack, user stack, comm) in `profile_counts` - in the kernel, so the counts are exact and only
 * the distinct stacks cross to userspace, once, at the end.
 *
 * --softirq VEC: irq:softirq_entry/exit keep a per-CPU "vector running" flag; a sample taken while it is set
 * ran inside that softirq's handler (the clock interrupt arrives on the softirq's stack, so the kernel stack
 * shows what the handler was doing: who burns the network CPU), whatever task it interrupted.
 *
 * Samples whose stack the map could not hold (bpf_get_stackid < 0), or that found the counts table full, are
 * counted in `profile_stats` and still reported (as a "[lost stack]" frame, or in the totals).
 */
#include "netsleuth.bpf.h"
#include "netsleuth_kernel_more.h"
#include <bpf/bpf_tracing.h>
#include "profile.h"
#define NS_FILTER_NETNS_ONLY
#include "filter_maps.bpf.h"
#include "abi.h"

char LICENSE[] SEC("license") = "GPL";

const volatile struct profile_config cfg = {
	.softirq = PROFILE_NO_SOFTIRQ,
};

NS_ABI_KEEP(profile_abi_types);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PROFILE_STATS);
	__type(key, __u32);
	__type(value, __u64);
} profile_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, PROFILE_MAX_STACKS);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, PROFILE_MAX_FRAMES * sizeof(__u64));
} profile_stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PROFILE_MAX_COUNTS);
	__type(key, struct profile_key);
	__type(value, __u64);
} profile_counts SEC(".maps");

/* Per CPU: the softirq vector running now + 1; 0 (the array's initial value) outside one. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} running_softirq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct profile_new_pids);
} new_pids SEC(".maps");

static __always_inline void note_new_pid(__u32 pid)
{
	__u32 zero = 0;
	struct profile_new_pids *recent = bpf_map_lookup_elem(&new_pids, &zero);

	if (!recent)
		return;
	recent->pids[recent->head & (PROFILE_NEW_PIDS - 1)] = pid;
	recent->head++;
}

static __always_inline void count(enum profile_stat stat)
{
	__u32 index = stat;
	__u64 *value = bpf_map_lookup_elem(&profile_stats, &index);

	if (value)
		*value += 1;
}

static __always_inline __u32 running_vector(void)
{
	__u32 zero = 0;
	__u32 *running = bpf_map_lookup_elem(&running_softirq, &zero);

	return running && *running ? *running - 1 : PROFILE_NO_SOFTIRQ;
}

static __always_inline __u32 current_netns(void)
{
	struct task_struct___more *task = (void *)bpf_get_current_task();
	struct nsproxy *nsproxy = BPF_CORE_READ(task, nsproxy);

	return nsproxy ? ns_net_inum(BPF_CORE_READ(nsproxy, net_ns)) : 0;
}

SEC("perf_event")
int profile_sample(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct profile_key key = {};
	__u64 one = 1;
	__u64 *counted;
	__u32 vec;

	count(PROFILE_SAMPLES);
	vec = running_vector();
	if (cfg.softirq != PROFILE_NO_SOFTIRQ && vec != cfg.softirq)
		return 0;
	key.pid = pid_tgid >> 32;
	/* The idle task is pid 0 on every CPU; a softirq that interrupted it is still work (--softirq). */
	if (!key.pid && !cfg.include_idle && cfg.softirq == PROFILE_NO_SOFTIRQ) {
		count(PROFILE_IDLE);
		return 0;
	}
	if (cfg.pid && key.pid != cfg.pid)
		return 0;
	bpf_get_current_comm(key.comm, sizeof(key.comm));
	if (cfg.comm[0] && !ns_name_matches(key.comm, cfg.comm))
		return 0;
	if (cfg.cgroup_id && bpf_get_current_cgroup_id() != cfg.cgroup_id)
		return 0;
	if (!NS_NETNS_WANTED(cfg.netns, cfg.filter_netns, current_netns()))
		return 0;
	count(PROFILE_MATCHED);
	key.in_softirq = vec != PROFILE_NO_SOFTIRQ;
	key.kernel_stack = -1;
	key.user_stack = -1;
	if (!cfg.user_only) {
		key.kernel_stack = bpf_get_stackid(ctx, &profile_stacks, 0);
		/* -EFAULT: the sample hit user mode, there is no kernel stack; any other error lost one. */
		if (key.kernel_stack < 0 && key.kernel_stack != -14)
			count(PROFILE_KERNEL_LOST);
	}
	/* A user stack only for a user task outside a softirq: in a softirq the user registers are the
	 * interrupted task's, not the work being done. */
	if (!cfg.kernel_only && key.pid && !key.in_softirq) {
		key.user_stack = bpf_get_stackid(ctx, &profile_stacks, BPF_F_USER_STACK);
		if (key.user_stack < 0 && key.user_stack != -14 /* -EFAULT: a kernel thread */)
			count(PROFILE_USER_LOST);
	}
	counted = bpf_map_lookup_elem(&profile_counts, &key);
	if (counted) {
		__sync_fetch_and_add(counted, 1);
		return 0;
	}
	if (!bpf_map_update_elem(&profile_counts, &key, &one, BPF_NOEXIST)) {
		if (key.user_stack >= 0)
			note_new_pid(key.pid);
	} else {
		counted = bpf_map_lookup_elem(&profile_counts, &key);
		if (counted)
			__sync_fetch_and_add(counted, 1);
		else
			count(PROFILE_UNCOUNTED);
	}
	return 0;
}

static __always_inline int set_running(__u32 running)
{
	__u32 zero = 0;

	bpf_map_update_elem(&running_softirq, &zero, &running, BPF_ANY);
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(profile_sirq_entry_b, unsigned int vec)
{
	return set_running(vec + 1);
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(profile_sirq_exit_b, unsigned int vec)
{
	return set_running(0);
}

SEC("raw_tp/softirq_entry")
int BPF_PROG(profile_sirq_entry_r, unsigned int vec)
{
	return set_running(vec + 1);
}

SEC("raw_tp/softirq_exit")
int BPF_PROG(profile_sirq_exit_r, unsigned int vec)
{
	return set_running(0);
}
