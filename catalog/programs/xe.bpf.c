// SPDX-License-Identifier: GPL-2.0
/*
 * xe: Intel xe driver jobs and VMA binds.
 *
 * Jobs: xe_sched_job_exec (submitted by the exec ioctl) -> xe_sched_job_run
 * (the DRM scheduler hands it to the GuC) -> xe_sched_job_free (completed
 * and released): wait_latency is exec -> run, run_latency run -> free, per
 * device; job_timeouts counts xe_sched_job_timedout per device. A job is
 * identified by its fence pointer, so xe_jobs stays broker-only.
 *
 * Binds: xe_vma_bind / xe_vma_unbind per address space; the `vm` pointer
 * becomes a small id (gfx_vmid.h) and the VMA size is end - start + 1;
 * the maps and their filling are shared with vmabind (gfx_vmbind.h).
 *
 * Needs the 6.11+ layout (`dev` and `vm` fields); on 6.10 the broker
 * reports the missing field.
 */
#include "gfx_vmbind.h"

#define DEV_LEN 32

/* 6.11+ class xe_sched_job: dev dl@8, fence ptr@40 */
const volatile __u32 off_x_dev = 8;
const volatile __u32 off_x_fence = 40;
const volatile __u32 off_r_dev = 8;
const volatile __u32 off_r_fence = 40;
const volatile __u32 off_f_fence = 40;
const volatile __u32 off_t_dev = 8;
/* 6.11+ class xe_vma: vm ptr@24, start u64@40, end u64@48 (inclusive) */
const volatile __u32 off_b_vm = 24;
const volatile __u32 off_b_start = 40;
const volatile __u32 off_b_end = 48;
const volatile __u32 off_u_vm = 24;
const volatile __u32 off_u_start = 40;
const volatile __u32 off_u_end = 48;

struct xe_job {
	__u64 exec_ns;  /* 0: submitted before we attached */
	__u64 run_ns;
	char dev[DEV_LEN];
};

struct dev_key {
	char dev[DEV_LEN];
};

struct dev_slot_key {
	char dev[DEV_LEN];
	__u32 slot;
};

/* fence pointer -> job times (broker-only: keys are kernel addresses) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct xe_job);
} xe_jobs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct dev_slot_key);
	__type(value, __u64);
} wait_latency SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct dev_slot_key);
	__type(value, __u64);
} run_latency SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct dev_key);
	__type(value, __u64);
} job_timeouts SEC(".maps");

static __always_inline void add_latency(void *map, const char *dev, __u64 ns)
{
	struct dev_slot_key key;

	__builtin_memset(&key, 0, sizeof(key));
	__builtin_memcpy(key.dev, dev, sizeof(key.dev));
	key.slot = gfx_log2(ns);
	gfx_count(map, &key, 1);
}

SEC("tracepoint/xe/xe_sched_job_exec")
int job_exec(void *ctx)
{
	__u64 fence = gfx_ctx_u64(ctx, off_x_fence);
	struct xe_job j;

	__builtin_memset(&j, 0, sizeof(j));
	j.exec_ns = bpf_ktime_get_ns();
	gfx_ctx_str(ctx, off_x_dev, j.dev, sizeof(j.dev));
	bpf_map_update_elem(&xe_jobs, &fence, &j, BPF_ANY);
	return 0;
}

SEC("tracepoint/xe/xe_sched_job_run")
int job_run(void *ctx)
{
	__u64 fence = gfx_ctx_u64(ctx, off_r_fence);
	__u64 now = bpf_ktime_get_ns();
	struct xe_job *jp, j;

	jp = bpf_map_lookup_elem(&xe_jobs, &fence);
	if (jp) {
		if (jp->exec_ns && !jp->run_ns)
			add_latency(&wait_latency, jp->dev, now - jp->exec_ns);
		jp->run_ns = now;
		return 0;
	}
	__builtin_memset(&j, 0, sizeof(j));
	j.run_ns = now;
	gfx_ctx_str(ctx, off_r_dev, j.dev, sizeof(j.dev));
	bpf_map_update_elem(&xe_jobs, &fence, &j, BPF_ANY);
	return 0;
}

SEC("tracepoint/xe/xe_sched_job_free")
int job_free(void *ctx)
{
	__u64 fence = gfx_ctx_u64(ctx, off_f_fence);
	struct xe_job *jp;

	jp = bpf_map_lookup_elem(&xe_jobs, &fence);
	if (!jp)
		return 0;
	if (jp->run_ns)
		add_latency(&run_latency, jp->dev, bpf_ktime_get_ns() - jp->run_ns);
	bpf_map_delete_elem(&xe_jobs, &fence);
	return 0;
}

SEC("tracepoint/xe/xe_sched_job_timedout")
int job_timedout(void *ctx)
{
	struct dev_key key;

	__builtin_memset(&key, 0, sizeof(key));
	gfx_ctx_str(ctx, off_t_dev, key.dev, sizeof(key.dev));
	gfx_count(&job_timeouts, &key, 1);
	return 0;
}

SEC("tracepoint/xe/xe_vma_bind")
int vma_bind(void *ctx)
{
	gfx_vma_bind(gfx_ctx_u64(ctx, off_b_vm),
		     gfx_ctx_u64(ctx, off_b_end) - gfx_ctx_u64(ctx, off_b_start) + 1, 1);
	return 0;
}

SEC("tracepoint/xe/xe_vma_unbind")
int vma_unbind(void *ctx)
{
	gfx_vma_bind(gfx_ctx_u64(ctx, off_u_vm),
		     gfx_ctx_u64(ctx, off_u_end) - gfx_ctx_u64(ctx, off_u_start) + 1, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
