/* SPDX-License-Identifier: GPL-2.0 */
/*
 * `since` (offcpu, ustackcopy): when the profile began, CLOCK_MONOTONIC ns
 * (bpf_ktime_get_ns), written by the broker as it attaches; 0 until then,
 * and again while a warm instance is parked (broker/sharing/warm.py).
 */
#ifndef GFX_SINCE_H
#define GFX_SINCE_H

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} since SEC(".maps");

/* since's value (0: not attached yet, or parked). */
static __always_inline __u64 gfx_since(void)
{
	__u32 zero = 0;
	__u64 *v = bpf_map_lookup_elem(&since, &zero);

	return v ? *v : 0;
}

#endif /* GFX_SINCE_H */
