/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Shared helpers for the gfxbpf catalog programs.
 *
 * Conventions (see catalog/catalog.toml):
 * - scope knobs: `const volatile __u32 target_uid/target_pid`, GFX_ANY = every;
 * - tracepoint field offsets: `const volatile __u32` knobs the broker fills
 *   from the live `format` file before loading; read them with gfx_ctx_*();
 * - log2 histograms: a map whose key ends in `__u32 slot` (or is just the
 *   slot) and whose value is a __u64 count; slot s holds values v with
 *   2^s <= v < 2^(s+1), slot 0 also holds 0.
 */
#ifndef GFXBPF_H
#define GFXBPF_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define GFX_ANY ((__u32)-1)
/* An optional field's knob on a kernel whose event lacks the field. */
#define GFX_ABSENT ((__u32)-1)
#define GFX_SLOTS 64

/* Scope filter: true when the knob is GFX_ANY or equals the current uid. */
static __always_inline int gfx_uid_ok(__u32 target_uid)
{
	return target_uid == GFX_ANY || (__u32)bpf_get_current_uid_gid() == target_uid;
}

/* Scope filter on the thread group id (the user-space "pid"). */
static __always_inline int gfx_tgid_ok(__u32 target_pid)
{
	return target_pid == GFX_ANY || (__u32)(bpf_get_current_pid_tgid() >> 32) == target_pid;
}

/* floor(log2(v)) without loops (the verifier prefers straight-line code). */
static __always_inline __u32 gfx_log2(__u64 v)
{
	__u32 r = 0, shift;

	shift = (v > 0xffffffffULL) << 5; v >>= shift; r |= shift;
	shift = (v > 0xffff) << 4; v >>= shift; r |= shift;
	shift = (v > 0xff) << 3; v >>= shift; r |= shift;
	shift = (v > 0xf) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

/*
 * Add n to the __u64 counter at key in a hash map, creating it when absent.
 * Atomic add without using the result keeps to the base instruction set.
 */
static __always_inline void gfx_count(void *map, const void *key, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(map, key);
	__u64 init = n;

	if (v) {
		__sync_fetch_and_add(v, n);
		return;
	}
	if (bpf_map_update_elem(map, key, &init, BPF_NOEXIST) == 0)
		return;
	/* Another CPU created it first (or the map is full: then drop). */
	v = bpf_map_lookup_elem(map, key);
	if (v)
		__sync_fetch_and_add(v, n);
}

/*
 * Tracepoint record fields at offsets known only at load time.
 *
 * The verifier refuses a load through a ctx pointer with an added offset,
 * even a constant one, so `*(u64 *)(ctx + knob)` cannot load. The knob lives
 * in the frozen .rodata, so the verifier knows its value: gfx_ctx_u64()
 * compares it against every aligned candidate offset and each branch loads
 * with an immediate offset (inline asm, so clang cannot merge the branches
 * back into one load with a computed address). The verifier follows only the
 * branch the knob selects. An offset outside the candidates falls back to
 * bpf_probe_read_kernel().
 */
#define GFX_LDX(ctx, type, off)                                                       \
	({                                                                            \
		__u64 __v;                                                            \
		asm volatile("%0 = *(" #type " *)(%1 + " #off ")" : "=r"(__v) : "r"(ctx)); \
		__v;                                                                  \
	})

#define GFX_CASE(type, off)                                                           \
	case off:                                                                     \
		return GFX_LDX(ctx, type, off);

static __always_inline __u64 gfx_ctx_slow(void *ctx, __u32 off, __u32 size)
{
	__u64 v = 0;

	/* Little endian: a narrower field lands in the low bytes. */
	bpf_probe_read_kernel(&v, size < 8 ? size : 8, ctx + off);
	return v;
}

/* A u64 (or pointer) field at byte offset off of a tracepoint record. */
static __always_inline __u64 gfx_ctx_u64(void *ctx, __u32 off)
{
	switch (off) {
	GFX_CASE(u64, 8) GFX_CASE(u64, 16) GFX_CASE(u64, 24) GFX_CASE(u64, 32)
	GFX_CASE(u64, 40) GFX_CASE(u64, 48) GFX_CASE(u64, 56) GFX_CASE(u64, 64)
	GFX_CASE(u64, 72) GFX_CASE(u64, 80) GFX_CASE(u64, 88) GFX_CASE(u64, 96)
	}
	return gfx_ctx_slow(ctx, off, 8);
}

/* A u32 (or s32, or __data_loc) field at byte offset off. */
static __always_inline __u32 gfx_ctx_u32(void *ctx, __u32 off)
{
	switch (off) {
	GFX_CASE(u32, 8) GFX_CASE(u32, 12) GFX_CASE(u32, 16) GFX_CASE(u32, 20)
	GFX_CASE(u32, 24) GFX_CASE(u32, 28) GFX_CASE(u32, 32) GFX_CASE(u32, 36)
	GFX_CASE(u32, 40) GFX_CASE(u32, 44) GFX_CASE(u32, 48) GFX_CASE(u32, 52)
	GFX_CASE(u32, 56) GFX_CASE(u32, 60) GFX_CASE(u32, 64) GFX_CASE(u32, 68)
	GFX_CASE(u32, 72) GFX_CASE(u32, 76) GFX_CASE(u32, 80) GFX_CASE(u32, 84)
	GFX_CASE(u32, 88) GFX_CASE(u32, 92) GFX_CASE(u32, 96) GFX_CASE(u32, 100)
	}
	return gfx_ctx_slow(ctx, off, 4);
}

/* An unsigned integer field whose width (4 or 8) also comes from a knob. */
static __always_inline __u64 gfx_ctx_uint(void *ctx, __u32 off, __u32 size)
{
	if (size == 8)
		return gfx_ctx_u64(ctx, off);
	if (size == 4)
		return gfx_ctx_u32(ctx, off);
	return gfx_ctx_slow(ctx, off, size);
}

/*
 * A __data_loc string: the u32 at off holds the string's offset from the
 * record start (low 16 bits) and its length (high 16 bits).
 */
static __always_inline long gfx_ctx_str(void *ctx, __u32 off, char *buf, __u32 size)
{
	__u32 dl = gfx_ctx_u32(ctx, off);

	return bpf_probe_read_kernel_str(buf, size, ctx + (dl & 0xffff));
}

#endif /* GFXBPF_H */
