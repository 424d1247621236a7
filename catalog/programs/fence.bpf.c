// SPDX-License-Identifier: GPL-2.0
/*
 * fence: dma_fence latency from emit (or init) to signaled, as a log2
 * histogram per driver and timeline name.
 *
 * Many drivers never fire dma_fence_emit, so dma_fence_init also starts a
 * fence: init only creates a start entry; emit creates it or replaces an
 * init start (emit is the closer start when a driver has both). Names are
 * taken at start time: on 6.17+ later events may report placeholder names
 * once the fence is signaled. (context, seqno) identifies a fence.
 */
#include "gfxbpf.h"

#define NAME_LEN 32

/* All dma_fence events share one class: driver dl@8, timeline dl@12,
 * context u32@16, seqno u32@20 (the u64 values truncated). */
const volatile __u32 off_emit_driver = 8;
const volatile __u32 off_emit_timeline = 12;
const volatile __u32 off_emit_context = 16;
const volatile __u32 size_emit_context = 4;
const volatile __u32 off_emit_seqno = 20;
const volatile __u32 size_emit_seqno = 4;
const volatile __u32 off_init_driver = 8;
const volatile __u32 off_init_timeline = 12;
const volatile __u32 off_init_context = 16;
const volatile __u32 size_init_context = 4;
const volatile __u32 off_init_seqno = 20;
const volatile __u32 size_init_seqno = 4;
const volatile __u32 off_sig_context = 16;
const volatile __u32 size_sig_context = 4;
const volatile __u32 off_sig_seqno = 20;
const volatile __u32 size_sig_seqno = 4;

struct fence_key {
	__u64 context;
	__u64 seqno;
};

struct fence_start {
	__u64 ts;
	__u32 from_emit;
	__u32 pad;
	char driver[NAME_LEN];
	char timeline[NAME_LEN];
};

struct latency_key {
	char driver[NAME_LEN];
	char timeline[NAME_LEN];
	__u32 slot;
};

/* (context, seqno) -> start (broker-only); LRU drops fences never signaled */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct fence_key);
	__type(value, struct fence_start);
} fence_start SEC(".maps");

/* (driver, timeline, log2(ns)) -> fences signaled */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct latency_key);
	__type(value, __u64);
} fence_latency SEC(".maps");

static __always_inline void start_fence(void *ctx, struct fence_key *key, __u32 off_driver,
					__u32 off_timeline, __u32 from_emit)
{
	struct fence_start st;

	__builtin_memset(&st, 0, sizeof(st));
	st.ts = bpf_ktime_get_ns();
	st.from_emit = from_emit;
	gfx_ctx_str(ctx, off_driver, st.driver, sizeof(st.driver));
	gfx_ctx_str(ctx, off_timeline, st.timeline, sizeof(st.timeline));
	bpf_map_update_elem(&fence_start, key, &st, from_emit ? BPF_ANY : BPF_NOEXIST);
}

SEC("tracepoint/dma_fence/dma_fence_emit")
int fence_emit(void *ctx)
{
	struct fence_key key = {
		.context = gfx_ctx_uint(ctx, off_emit_context, size_emit_context),
		.seqno = gfx_ctx_uint(ctx, off_emit_seqno, size_emit_seqno),
	};
	struct fence_start *st = bpf_map_lookup_elem(&fence_start, &key);

	if (st) {
		if (!st->from_emit) {
			st->ts = bpf_ktime_get_ns();
			st->from_emit = 1;
		}
		return 0;
	}
	start_fence(ctx, &key, off_emit_driver, off_emit_timeline, 1);
	return 0;
}

SEC("tracepoint/dma_fence/dma_fence_init")
int fence_init(void *ctx)
{
	struct fence_key key = {
		.context = gfx_ctx_uint(ctx, off_init_context, size_init_context),
		.seqno = gfx_ctx_uint(ctx, off_init_seqno, size_init_seqno),
	};

	start_fence(ctx, &key, off_init_driver, off_init_timeline, 0);
	return 0;
}

SEC("tracepoint/dma_fence/dma_fence_signaled")
int fence_signaled(void *ctx)
{
	struct fence_key key = {
		.context = gfx_ctx_uint(ctx, off_sig_context, size_sig_context),
		.seqno = gfx_ctx_uint(ctx, off_sig_seqno, size_sig_seqno),
	};
	struct latency_key lkey;
	struct fence_start *st;
	__u64 now = bpf_ktime_get_ns();

	st = bpf_map_lookup_elem(&fence_start, &key);
	if (!st)
		return 0;  /* started before we attached */
	__builtin_memset(&lkey, 0, sizeof(lkey));
	__builtin_memcpy(lkey.driver, st->driver, sizeof(lkey.driver));
	__builtin_memcpy(lkey.timeline, st->timeline, sizeof(lkey.timeline));
	lkey.slot = gfx_log2(now - st->ts);
	bpf_map_delete_elem(&fence_start, &key);
	gfx_count(&fence_latency, &lkey, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
