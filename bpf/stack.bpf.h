/* SPDX-License-Identifier: GPL-2.0 */
/* Kernel stack capture shared by every netsleuth program: events carry frames, groups keep an example's. */
#ifndef NETSLEUTH_STACK_BPF_H
#define NETSLEUTH_STACK_BPF_H

/* The kernel stack into `frames` (room for `room` bytes); returns the bytes written, 0..room. */
static __always_inline long ns_take_stack(void *ctx, void *frames, __u32 room)
{
	long got = bpf_get_stack(ctx, frames, room, 0);

	if (got <= 0)
		return 0;
	return got > room ? room : got;
}

/* Is one of the first `depth` frames (of `bytes` captured) inside [start, end)? How a hook tells which kernel
 * function it was called from (tcp_send_loss_probe, nf_send_reset...) when no argument says. */
static __always_inline bool ns_stack_within(const __u64 *frames, long bytes, int depth, __u64 start, __u64 end)
{
	for (int i = 0; i < depth; i++) {
		if (i * 8 >= bytes)
			break;
		if (frames[i] >= start && frames[i] < end)
			return true;
	}
	return false;
}

#endif /* NETSLEUTH_STACK_BPF_H */
