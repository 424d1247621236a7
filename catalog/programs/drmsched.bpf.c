// SPDX-License-Identifier: GPL-2.0
/*
 * drmsched: GPU scheduler job latency per ring: queue -> run and
 * run -> done, log2 histograms keyed by the ring (`name` field).
 *
 * Two sets of programs, one per tracepoint generation (catalog variants):
 * - 6.17+: drm_sched_job_queue / _run / _done, a job is identified by
 *   (fence_context, fence_seqno);
 * - legacy (<= 6.16): drm_sched_job / drm_run_job / drm_sched_process_job,
 *   identified by the finished-fence pointer (so sched_jobs, which holds it,
 *   stays broker-only).
 */
#include "gfx_ringlat.h"

#define NAME_LEN GFX_RING_LEN

const volatile __u32 target_uid = GFX_ANY;

/* 6.17+ class drm_sched_job: name dl@8, fence_context u64@24,
 * fence_seqno u64@32; drm_sched_job_done: fence_context@8, fence_seqno@16 */
const volatile __u32 off_q_name = 8;
const volatile __u32 off_q_context = 24;
const volatile __u32 off_q_seqno = 32;
const volatile __u32 off_r_name = 8;
const volatile __u32 off_r_context = 24;
const volatile __u32 off_r_seqno = 32;
const volatile __u32 off_q_client = 40;
const volatile __u32 off_r_client = 40;
const volatile __u32 off_d_context = 8;
const volatile __u32 off_d_seqno = 16;
/* <= 6.16: drm_sched_job / drm_run_job: fence ptr@16, name dl@24;
 * drm_sched_process_job: fence ptr@8 */
const volatile __u32 off_lq_fence = 16;
const volatile __u32 off_lq_name = 24;
const volatile __u32 off_lr_fence = 16;
const volatile __u32 off_lr_name = 24;
const volatile __u32 off_ld_fence = 8;

/* legacy: context = fence pointer, seqno = 0 */
struct job_key {
	__u64 context;
	__u64 seqno;
};

struct job {
	__u64 queued_ns;  /* 0: queued before we attached */
	__u64 run_ns;
	__u64 client_id;  /* 0: unknown (legacy events carry none) */
	char ring[NAME_LEN];
};

/* slot is a u64 so the key has no padding bytes to leave uninitialized */
struct client_key {
	__u64 client_id;
	__u64 slot;
};

/* job -> timestamps (broker-only: legacy keys are kernel addresses) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct job_key);
	__type(value, struct job);
} sched_jobs SEC(".maps");

/* (ring, log2(ns)) -> jobs: time from queue to run */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ring_key);
	__type(value, __u64);
} queue_latency SEC(".maps");

/* (ring, log2(ns)) -> jobs: time from run to done */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ring_key);
	__type(value, __u64);
} run_latency SEC(".maps");

/* (DRM client id, log2(ns)) -> jobs: time from queue to run */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct client_key);
	__type(value, __u64);
} client_queue SEC(".maps");

/* (DRM client id, log2(ns)) -> jobs: time from run to done */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct client_key);
	__type(value, __u64);
} client_run SEC(".maps");

/* The client id at off, or 0 when this kernel's event has no client_id. */
static __always_inline __u64 client_of(void *ctx, __u32 off)
{
	return off == GFX_ABSENT ? 0 : gfx_ctx_u64(ctx, off);
}

static __always_inline void add_client_latency(void *map, __u64 client_id, __u64 ns)
{
	struct client_key key = { .client_id = client_id, .slot = gfx_log2(ns) };

	gfx_count(map, &key, 1);
}

static __always_inline void on_queue(void *ctx, struct job_key *key, __u32 off_name,
				     __u64 client_id)
{
	struct job j;

	if (!gfx_uid_ok(target_uid))
		return;
	__builtin_memset(&j, 0, sizeof(j));
	j.queued_ns = bpf_ktime_get_ns();
	j.client_id = client_id;
	gfx_ctx_str(ctx, off_name, j.ring, sizeof(j.ring));
	bpf_map_update_elem(&sched_jobs, key, &j, BPF_ANY);
}

static __always_inline void on_run(void *ctx, struct job_key *key, __u32 off_name,
				   __u64 client_id)
{
	__u64 now = bpf_ktime_get_ns();
	struct job *jp, j;

	jp = bpf_map_lookup_elem(&sched_jobs, key);
	if (jp) {
		if (jp->queued_ns && !jp->run_ns) {
			gfx_ring_latency(&queue_latency, jp->ring, now - jp->queued_ns);
			add_client_latency(&client_queue, jp->client_id, now - jp->queued_ns);
		}
		jp->run_ns = now;
		return;
	}
	/* Queued before we attached: in scope self we cannot tell whose it is. */
	if (target_uid != GFX_ANY)
		return;
	__builtin_memset(&j, 0, sizeof(j));
	j.run_ns = now;
	j.client_id = client_id;
	gfx_ctx_str(ctx, off_name, j.ring, sizeof(j.ring));
	bpf_map_update_elem(&sched_jobs, key, &j, BPF_ANY);
}

static __always_inline void on_done(struct job_key *key)
{
	__u64 now = bpf_ktime_get_ns();
	struct job *jp;

	jp = bpf_map_lookup_elem(&sched_jobs, key);
	if (!jp)
		return;
	if (jp->run_ns) {
		gfx_ring_latency(&run_latency, jp->ring, now - jp->run_ns);
		add_client_latency(&client_run, jp->client_id, now - jp->run_ns);
	}
	bpf_map_delete_elem(&sched_jobs, key);
}

SEC("tracepoint/gpu_scheduler/drm_sched_job_queue")
int job_queue(void *ctx)
{
	struct job_key key = {
		.context = gfx_ctx_u64(ctx, off_q_context),
		.seqno = gfx_ctx_u64(ctx, off_q_seqno),
	};

	on_queue(ctx, &key, off_q_name, client_of(ctx, off_q_client));
	return 0;
}

SEC("tracepoint/gpu_scheduler/drm_sched_job_run")
int job_run(void *ctx)
{
	struct job_key key = {
		.context = gfx_ctx_u64(ctx, off_r_context),
		.seqno = gfx_ctx_u64(ctx, off_r_seqno),
	};

	on_run(ctx, &key, off_r_name, client_of(ctx, off_r_client));
	return 0;
}

SEC("tracepoint/gpu_scheduler/drm_sched_job_done")
int job_done(void *ctx)
{
	struct job_key key = {
		.context = gfx_ctx_u64(ctx, off_d_context),
		.seqno = gfx_ctx_u64(ctx, off_d_seqno),
	};

	on_done(&key);
	return 0;
}

SEC("tracepoint/gpu_scheduler/drm_sched_job")
int legacy_queue(void *ctx)
{
	struct job_key key = { .context = gfx_ctx_u64(ctx, off_lq_fence) };

	on_queue(ctx, &key, off_lq_name, 0);
	return 0;
}

SEC("tracepoint/gpu_scheduler/drm_run_job")
int legacy_run(void *ctx)
{
	struct job_key key = { .context = gfx_ctx_u64(ctx, off_lr_fence) };

	on_run(ctx, &key, off_lr_name, 0);
	return 0;
}

SEC("tracepoint/gpu_scheduler/drm_sched_process_job")
int legacy_done(void *ctx)
{
	struct job_key key = { .context = gfx_ctx_u64(ctx, off_ld_fence) };

	on_done(&key);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
