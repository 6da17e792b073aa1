/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared between profile.bpf.c and userspace. Fixed-width types only; the Python mirrors are generated
 * from the object's BTF (src/netsleuth/_generated/profile_abi.py, `make bpf`) and checked again at load.
 */
#ifndef NETSLEUTH_PROFILE_H
#define NETSLEUTH_PROFILE_H

enum profile_limits {
	PROFILE_MAX_FRAMES = 127,	/* PERF_MAX_STACK_DEPTH: one stack map value */
	PROFILE_MAX_STACKS = 16384,	/* distinct stacks the stack map holds (userspace may resize it) */
	PROFILE_MAX_COUNTS = 40960,	/* distinct (pid, kernel stack, user stack) counted */
	PROFILE_NO_SOFTIRQ = 0xff,
	PROFILE_NEW_PIDS = 64,		/* per CPU: the last pids that got a new counts entry (a power of two) */
};

/* Per-CPU counters (`profile_stats`). */
enum profile_stat {
	PROFILE_SAMPLES = 0,		/* the clock fired (every CPU, every task) */
	PROFILE_MATCHED = 1,		/* passed every filter: the exact sample count */
	PROFILE_KERNEL_LOST = 2,	/* matched, but the kernel stack did not fit in the stack map */
	PROFILE_USER_LOST = 3,		/* matched, but the user stack did not fit (or could not be read) */
	PROFILE_UNCOUNTED = 4,		/* matched, but the counts table was full: counted here only */
	PROFILE_IDLE = 5,		/* the CPU was idle (pid 0) and idle is not profiled */
	PROFILE_STATS = 6,
};

struct profile_config {
	__u64 cgroup_id;	/* --cgroup: cgroup v2 id */
	__u32 pid;		/* --pid: tgid */
	__u32 netns;		/* --netns: the task's network namespace */
	char comm[16];
	__u8 kernel_only;	/* no user stacks */
	__u8 user_only;
	__u8 include_idle;
	__u8 softirq;		/* only samples while this vector runs (PROFILE_NO_SOFTIRQ: any time) */
	__u8 filter_netns;	/* keep only namespaces in `netns_filter` (instead of `netns`) */
	__u8 pad[3];
};

/* What one sample is counted by. A stack id < 0 is the error bpf_get_stackid returned (-EEXIST: the map
 * held another stack in that slot, -ENOMEM, -EFAULT), or -1 when not asked for. */
struct profile_key {
	__u32 pid;		/* tgid */
	__s32 kernel_stack;
	__s32 user_stack;
	__u8 in_softirq;	/* the sample interrupted a softirq handler (--softirq: always 1) */
	__u8 pad[3];
	char comm[16];
};

/* Per CPU (`new_pids`): pids that got a new counts entry, so userspace reads the maps of new processes while
 * they run without walking the whole counts table every second. pids[head % PROFILE_NEW_PIDS] is the next
 * slot; a reader that fell more than PROFILE_NEW_PIDS behind walks the table instead. */
struct profile_new_pids {
	__u64 head;
	__u32 pids[PROFILE_NEW_PIDS];
};

struct profile_abi_types {
	enum profile_limits limits;
	enum profile_stat stat;
	struct profile_key key;
	struct profile_new_pids new_pids;
};

#endif /* NETSLEUTH_PROFILE_H */
