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

/*
 * Sizes (docs/PROFILE-OUTPUT.md, "Table sizes", has the numbers): a stack id
 * is a hash bucket, and a stack whose bucket is taken is lost (-EEXIST) long
 * before the table fills. The kernel makes roundup_pow_of_two(max_entries)
 * buckets but only max_entries stacks, and the stacks are the memory: one
 * more than a power of two doubles the buckets (fewer collisions) for 8
 * bytes a bucket. MAX_DEPTH frames a stack keeps the innermost ones; a
 * deeper stack loses its outermost callers, and the client says so.
 */
#define MAX_STACKS 16384                 /* rows of a count map */
#define STACK_ENTRIES (MAX_STACKS + 1)   /* 16385 stacks in 32768 buckets */
#define MAX_DEPTH 32

/* stack id -> user return addresses, innermost first, zero-padded */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, STACK_ENTRIES);
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
