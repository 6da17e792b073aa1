/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The kernel types netsleuth's programs read, kept by hand instead of a vmlinux.h dumped from whatever kernel
 * runs the build: the objects must not depend on the build machine's kernel. Every struct carries
 * preserve_access_index, so libbpf relocates each field against the running kernel's BTF (CO-RE) and the
 * layout written here is never trusted; only the field names and types must exist in the target kernel.
 */
#ifndef NETSLEUTH_KERNEL_H
#define NETSLEUTH_KERNEL_H

typedef unsigned char __u8;
typedef signed char __s8;
typedef unsigned short __u16;
typedef short __s16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_LPM_TRIE = 11,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

enum {
	BPF_F_NO_PREALLOC = 1,
	BPF_RB_NO_WAKEUP = 1,
	BPF_RB_FORCE_WAKEUP = 2,
	BPF_RB_AVAIL_DATA = 0,
	BPF_RB_RING_SIZE = 1,
};

#define BPF_F_USER_STACK 256

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));

typedef struct {
	struct net *net;
} possible_net_t;

struct net_device {
	char name[16];
	int ifindex;
	possible_net_t nd_net;
} __attribute__((preserve_access_index));

struct in6_addr {
	__u8 s6_addr[16];
} __attribute__((preserve_access_index));

struct sock_common {
	__be32 skc_daddr;
	__be32 skc_rcv_saddr;
	__be16 skc_dport;
	__u16 skc_num;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	possible_net_t skc_net;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
	unsigned long skc_flags;	/* 6.x: sock flags moved here from struct sock (sk_flags) */
} __attribute__((preserve_access_index));

typedef struct {
	int counter;
} atomic_t;

struct inode {
	unsigned long i_ino;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct socket {
	struct file *file;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	struct socket *sk_socket;
	__u16 sk_protocol;
	__u16 sk_type;
	unsigned long sk_flags;		/* before sock_common's skc_flags; read whichever this kernel has */
	int sk_err;
	int sk_rcvbuf;
	int sk_sndbuf;
	int sk_wmem_queued;
	unsigned long sk_lingertime;
	__u32 sk_ack_backlog;
	__u32 sk_max_ack_backlog;
	struct {
		atomic_t rmem_alloc;
	} sk_backlog;
} __attribute__((preserve_access_index));

struct sk_buff {
	struct net_device *dev;
	struct sock *sk;
	int skb_iif;
	unsigned int len;
	unsigned int data_len;
	__be16 protocol;
	__u16 transport_header;
	__u16 network_header;
	__u16 mac_header;
	unsigned char *head;
	unsigned char *data;
	unsigned int truesize;
	char cb[48];
} __attribute__((preserve_access_index));

/* TCP's control block in skb->cb (include/net/tcp.h): tcp_skb_pcount() is tcp_gso_segs, the number of
 * segments the skb is sent as. */
struct tcp_skb_cb {
	__u32 seq;
	__u32 end_seq;
	union {
		struct {
			__u16 tcp_gso_segs;
			__u16 tcp_gso_size;
		};
	};
} __attribute__((preserve_access_index));

struct task_struct {
	unsigned int flags;
	void *stack;
} __attribute__((preserve_access_index));

/* TCP socket internals read by tcp.bpf.c (include/net/inet_connection_sock.h, include/linux/tcp.h,
 * include/net/request_sock.h). The casts from struct sock follow the kernel's own tcp_sk()/inet_csk(). */
struct request_sock_queue {
	atomic_t qlen;
} __attribute__((preserve_access_index));

struct inet_connection_sock {
	struct request_sock_queue icsk_accept_queue;
	__u8 icsk_ca_state : 5;
	__u8 icsk_retransmits;
} __attribute__((preserve_access_index));

struct tcp_sock {
	__u32 rcv_nxt;
	__u32 copied_seq;
	__u32 write_seq;
	__u32 snd_una;
	__u32 snd_nxt;
	__u32 srtt_us;
	__u32 snd_cwnd;
	__u32 total_retrans;
	__u64 bytes_acked;
	__u64 bytes_received;
} __attribute__((preserve_access_index));

struct inet_sock {
	__be16 inet_sport;	/* kept when tcp_set_state(CLOSE) releases the port and zeroes inet_num */
} __attribute__((preserve_access_index));

struct request_sock {
	struct sock_common __req_common;
	__u8 num_retrans;
} __attribute__((preserve_access_index));

#endif /* NETSLEUTH_KERNEL_H */
