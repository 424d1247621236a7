// SPDX-License-Identifier: GPL-2.0
/*
 * vblank: display timing per CRTC from drm:drm_vblank_event, which the DRM
 * core emits for each vblank it handles while vblank interrupts are on.
 *
 * - frame_interval: time between two consecutive vblanks (sequence numbers
 *   one apart) of a CRTC, a log2 histogram in ns;
 * - crtc_stats: per CRTC, vblanks seen, vblanks missed (a sequence jump of
 *   2..MAX_GAP counts jump-1 missed) and resumes (a larger jump, or one
 *   backwards: vblank interrupts were off, e.g. an idle display, which is
 *   not a missed frame).
 *
 * `crtc` and `seq` are in every layout of the event. Later kernels add
 * `time`, the vblank timestamp the DRM core computed (CLOCK_MONOTONIC, the
 * clock of bpf_ktime_get_ns()); it is an optional field: where the event
 * lacks it, the time is taken here, when the event is handled.
 */
#include "gfxbpf.h"

#define MAX_CRTCS 64
#define MAX_GAP 8

/* drm_vblank_event: crtc s32@8, seq u32@12 (every layout) */
const volatile __u32 off_crtc = 8;
const volatile __u32 off_seq = 12;
/* ktime_t time@16 (6.18); GFX_ABSENT on kernels without it */
const volatile __u32 off_time = 16;

struct crtc_last {
	__u64 ts_ns;
	__u32 seq;
	__u32 seen;
};

struct crtc_stats {
	__u64 vblanks;
	__u64 missed;
	__u64 resumes;
};

struct interval_key {
	__u32 crtc;
	__u32 slot;
};

/* crtc -> last vblank (internal) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CRTCS);
	__type(key, __u32);
	__type(value, struct crtc_last);
} crtc_last SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CRTCS);
	__type(key, __u32);
	__type(value, struct crtc_stats);
} crtc_stats SEC(".maps");

/* (crtc, log2(ns)) -> intervals */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CRTCS * GFX_SLOTS);
	__type(key, struct interval_key);
	__type(value, __u64);
} frame_interval SEC(".maps");

static __always_inline struct crtc_stats *stats_for(__u32 crtc)
{
	struct crtc_stats zero = {};
	struct crtc_stats *st = bpf_map_lookup_elem(&crtc_stats, &crtc);

	if (st)
		return st;
	bpf_map_update_elem(&crtc_stats, &crtc, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&crtc_stats, &crtc);
}

SEC("tracepoint/drm/drm_vblank_event")
int vblank_event(void *ctx)
{
	__u32 crtc = gfx_ctx_u32(ctx, off_crtc);
	__u32 seq = gfx_ctx_u32(ctx, off_seq);
	__u64 now = off_time == GFX_ABSENT ? bpf_ktime_get_ns() : gfx_ctx_u64(ctx, off_time);
	struct crtc_last *last, cur = { .ts_ns = now, .seq = seq, .seen = 1 };
	struct crtc_stats *st = stats_for(crtc);
	__u32 delta;

	if (!st)
		return 0;
	__sync_fetch_and_add(&st->vblanks, 1);
	last = bpf_map_lookup_elem(&crtc_last, &crtc);
	if (!last) {
		bpf_map_update_elem(&crtc_last, &crtc, &cur, BPF_ANY);
		return 0;
	}
	delta = seq - last->seq;
	if (delta == 1) {
		struct interval_key key = { .crtc = crtc, .slot = gfx_log2(now - last->ts_ns) };

		gfx_count(&frame_interval, &key, 1);
	} else if (delta >= 2 && delta <= MAX_GAP) {
		__sync_fetch_and_add(&st->missed, delta - 1);
	} else {
		__sync_fetch_and_add(&st->resumes, 1);
	}
	last->ts_ns = now;
	last->seq = seq;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
