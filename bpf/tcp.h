/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared between tcp.bpf.c and userspace. Fixed-width types only. Python's ctypes mirrors are generated
 * from the compiled object's BTF (src/netsleuth/_generated/tcp_abi.py, `make bpf`) and every member's name,
 * offset and size is checked against the object again at load.
 */
#ifndef NETSLEUTH_TCP_H
#define NETSLEUTH_TCP_H

#include "emit.h"
#include "packet.h"

enum tcp_limits {
	TCP_MAX_FRAMES = NS_MAX_FRAMES,
	TCP_EXAMPLE_FRAMES = 24,	/* enough to reach past nf_hook_slow from __dev_queue_xmit */
	TCP_MAX_GROUPS = 8192,
	TCP_STACK_RANGES = 4,
	TCP_LISTENER_SLOTS = 4,
	TCP_MAX_SOCKETS = 65536,	/* sockets the state tracker remembers (LRU) */
	TCP_MAX_LISTEN_PORTS = 4096,
	TCP_QUEUE_REASONS = 64,
	TCP_NO_STATE = 0xff,		/* tcp_event.state / old_state: no socket */
};

/* A SOCK_DROP reason of our own, for a drop the kernel makes without a drop reason: a SYN that
 * tcp_conn_request() discarded (consumed) because the listener's accept queue was full. */
enum tcp_own_reason {
	TCP_REASON_SYN_ACCEPT_QUEUE_FULL = 0xfffffffe,
};

/* What one event is about. Each kind is counted on its own (tcp_stats) and can be emitted, grouped and given
 * a stack independently (the cfg masks have one bit per kind). */
enum tcp_event_kind {
	TCP_EV_RESET_SENT = 0,	   /* tcp:tcp_send_reset */
	TCP_EV_RESET_RECEIVED = 1, /* tcp:tcp_receive_reset */
	TCP_EV_RESET_FIREWALL = 2, /* net:net_dev_queue of an RST built by nf_send_reset{,6} (REJECT rules) */
	TCP_EV_STATE = 3,	   /* sock:inet_sock_set_state */
	TCP_EV_LIFE = 4,	   /* ... the transition to CLOSE of a socket whose birth we saw */
	TCP_EV_CONNECT = 5,	   /* ... SYN_SENT -> ESTABLISHED (reason 0) or SYN_SENT -> CLOSE (reason sk_err) */
	TCP_EV_RETRANS = 6,	   /* tcp:tcp_retransmit_skb */
	TCP_EV_SYNACK_RETRANS = 7, /* tcp:tcp_retransmit_synack */
	TCP_EV_ERROR = 8,	   /* sock:inet_sk_error_report: the kernel set sk_err (ETIMEDOUT, ECONNRESET...) */
	TCP_EV_SOCK_DROP = 9,	   /* skb:kfree_skb of a packet for a socket: listen overflow, buffers, memory */
	TCP_EV_RCVQ_FULL = 10,	   /* sock:sock_rcvqueue_full */
	TCP_EV_MEM_LIMIT = 11,	   /* sock:sock_exceed_buf_limit */
	TCP_EV_KINDS = 12,
};

/* Per kind, the per-CPU `tcp_stats` array holds a block of enum ns_stat (bpf/emit.h) at kind * NS_STAT_COUNT. */

/* How a retransmission came about (tcp_event.retrans_kind). */
enum tcp_retrans_kind {
	TCP_RETRANS_OTHER = 0,
	TCP_RETRANS_SYN = 1,	  /* the socket is in SYN_SENT */
	TCP_RETRANS_TLP = 2,	  /* tail loss probe: tcp_send_loss_probe() is on the stack */
	TCP_RETRANS_TIMEOUT = 3,  /* retransmission timer: congestion state Loss */
	TCP_RETRANS_FAST = 4,	  /* fast retransmit / recovery (Disorder, CWR, Recovery) */
};

/* tcp_event.sock_flags */
enum tcp_sock_flag {
	TCP_SOCK_LINGER = 1,	  /* SO_LINGER on */
	TCP_SOCK_LINGER_ZERO = 2, /* ... with a zero timeout: close() aborts */
	TCP_SOCK_HAS_FILE = 4,	  /* a process holds the socket (sk_socket set): accepted / created by a task */
	TCP_SOCK_FULL = 8,	  /* a full socket (not a request or TIME_WAIT mini-socket) */
};

struct tcp_range {
	__u64 start;
	__u64 end;
};

/* Read-only configuration, set by the loader before load (the object's .rodata). Zero means "no filter". */
struct tcp_config {
	__u64 thread_size;	   /* THREAD_SIZE of this kernel, for ns_in_task */
	struct tcp_range tlp;	   /* tcp_send_loss_probe's text */
	struct tcp_range rcv_state_process; /* tcp_rcv_state_process's text: where a listener consumes SYNs */
	__u32 netns;		   /* netns inode to keep */
	__u32 sample_every;	   /* emit one event in N (1 = all); totals stay exact */
	__u32 emit_mask;	   /* 1 << kind: send events of this kind to userspace */
	__u32 group_mask;	   /* 1 << kind: count in tcp_groups (--summary) */
	__u32 stack_mask;	   /* 1 << kind: attach the kernel stack */
	__u32 consumed_reason;	   /* kfree_skb: SKB_CONSUMED, not a drop (~0 when the kernel has none) */
	__u32 not_dropped_reason;  /* SKB_NOT_DROPPED_YET (~0 when none) */
	__u32 pid;		   /* --pid (tgid) for events in a task's own context; 0 = any */
	char comm[16];		   /* --comm; empty = any */
	__u16 port;		   /* either end */
	__u16 sport;		   /* the local end (a socket's own port; an RST's source) */
	__u16 dport;		   /* the remote end */
	__u8 family;		   /* 4 or 6 */
	__u8 filter_host;	   /* check `host_filter` LPM for either address */
	__u8 filter_src;	   /* `src_filter` for the local address */
	__u8 filter_dst;	   /* `dst_filter` for the remote address */
	__u8 filter_owner;	   /* --pid/--comm: the task, or owner_inodes for the socket */
	__u8 has_reset_reason;	   /* tcp_send_reset passes enum sk_rst_reason (6.10+) */
	__u8 has_rx_sk;		   /* kfree_skb passes the receiving socket (6.11+) */
	__u8 group_flows;	   /* group keys keep both endpoints (per-flow counts) */
	__u8 has_retrans_err;	   /* tcp_retransmit_skb passes the transmit result (6.11+) */
	__u8 filter_netns;	   /* keep only namespaces in `netns_filter` (instead of `netns`) */
	__u8 pad[2];
};

/* One event as sent to userspace: this header, then `nr_frames` u64 kernel addresses. Endpoints are the
 * socket's point of view: local (laddr/lport) and remote; for an RST with no socket, local is the end that
 * sends it. Values with no meaning for a kind are zero. */
struct tcp_event {
	__u64 time_ns;		/* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u64 sk;		/* socket address: joins the events of one socket while it lives */
	__u64 sock_ino;		/* inode of the socket (its owner's fd), 0 when none */
	__u64 born_ns;		/* when the socket's first transition was seen (connect/listen/SYN_RECV), 0 unknown */
	__u64 value1;		/* STATE: ns in the previous state; LIFE: duration ns; CONNECT: latency ns;
				 * RETRANS: total retransmits; SOCK_DROP: skb len; RCVQ_FULL: rmem_alloc;
				 * MEM_LIMIT: pages allocated; SYNACK_RETRANS: SYN-ACK retransmits of the request */
	__u64 value2;		/* LIFE/STATE to CLOSE: bytes acked; RETRANS: srtt us; RCVQ_FULL: truesize */
	__u64 value3;		/* LIFE/STATE to CLOSE: bytes received; RETRANS: cwnd; RCVQ_FULL: rcvbuf */
	__u32 netns;
	__u32 pid;		/* current task (tgid); valid when in_task */
	__u32 tid;
	__u32 owner_pid;	/* a process seen on this socket in its own context (connect, listen, close) */
	__u32 reason;		/* reset reason, drop reason, errno (CONNECT, ERROR, STATE to CLOSE), MEM_LIMIT kind */
	__u32 seq;		/* trigger packet of a sent RST (or the firewall RST itself) */
	__u32 ack;
	__u32 unread;		/* bytes received and not read by the application (rcv_nxt - copied_seq) */
	__u32 unsent;		/* bytes written and not acknowledged (write_seq - snd_una) */
	__u32 backlog;		/* listener: accept queue length (sk_ack_backlog); others: queued bytes */
	__u32 max_backlog;	/* listener: listen() backlog (sk_max_ack_backlog); others: buffer size */
	__u32 syn_queue;	/* listener: request socks in the SYN queue */
	__u32 ifindex;
	__u32 cpu;
	__u16 lport;
	__u16 rport;
	__u16 payload_len;	/* trigger packet's TCP payload */
	__u16 nr_frames;
	__u8 laddr[16];		/* IPv4 in the first 4 bytes (IPv4-mapped IPv6 is reported as IPv4) */
	__u8 raddr[16];
	__u8 kind;		/* enum tcp_event_kind */
	__u8 family;		/* 4, 6, 0 unknown */
	__u8 state;		/* socket state now (TCP_NO_STATE: no socket) */
	__u8 old_state;		/* STATE: the previous state; others: the state before the last change */
	__u8 tcp_flags;		/* trigger packet's flags (RESET_SENT), the RST's own (RESET_FIREWALL) */
	__u8 has_trigger;	/* seq/ack/tcp_flags/payload_len describe a packet */
	__u8 side;		/* 1 active open (connect), 2 passive (accepted), 0 unknown */
	__u8 ca_state;		/* congestion state (enum tcp_ca_state) */
	__u8 retransmits;	/* icsk_retransmits: unanswered retransmissions of the current segment */
	__u8 sock_flags;	/* TCP_SOCK_* */
	__u8 retrans_kind;	/* enum tcp_retrans_kind */
	__u8 in_task;		/* 1: the hook ran in the context of `pid` (its syscall); 0: softirq, timer */
	__u8 kthread;
	__u8 pad;
	__u16 segs;		/* RETRANS: segments the skb was sent as (tcp_skb_pcount), 0 if not counted (retrans_counted); SYNACK_RETRANS: 1 */
	char comm[16];		/* current task, when in_task */
	char owner_comm[16];
	char ifname[16];	/* RESET_FIREWALL, SOCK_DROP: the device */
};

/* Listening sockets the state tracker saw start, by port: a SYN's way to its listener. The port is the key
 * and not (netns, port) because TCP clears skb->dev before the listener sees a SYN, so its namespace is
 * unknown there; the listener's bound address and queue state decide between namespaces. */
struct tcp_listener_slots {
	__u64 sk[TCP_LISTENER_SLOTS];
};

/* The fields a --summary counts by; which are filled depends on the kind (see tcp.bpf.c group_key_for). */
struct tcp_group_key {
	__u8 laddr[16];
	__u8 raddr[16];
	__u32 netns;
	__u32 reason;
	__u32 pid;
	__u16 lport;
	__u16 rport;
	__u8 kind;
	__u8 state;
	__u8 old_state;
	__u8 family;
	__u8 retrans_kind;
	__u8 pad[3];
};

struct tcp_group {
	__u64 count;
	__u64 sum1;		/* totals of the events' value1..3 */
	__u64 sum2;
	__u64 sum3;
	__u64 max1;		/* largest value1 (a latency, a duration) */
	__u64 segs;		/* total of the events' segs: retransmitted segments, as TcpRetransSegs counts */
	struct tcp_event example;
	__u64 example_frames[TCP_EXAMPLE_FRAMES];
};

/* What the state tracker remembers per socket (keyed by its address), for sides, ages and owners. */
struct tcp_sock_info {
	__u64 born_ns;
	__u64 changed_ns;	/* last state change */
	__u64 sock_ino;
	__u32 pid;
	__u16 lport;		/* the local port while it was bound: tcp_set_state(CLOSE) releases it first */
	__u8 side;
	__u8 last_old_state;
	char comm[16];
};

/* The enums userspace mirrors that no map or variable uses: tcp.bpf.c keeps them in its BTF (bpf/abi.h). */
struct tcp_abi_types {
	enum ns_stat stat;
	struct packet_tuple tuple[0];	/* a pointer would keep only a forward declaration */
	enum ns_emit_limits emit_limits;
	enum tcp_event_kind kind;
	enum tcp_retrans_kind retrans_kind;
	enum tcp_sock_flag sock_flag;
	enum tcp_limits limits;
	enum tcp_own_reason own_reason;
};

#endif /* NETSLEUTH_TCP_H */
