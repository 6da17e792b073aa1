/* SPDX-License-Identifier: GPL-2.0 */
/* The packet summary every netsleuth program fills the same way (see netsleuth.bpf.h parse_packet). */
#ifndef NETSLEUTH_PACKET_H
#define NETSLEUTH_PACKET_H

struct packet_tuple {
	__u8 saddr[16];		/* IPv4 in the first 4 bytes */
	__u8 daddr[16];
	__u32 l3_len;		/* bytes from the network header to the end of the packet */
	__u16 sport;		/* host order; ICMP: type */
	__u16 dport;		/* host order; ICMP: code */
	__u16 ethertype;	/* host order, from skb->protocol */
	__u8 family;		/* 4, 6, or 0 when the packet is not IP */
	__u8 l4proto;		/* IPPROTO_* */
	__u8 tcp_flags;
	__u8 has_ports;		/* sport/dport are valid (TCP, UDP, SCTP, UDP-Lite, ICMP type/code) */
	__u8 pad[2];
};

struct lpm_addr_key {
	__u32 prefixlen;	/* 8 (family byte) + address prefix */
	__u8 family;
	__u8 addr[16];
};

#endif /* NETSLEUTH_PACKET_H */
