// SPDX-License-Identifier: GPL-2.0
/*
 * netsleuth tcp: the TCP sockets that exist when a trace starts, for the tcp object's state tracker.
 *
 * tcp.bpf.c learns a socket from its state changes (connect, listen, accept), so a socket born before the
 * trace has no side, no owner inode and - for a listener - no entry in `listeners`, the only way a SYN
 * consumed for a full accept queue finds its listener. This bpf_iter program (iter/tcp, Linux 5.9+; a
 * tracing program that needs no ftrace trampoline, unlike fentry) walks every TCP socket of one network
 * namespace - the namespace of the task that creates the iterator (bpf_iter_init_seq_net) - and writes what
 * the tracker would have learnt into the tcp object's own maps: userspace loads this object with
 * `sock_infos` and `listeners` reusing the tcp object's map fds (bpf_map__reuse_fd), runs the iterator once
 * in each namespace after the live programs are attached, and from then on every hook finds these sockets.
 *
 * The kernel walks listeners before established sockets (bpf_iter_tcp_batch: listening hash, then ehash),
 * so an established socket's side is decided with its namespace's listeners already known: a socket whose
 * local port a listener of its namespace serves (same or wildcard address) was accepted; any other was
 * connected. This is what ss(8) and every tool without the birth can tell.
 */
#include "netsleuth.bpf.h"
#include "tcp.h"

char LICENSE[] SEC("license") = "GPL";

#define TCP_SYN_SENT 2
#define TCP_LISTEN 10

/* born_ns written for sockets that existed before the trace: the time userspace started the walk. Events
 * whose born_ns equals it are about such a socket, whose age is then only known to be at least this old. */
const volatile __u64 existing_born_ns = 0;

/* Same definitions as in tcp.bpf.c (bpf_map__reuse_fd checks type, sizes and max_entries). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, TCP_MAX_SOCKETS);
	__type(key, __u64);
	__type(value, struct tcp_sock_info);
} sock_infos SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TCP_MAX_LISTEN_PORTS);
	__type(key, __u32);
	__type(value, struct tcp_listener_slots);
} listeners SEC(".maps");

/* struct bpf_iter__tcp (net/ipv4/tcp_ipv4.c). Its layout is the iterator's ABI, checked by the verifier
 * against the kernel's BTF; not relocated, so the object needs no type the older kernels' BTF lacks. */
struct ns_iter_tcp {
	void *meta;
	struct sock_common *sk_common;
	__u32 uid;
};

/* The listening socket's bound address is `sk`'s own local address or a wildcard (same family). */
static __always_inline bool serves(struct sock *listener, struct sock *sk, __u16 family)
{
	__u16 listener_family = BPF_CORE_READ(listener, __sk_common.skc_family);
	__u8 bound6[16] = {}, local6[16] = {};
	__be32 bound;
	bool wildcard = true;

	if (listener_family == AF_INET) {
		bound = BPF_CORE_READ(listener, __sk_common.skc_rcv_saddr);
		return family == AF_INET && (!bound || bound == BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr));
	}
	/* An AF_INET6 listener also takes IPv4 (its children are AF_INET6 with v4-mapped addresses). */
	BPF_CORE_READ_INTO(&bound6, listener, __sk_common.skc_v6_rcv_saddr);
	for (int i = 0; i < 16; i++)
		if (bound6[i])
			wildcard = false;
	if (wildcard)
		return true;
	if (family != AF_INET6)
		return false;
	BPF_CORE_READ_INTO(&local6, sk, __sk_common.skc_v6_rcv_saddr);
	for (int i = 0; i < 16; i++)
		if (bound6[i] != local6[i])
			return false;
	return true;
}

/* 2 (accepted) when a listener of the socket's namespace serves its local port and address, else 1. */
static __always_inline __u8 side_of(struct sock *sk, __u32 port, __u16 family, __u32 netns)
{
	struct tcp_listener_slots *slots = bpf_map_lookup_elem(&listeners, &port);

	if (!slots)
		return 1;
	for (int i = 0; i < TCP_LISTENER_SLOTS; i++) {
		struct sock *listener = (struct sock *)slots->sk[i];

		if (!listener || (__u64)listener == (__u64)sk)
			continue;
		if (BPF_CORE_READ(listener, __sk_common.skc_state) != TCP_LISTEN)
			continue;
		if (ns_net_inum(BPF_CORE_READ(listener, __sk_common.skc_net.net)) != netns)
			continue;
		if (serves(listener, sk, family))
			return 2;
	}
	return 1;
}

/* Put the listener in a free slot of its port, unless the live tracker already did. */
static __always_inline void add_listener(__u32 port, __u64 address)
{
	struct tcp_listener_slots fresh = {}, *slots = bpf_map_lookup_elem(&listeners, &port);

	if (!slots) {
		fresh.sk[0] = address;
		bpf_map_update_elem(&listeners, &port, &fresh, BPF_NOEXIST);
		return;
	}
	for (int i = 0; i < TCP_LISTENER_SLOTS; i++)
		if (slots->sk[i] == address)
			return;
	for (int i = 0; i < TCP_LISTENER_SLOTS; i++) {
		if (!slots->sk[i]) {
			slots->sk[i] = address;
			return;
		}
	}
}

SEC("iter/tcp")
int nst_existing(struct ns_iter_tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct sock *sk = (struct sock *)skc;
	struct tcp_sock_info info = {};
	__u64 key = (__u64)skc;
	__u16 family;
	__u8 state;

	if (!skc)
		return 0;
	state = BPF_CORE_READ(skc, skc_state);
	/* Request and TIME_WAIT socks are not full sockets: the tracker never keys them either. */
	if (!ns_sk_fullsock_rd(false, sk))
		return 0;
	family = BPF_CORE_READ(skc, skc_family);
	info.lport = BPF_CORE_READ(skc, skc_num);
	if (state == TCP_LISTEN)
		add_listener(info.lport, key);
	if (bpf_map_lookup_elem(&sock_infos, &key))
		return 0; /* its birth or a transition was seen live: that knows more */
	info.sock_ino = ns_sock_ino_rd(false, sk);
	info.last_old_state = TCP_NO_STATE;
	if (state == TCP_SYN_SENT) {
		info.side = 1; /* connect() in flight; its latency is unknown: no birth time */
	} else if (state != TCP_LISTEN) {
		info.side = side_of(sk, info.lport, family, ns_net_inum(BPF_CORE_READ(skc, skc_net.net)));
		info.born_ns = existing_born_ns;
	}
	bpf_map_update_elem(&sock_infos, &key, &info, BPF_NOEXIST);
	return 0;
}
