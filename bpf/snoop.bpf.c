// SPDX-License-Identifier: GPL-2.0
/*
 * netsleuth snoop: every exec (with its arguments, result and the process's exit) and every open (with its
 * result), from tracepoints - execsnoop and opensnoop without kernel headers or a compiler on the host.
 *
 *   syscalls:sys_enter_execve / sys_enter_execveat   the file and arguments asked for, kept by thread
 *   syscalls:sys_exit_execve / sys_exit_execveat     the result: 0 (the new image runs) or -errno
 *   sched:sched_process_exec                         a thread other than the leader exec'd: its id becomes
 *                                                    the leader's (de_thread), so the exec_calls entry moves
 *   sched:sched_process_exit                         a process whose exec we reported exits: its status
 *   syscalls:sys_enter_open / sys_enter_openat       the path and flags asked for, kept by thread
 *   syscalls:sys_exit_open / sys_exit_openat         the fd or -errno
 *
 * The syscalls tracepoints exist only as trace events (no raw or BTF variant), so they attach as classic
 * tracepoints; their context layout is the event's format file (events/syscalls/<name>/format): after the
 * 8-byte common header, `int __syscall_nr` and then each argument in an 8-byte slot from offset 16.
 *
 * Filters (pid, comm, netns, cgroup, --failed) are applied in the kernel where the call returns; every
 * matching event is counted exactly per kind (`snoop_stats`) and in `snoop_groups`, then offered to the
 * ring buffer, where it may be sampled away or lost; both are counted.
 */
#include "netsleuth.bpf.h"
#include "netsleuth_kernel_more.h"
#include "snoop.h"
#define NS_FILTER_NETNS_ONLY
#include "filter_maps.bpf.h"
#include "abi.h"
#include "emit.bpf.h"

char LICENSE[] SEC("license") = "GPL";

const volatile struct snoop_config cfg = {
	.sample_every = 1,
};

NS_ABI_KEEP(snoop_abi_types);

NS_STATS_MAP(snoop_stats, SNOOP_EV_KINDS * NS_STAT_COUNT);
NS_GROUP_MAP(snoop_groups, struct snoop_group_key, struct snoop_group, SNOOP_MAX_GROUPS);

/* Execs in flight, by thread id. Not preallocated: each entry is ~2.5 KiB and most slots stay empty. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SNOOP_PENDING);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct snoop_exec_call);
} exec_calls SEC(".maps");

/* Opens in flight, by thread id. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SNOOP_PENDING);
	__type(key, __u32);
	__type(value, struct snoop_open_call);
} open_calls SEC(".maps");

/* Processes whose exec was reported -> when, so their exit is reported too (and only theirs). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SNOOP_EXEC_PIDS);
	__type(key, __u32);
	__type(value, __u64);
} exec_pids SEC(".maps");

struct snoop_record {
	struct snoop_event event;
	char args[SNOOP_ARGS_ROOM]; /* right after the event: one ring-buffer record */
};

struct snoop_scratch {
	struct snoop_exec_call exec;
	struct snoop_record record;
	struct snoop_group fresh;
	struct snoop_group_key key;
};

NS_SCRATCH_MAP(scratch, struct snoop_scratch);

/* include/trace/events/syscalls.h as laid out in the trace event (see the header comment). */
struct syscall_enter_ctx {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__u64 args[6];
};

struct syscall_exit_ctx {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__s64 ret;
};

static __always_inline void count(__u8 kind, enum ns_stat stat)
{
	ns_count(&snoop_stats, kind * NS_STAT_COUNT + stat);
}

static __always_inline struct snoop_scratch *scratch_buf(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
}

static __always_inline __u32 current_netns(void)
{
	struct task_struct___more *task = (void *)bpf_get_current_task();
	struct nsproxy *nsproxy = BPF_CORE_READ(task, nsproxy);

	return nsproxy ? ns_net_inum(BPF_CORE_READ(nsproxy, net_ns)) : 0;
}

/* The filters that do not depend on the call's result, checked at enter so unwanted calls cost no entry. */
static __always_inline bool task_wanted(__u32 tgid)
{
	if (cfg.pid && tgid != cfg.pid)
		return false;
	if (cfg.cgroup_id && bpf_get_current_cgroup_id() != cfg.cgroup_id)
		return false;
	return NS_NETNS_WANTED(cfg.netns, cfg.filter_netns, current_netns());
}

/* argv[0..] into call->args as NUL-separated strings (execsnoop's loop, bounded for the verifier). */
static __always_inline void copy_args(struct snoop_exec_call *call, const char *const *argv)
{
	const char *arg;

	for (int i = 0; i <= SNOOP_MAX_ARGS; i++) {
		__u32 offset = call->args_size;
		long copied;

		if (bpf_probe_read_user(&arg, sizeof(arg), &argv[i]) || !arg)
			return;
		if (i == SNOOP_MAX_ARGS || offset >= SNOOP_ARGS_BYTES) {
			call->flags |= SNOOP_ARGS_TRUNCATED;
			return;
		}
		/* The mask tells the verifier what the check above already ensures: offset + 128 fits. */
		copied = bpf_probe_read_user_str(&call->args[offset & (SNOOP_ARGS_BYTES - 1)], SNOOP_ARG_BYTES, arg);
		if (copied <= 0)
			return;
		if (copied == SNOOP_ARG_BYTES)
			call->flags |= SNOOP_ARGS_TRUNCATED;
		call->args_count++;
		call->args_size = offset + copied;
	}
}

static __always_inline int on_exec_enter(const char *filename, const char *const *argv, __u8 flags)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid;
	struct snoop_scratch *buf;
	struct snoop_exec_call *call;

	count(SNOOP_EV_EXEC, NS_STAT_SEEN);
	if (!task_wanted(pid_tgid >> 32))
		return 0;
	buf = scratch_buf();
	if (!buf)
		return 0;
	call = &buf->exec;
	call->start_ns = bpf_ktime_get_ns();
	call->path_ptr = (__u64)filename;
	call->flags = flags;
	call->args_count = 0;
	call->args_size = 0;
	bpf_get_current_comm(call->comm, sizeof(call->comm));
	bpf_probe_read_user_str(call->path, sizeof(call->path), filename);
	copy_args(call, argv);
	bpf_map_update_elem(&exec_calls, &tid, call, BPF_ANY);
	return 0;
}

static __always_inline int on_open_enter(const char *filename, __u32 open_flags)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid;
	struct snoop_open_call call = {};

	count(SNOOP_EV_OPEN, NS_STAT_SEEN);
	if (!task_wanted(pid_tgid >> 32))
		return 0;
	call.start_ns = bpf_ktime_get_ns();
	call.path_ptr = (__u64)filename;
	call.open_flags = open_flags;
	bpf_get_current_comm(call.comm, sizeof(call.comm));
	bpf_map_update_elem(&open_calls, &tid, &call, BPF_ANY);
	return 0;
}

static __always_inline void fill_task(struct snoop_event *e, __u64 pid_tgid)
{
	struct task_struct___more *task = (void *)bpf_get_current_task();

	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->ppid = BPF_CORE_READ(task, real_parent, tgid);
	e->uid = (__u32)bpf_get_current_uid_gid();
	e->netns = current_netns();
	e->cgroup_id = bpf_get_current_cgroup_id();
	bpf_get_current_comm(e->comm, sizeof(e->comm));
}

/* Count the event in its group and offer it (with `extra` argument bytes after it) to the ring buffer. */
static __always_inline void finish(struct snoop_scratch *buf, __u32 extra)
{
	struct snoop_event *e = &buf->record.event;
	struct snoop_group_key *key = &buf->key;
	struct snoop_group *group;
	__u32 base = e->kind * NS_STAT_COUNT;

	count(e->kind, NS_STAT_MATCHED);
	__builtin_memset(key, 0, sizeof(*key));
	__builtin_memcpy(key->comm, e->comm, sizeof(key->comm));
	__builtin_memcpy(key->path, e->path, sizeof(key->path));
	key->netns = e->netns;
	key->error = e->kind == SNOOP_EV_EXIT ? (__s32)e->ret : (e->ret < 0 ? (__s32)e->ret : 0);
	key->kind = e->kind;
	group = bpf_map_lookup_elem(&snoop_groups, key);
	if (!group) {
		buf->fresh.count = 1;
		buf->fresh.example = *e;
		group = ns_group_insert(&snoop_groups, key, &buf->fresh, &snoop_stats, base);
	}
	if (group)
		__sync_fetch_and_add(&group->count, 1);
	if (!(cfg.emit_mask & (1U << e->kind)) || !ns_emit_wanted(&snoop_stats, base, cfg.sample_every))
		return;
	if (extra > SNOOP_ARGS_ROOM)
		extra = SNOOP_ARGS_ROOM;
	ns_output(&snoop_stats, base, &buf->record, sizeof(buf->record.event) + extra);
}

/* The event of a returning call, or 0 when it is filtered out (the pending entry is dropped either way). */
static __always_inline struct snoop_scratch *returned(__u8 kind, __s64 ret, __u64 pid_tgid, __u64 start_ns,
						      const char *comm_before)
{
	struct snoop_scratch *buf;
	struct snoop_event *e;

	if (cfg.failed_only && ret >= 0)
		return 0;
	buf = scratch_buf();
	if (!buf)
		return 0;
	e = &buf->record.event;
	__builtin_memset(e, 0, sizeof(*e));
	e->kind = kind;
	e->ret = ret;
	e->time_ns = bpf_ktime_get_ns();
	e->duration_ns = e->time_ns - start_ns;
	fill_task(e, pid_tgid);
	/* --comm matches the name before an exec as well as after it: `sh -c prog` is found by either. */
	if (cfg.comm[0] && !ns_name_matches(e->comm, cfg.comm) && !ns_name_matches(comm_before, cfg.comm))
		return 0;
	return buf;
}

static __always_inline int on_exec_exit(__s64 ret)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid;
	struct snoop_exec_call *call = bpf_map_lookup_elem(&exec_calls, &tid);
	struct snoop_scratch *buf;
	struct snoop_event *e;
	__u32 extra;

	if (!call)
		return 0;
	buf = returned(SNOOP_EV_EXEC, ret, pid_tgid, call->start_ns, call->comm);
	if (!buf) {
		bpf_map_delete_elem(&exec_calls, &tid);
		return 0;
	}
	e = &buf->record.event;
	e->flags = call->flags;
	__builtin_memcpy(e->path, call->path, sizeof(e->path));
	extra = call->args_size;
	if (extra > SNOOP_ARGS_ROOM)
		extra = SNOOP_ARGS_ROOM;
	e->args_count = call->args_count;
	e->args_size = extra;
	bpf_probe_read_kernel(buf->record.args, extra, call->args);
	if (ret == 0) {
		__u32 tgid = pid_tgid >> 32;

		bpf_map_update_elem(&exec_pids, &tgid, &e->time_ns, BPF_ANY);
	}
	bpf_map_delete_elem(&exec_calls, &tid);
	finish(buf, extra);
	return 0;
}

static __always_inline int on_open_exit(__s64 ret)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid;
	struct snoop_open_call *call = bpf_map_lookup_elem(&open_calls, &tid);
	struct snoop_scratch *buf;
	struct snoop_event *e;

	if (!call)
		return 0;
	buf = returned(SNOOP_EV_OPEN, ret, pid_tgid, call->start_ns, call->comm);
	if (buf) {
		e = &buf->record.event;
		e->open_flags = call->open_flags;
		bpf_probe_read_user_str(e->path, sizeof(e->path), (const char *)call->path_ptr);
	}
	bpf_map_delete_elem(&open_calls, &tid);
	if (buf)
		finish(buf, 0);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_execve")
int snoop_exec_enter_t(struct syscall_enter_ctx *ctx)
{
	return on_exec_enter((const char *)ctx->args[0], (const char *const *)ctx->args[1], 0);
}

SEC("tracepoint/syscalls/sys_enter_execveat")
int snoop_execat_enter_t(struct syscall_enter_ctx *ctx)
{
	return on_exec_enter((const char *)ctx->args[1], (const char *const *)ctx->args[2], SNOOP_EXECVEAT);
}

SEC("tracepoint/syscalls/sys_exit_execve")
int snoop_exec_exit_t(struct syscall_exit_ctx *ctx)
{
	return on_exec_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_execveat")
int snoop_execat_exit_t(struct syscall_exit_ctx *ctx)
{
	return on_exec_exit(ctx->ret);
}

/* include/trace/events/sched.h sched_process_exec: __data_loc filename, pid, old_pid. */
struct sched_process_exec_ctx {
	__u64 common;
	__u32 filename_loc;
	__s32 pid;
	__s32 old_pid;
};

SEC("tracepoint/sched/sched_process_exec")
int snoop_exec_moved_t(struct sched_process_exec_ctx *ctx)
{
	__u32 old_tid = ctx->old_pid;
	__u32 new_tid = ctx->pid;
	struct snoop_exec_call *call;

	if (old_tid == new_tid)
		return 0;
	call = bpf_map_lookup_elem(&exec_calls, &old_tid);
	if (!call)
		return 0;
	bpf_map_update_elem(&exec_calls, &new_tid, call, BPF_ANY);
	bpf_map_delete_elem(&exec_calls, &old_tid);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int snoop_exit_t(void *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	struct task_struct___more *task;
	struct snoop_scratch *buf;
	struct snoop_event *e;
	__u64 *exec_ns;
	int status;

	if (tgid != (__u32)pid_tgid) /* a thread, not the process */
		return 0;
	exec_ns = bpf_map_lookup_elem(&exec_pids, &tgid);
	if (!exec_ns)
		return 0;
	count(SNOOP_EV_EXIT, NS_STAT_SEEN);
	task = (void *)bpf_get_current_task();
	/* do_exit() stores the status before this tracepoint: code << 8, or the signal number. */
	status = BPF_CORE_READ((struct task_struct___exit *)task, exit_code);
	buf = scratch_buf();
	if (!buf || (cfg.failed_only && status == 0)) {
		bpf_map_delete_elem(&exec_pids, &tgid);
		return 0;
	}
	e = &buf->record.event;
	__builtin_memset(e, 0, sizeof(*e));
	e->kind = SNOOP_EV_EXIT;
	e->ret = status;
	e->time_ns = bpf_ktime_get_ns();
	e->duration_ns = e->time_ns - *exec_ns;
	fill_task(e, pid_tgid);
	bpf_map_delete_elem(&exec_pids, &tgid);
	finish(buf, 0);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_open")
int snoop_open_enter_t(struct syscall_enter_ctx *ctx)
{
	return on_open_enter((const char *)ctx->args[0], (__u32)ctx->args[1]);
}

SEC("tracepoint/syscalls/sys_enter_openat")
int snoop_openat_enter_t(struct syscall_enter_ctx *ctx)
{
	return on_open_enter((const char *)ctx->args[1], (__u32)ctx->args[2]);
}

SEC("tracepoint/syscalls/sys_exit_open")
int snoop_open_exit_t(struct syscall_exit_ctx *ctx)
{
	return on_open_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_openat")
int snoop_openat_exit_t(struct syscall_exit_ctx *ctx)
{
	return on_open_exit(ctx->ret);
}
