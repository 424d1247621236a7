/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Job latency histograms per GPU ring (amdgpu, drmsched): a map keyed by
 * (ring name, log2(ns)) counting jobs. Not gfxbpf_ring.h, the BPF ring buffer.
 */
#ifndef GFX_RINGLAT_H
#define GFX_RINGLAT_H

#include "gfxbpf.h"

#define GFX_RING_LEN 32  /* ring names are short: "gfx_0.0.0", "sdma0" */

struct ring_key {
	char ring[GFX_RING_LEN];
	__u32 slot;
};

/* Count one job of ring that took ns. */
static __always_inline void gfx_ring_latency(void *map, const char *ring, __u64 ns)
{
	struct ring_key key;

	__builtin_memset(&key, 0, sizeof(key));  /* no uninitialized padding in the key */
	__builtin_memcpy(key.ring, ring, sizeof(key.ring));
	key.slot = gfx_log2(ns);
	gfx_count(map, &key, 1);
}

#endif /* GFX_RINGLAT_H */
