/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Ring-buffer output for the gfxbpf catalog programs (and bench/'s own),
 * apart from gfxbpf.h so that the objects that do not stream stay byte for
 * byte what they were.
 */
#ifndef GFXBPF_RING_H
#define GFXBPF_RING_H

#include "gfxbpf.h"

/*
 * Commit a ring-buffer record without waking the consumer, except when this
 * record takes the unread data past a quarter of the ring.
 *
 * A plain submit wakes a consumer that has caught up: an irq_work, which
 * raises a self-IPI and runs the wake-up inside this program's run (measured
 * on these VMs: 17.9 us per execsnoop record with a reader draining, 0.86 us
 * without the wake-up). Readers (gfxbpf.bpf.RingBuffer) look again at least
 * every tick instead, and a burst still wakes them long before the ring is
 * full. Another CPU's reservation may hide the crossing; the tick covers it.
 */
static __always_inline void gfx_ringbuf_submit(void *ring, void *rec, __u64 size)
{
	__u64 avail = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);
	__u64 mark = bpf_ringbuf_query(ring, BPF_RB_RING_SIZE) / 4;
	__u64 taken = ((size + 7) & ~7ULL) + 8; /* this record with its header */

	if (avail >= mark && avail < mark + taken)
		bpf_ringbuf_submit(rec, BPF_RB_FORCE_WAKEUP);
	else
		bpf_ringbuf_submit(rec, BPF_RB_NO_WAKEUP);
}

#endif /* GFXBPF_RING_H */
