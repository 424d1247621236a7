/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Counting by user stack (profile, ustacks): the stack table a client reads
 * and the count of what a full count map dropped. Include it once, from the
 * program; its maps are the program's maps. Only user stacks are taken
 * (BPF_F_USER_STACK), so no kernel address reaches a client-visible map.
 */
#ifndef GFX_USTACK_H
#define GFX_USTACK_H

#include "gfx_rows.h"

#define MAX_STACKS 8192
#define MAX_DEPTH 127  /* PERF_MAX_STACK_DEPTH */

/* stack id -> user return addresses, innermost first, zero-padded */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, MAX_STACKS);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, MAX_DEPTH * sizeof(__u64));
} stacks SEC(".maps");

/* 0 -> counts dropped because the program's count map was full */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* The current user stack's id in `stacks`, or -errno when none was taken
 * (a kernel thread, a full or colliding table): counted all the same. */
static __always_inline __s32 gfx_user_stack(void *ctx)
{
	return (__s32)bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK);
}

/* Count into map's row at key (its first field the __u64 count; a new row
 * from *first), or into `lost` when the map is full. */
static __always_inline void gfx_count_or_lost(void *map, const void *key, const void *first)
{
	__u32 zero = 0;

	if (gfx_count_first(map, key, first, 1))
		gfx_count(&lost, &zero, 1);
}

#endif /* GFX_USTACK_H */
