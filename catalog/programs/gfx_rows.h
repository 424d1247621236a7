/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Rows of hash maps: the row at a key, created when absent. A header of its
 * own (not gfxbpf.h) so that objects built without it stay byte-identical:
 * the debug line table holds a checksum of every header a program includes.
 */
#ifndef GFX_ROWS_H
#define GFX_ROWS_H

#include "gfxbpf.h"

/* The row at key, created from *zero when absent; NULL only when the map is full. */
static __always_inline void *gfx_row(void *map, const void *key, const void *zero)
{
	void *v = bpf_map_lookup_elem(map, key);

	if (v)
		return v;
	bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/*
 * gfx_count() for a map whose value starts with its __u64 counter (a struct
 * of counters, or just the counter): a missing row is created from *first,
 * whose counter already holds n. Returns 0, or -1 when the map is full and
 * the count was dropped (the caller counts that loss where a client sees it).
 */
static __always_inline int gfx_count_first(void *map, const void *key, const void *first, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(map, key);

	if (!v) {
		if (bpf_map_update_elem(map, key, first, BPF_NOEXIST) == 0)
			return 0;
		v = bpf_map_lookup_elem(map, key);  /* another CPU created it */
		if (!v)
			return -1;
	}
	__sync_fetch_and_add(v, n);
	return 0;
}

#endif /* GFX_ROWS_H */
