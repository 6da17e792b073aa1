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
} __attribute__((preserve_access_index));

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
} __attribute__((preserve_access_index));

/* x86's per-CPU preempt count moved between kernels: `__preempt_count` (until 6.1, and again from 6.15) and
 * `pcpu_hot.preempt_count` (6.2 .. 6.14). Both are weak so the object loads on either. */
struct pcpu_hot {
	int preempt_count;
} __attribute__((preserve_access_index));

#endif /* NETSLEUTH_KERNEL_H */
