// SPDX-License-Identifier: GPL-2.0
/* The kernel side of tests/plugin_signals, a diagnostic that lives outside netsleuth: every kill(2), with
 * the sender's network namespace, filtered in the kernel by that namespace. It includes only UAPI and libbpf
 * headers (no vmlinux.h): the four kernel structs it reads are declared here with only the members it
 * needs, and CO-RE finds their offsets in this kernel's BTF at load. */
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));

struct nsproxy {
	struct net *net_ns;
} __attribute__((preserve_access_index));

struct task_struct {
	struct nsproxy *nsproxy;
} __attribute__((preserve_access_index));

/* syscalls/sys_enter_kill (its tracefs format): the common header, the syscall number, then each argument
 * in 8 bytes. */
struct kill_args {
	__u64 common;
	__s32 syscall_nr;
	__s32 pad;
	__s64 pid;
	__s64 sig;
};

struct signals_cfg {
	__u32 netns; /* the sender's namespace inode; 0: every namespace */
};

struct signal_event {
	__u64 time_ns; /* CLOCK_MONOTONIC */
	__u32 pid;
	__u32 netns;
	__s32 target;
	__s32 sig;
	char comm[16];
};

enum { SEEN, MATCHED, LOST, COUNTERS };

const volatile struct signals_cfg cfg = {};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static void count(__u32 which)
{
	__u64 *value = bpf_map_lookup_elem(&counters, &which);

	if (value)
		*value += 1;
}

SEC("tracepoint/syscalls/sys_enter_kill")
int signals_kill(struct kill_args *args)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u32 netns = BPF_CORE_READ(task, nsproxy, net_ns, ns.inum);
	struct signal_event *event;

	count(SEEN);
	if (cfg.netns && netns != cfg.netns)
		return 0;
	count(MATCHED);
	event = bpf_ringbuf_reserve(&events, sizeof(*event), 0);
	if (!event) {
		count(LOST);
		return 0;
	}
	event->time_ns = bpf_ktime_get_ns();
	event->pid = bpf_get_current_pid_tgid() >> 32;
	event->netns = netns;
	event->target = (__s32)args->pid;
	event->sig = (__s32)args->sig;
	bpf_get_current_comm(event->comm, sizeof(event->comm));
	bpf_ringbuf_submit(event, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
