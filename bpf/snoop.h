/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared between snoop.bpf.c and userspace. Fixed-width types only; the Python mirrors are generated
 * from the object's BTF (src/netsleuth/_generated/snoop_abi.py, `make bpf`) and checked again at load.
 */
#ifndef NETSLEUTH_SNOOP_H
#define NETSLEUTH_SNOOP_H

#include "emit.h"

enum snoop_limits {
	SNOOP_ARG_BYTES = 128,		/* each argument as copied (longer ones are cut and flagged) */
	SNOOP_MAX_ARGS = 24,		/* arguments copied, argv[0] included (more are flagged, not copied) */
	SNOOP_ARGS_BYTES = 2048,	/* where the next argument may start: a power of two, so a mask bounds it */
	SNOOP_ARGS_ROOM = 2176,		/* SNOOP_ARGS_BYTES + SNOOP_ARG_BYTES: the last argument's room */
	SNOOP_PATH_BYTES = 256,
	SNOOP_PENDING = 8192,		/* syscalls entered and not yet returned, by thread */
	SNOOP_EXEC_PIDS = 16384,	/* processes whose exec we reported, to report their exit */
	SNOOP_MAX_GROUPS = 4096,
	SNOOP_GROUP_PATH_BYTES = 64,	/* the path prefix --summary groups by */
};

/* What one event is about; each kind has its own block of enum ns_stat in `snoop_stats`. */
enum snoop_event_kind {
	SNOOP_EV_EXEC = 0,	/* execve/execveat returned (ret 0: the new image runs) */
	SNOOP_EV_EXIT = 1,	/* a process whose exec we reported exited */
	SNOOP_EV_OPEN = 2,	/* open/openat returned (ret: fd or -errno) */
	SNOOP_EV_KINDS = 3,
};

/* snoop_event.flags */
enum snoop_event_flag {
	SNOOP_ARGS_TRUNCATED = 1,	/* more arguments than SNOOP_MAX_ARGS, or one longer than SNOOP_ARG_BYTES */
	SNOOP_EXECVEAT = 2,
};

/* Read-only configuration (the object's .rodata). Zero means "no filter". */
struct snoop_config {
	__u32 netns;		/* the task's network namespace inode */
	__u32 pid;		/* --pid: the process (tgid) */
	__u64 cgroup_id;	/* --cgroup: the task's cgroup v2 id (the directory's inode) */
	__u32 sample_every;
	__u32 emit_mask;	/* 1 << kind: send events of this kind to userspace */
	char comm[16];		/* --comm: the task's name (for exec: the name before or after the exec) */
	__u8 failed_only;	/* --failed: only calls that returned an error (exit: non-zero status) */
	__u8 filter_netns;	/* keep only namespaces in `netns_filter` (instead of `netns`) */
	__u8 pad[6];
};

/* One event as sent to userspace: this header, then `args_size` bytes of NUL-separated arguments (exec). */
struct snoop_event {
	__u64 time_ns;		/* CLOCK_MONOTONIC, when the call returned (exit: when the process exited) */
	__u64 duration_ns;	/* exec/open: the syscall's time; exit: since the exec we reported */
	__u64 cgroup_id;
	__s64 ret;		/* fd or -errno; exec: 0 or -errno; exit: the wait status (exit code << 8 | signal) */
	__u32 pid;		/* tgid */
	__u32 tid;
	__u32 ppid;
	__u32 uid;
	__u32 netns;
	__u32 open_flags;	/* open: O_* flags */
	__u32 args_count;	/* exec: arguments copied (argv[0] included) */
	__u32 args_size;	/* exec: bytes of args that follow */
	__u8 kind;
	__u8 flags;		/* enum snoop_event_flag */
	__u8 pad[6];
	char comm[16];		/* the task's name when the call returned (after exec: the new one) */
	char path[SNOOP_PATH_BYTES]; /* exec: the file asked for; open: the path as given */
};

/* An open between its enter and exit tracepoints, by thread. */
struct snoop_open_call {
	__u64 start_ns;
	__u64 path_ptr;		/* the user's pointer, read at exit (still valid: the caller is blocked in it) */
	__u32 open_flags;
	__u32 pad;
	char comm[16];
};

/* An exec between its enter and exit tracepoints, by thread: the arguments must be copied at enter, as a
 * successful exec replaces the memory they were in. */
struct snoop_exec_call {
	__u64 start_ns;
	__u64 path_ptr;		/* read at exit: a failed exec still has it; a successful one copied it to
				 * the new stack (bprm), so it is read at enter too (path below) */
	__u32 args_count;
	__u32 args_size;
	__u8 flags;
	__u8 pad[7];
	char comm[16];		/* the name before exec */
	char path[SNOOP_PATH_BYTES];
	char args[SNOOP_ARGS_ROOM];
};

struct snoop_group_key {
	char comm[16];
	char path[SNOOP_GROUP_PATH_BYTES];
	__u32 netns;
	__s32 error;		/* -errno, or 0 for success (exit: the status) */
	__u8 kind;
	__u8 pad[7];
};

struct snoop_group {
	__u64 count;
	struct snoop_event example;
};

struct snoop_abi_types {
	enum ns_stat stat;
	enum ns_emit_limits emit_limits;
	enum snoop_limits limits;
	enum snoop_event_kind kind;
	enum snoop_event_flag flag;
};

#endif /* NETSLEUTH_SNOOP_H */
