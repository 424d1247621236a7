// SPDX-License-Identifier: GPL-2.0
/*
 * amdgpu: command submissions from submission to run to done, per ring and
 * per process, and GPU VM mappings per process.
 *
 * - amdgpu_cs_ioctl fires in the submitting thread (the CS ioctl): it
 *   starts a job and names its process; amdgpu_sched_run_job is the GPU
 *   scheduler handing the job to its ring; dma_fence_signaled of the job's
 *   scheduler fence is done. A job is (fence context, seqno), cut to 32
 *   bits each because dma_fence events carry only 32 (and amdgpu's own
 *   events did until 6.17; the size knobs follow the live format).
 * - amdgpu_vm_bo_map / _unmap fire in the process mapping or unmapping
 *   (the GEM VA ioctl); start/last are GPU page numbers (4 KiB pages).
 *
 * Scope self: target_uid drops other users' submissions and mappings in
 * the kernel; their jobs are never started, so their run/done events find
 * nothing.
 */
#include "gfx_ringlat.h"
#include "gfx_rows.h"

#define RING_LEN GFX_RING_LEN
#define COMM_LEN 16
#define GPU_PAGE 4096

const volatile __u32 target_uid = GFX_ANY;

/* 6.17+: timeline dl@8, context u64@16, seqno u64@24, fence@32, ring dl@40;
 * up to 6.16: sched_job_id@8, timeline@16, context u32@20, seqno u32@24,
 * fence@32, ring dl@40 */
const volatile __u32 off_cs_context = 16;
const volatile __u32 size_cs_context = 8;
const volatile __u32 off_cs_seqno = 24;
const volatile __u32 size_cs_seqno = 8;
const volatile __u32 off_cs_ring = 40;
/* 6.17+: context u64@16, seqno u64@24, ring dl@32 (6.16: @20, @24, @28) */
const volatile __u32 off_run_context = 16;
const volatile __u32 size_run_context = 8;
const volatile __u32 off_run_seqno = 24;
const volatile __u32 size_run_seqno = 8;
const volatile __u32 off_run_ring = 32;
/* dma_fence_signaled: context u32@16, seqno u32@20 */
const volatile __u32 off_sig_context = 16;
const volatile __u32 size_sig_context = 4;
const volatile __u32 off_sig_seqno = 20;
const volatile __u32 size_sig_seqno = 4;
/* amdgpu_vm_bo_map / _unmap: start s64@16, last s64@24 */
const volatile __u32 off_map_start = 16;
const volatile __u32 off_map_last = 24;
const volatile __u32 off_unmap_start = 16;
const volatile __u32 off_unmap_last = 24;

struct job_key {
	__u32 context;
	__u32 seqno;
};

struct proc_key {
	__u32 tgid;
	char comm[COMM_LEN];
};

struct amd_job {
	__u64 submit_ns;
	__u64 run_ns;
	struct proc_key proc;
	char ring[RING_LEN];
};

/* Per process: jobs submitted and finished, summed latencies (ns). */
struct proc_jobs {
	__u64 submitted;
	__u64 done;
	__u64 wait_ns;  /* submit -> run, summed over jobs that ran */
	__u64 run_ns;   /* run -> done, summed over jobs that finished */
};

/* Per process: VM mappings made and removed, in bytes and calls. */
struct proc_vm {
	__u64 bytes_mapped;
	__u64 bytes_unmapped;
	__u64 maps;
	__u64 unmaps;
};

/* (context, seqno) -> job in flight (internal; LRU drops jobs never done) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct job_key);
	__type(value, struct amd_job);
} amd_jobs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ring_key);
	__type(value, __u64);
} wait_latency SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ring_key);
	__type(value, __u64);
} run_latency SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct proc_key);
	__type(value, struct proc_jobs);
} proc_jobs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct proc_key);
	__type(value, struct proc_vm);
} proc_vm SEC(".maps");

static __always_inline void current_proc(struct proc_key *p)
{
	__builtin_memset(p, 0, sizeof(*p));
	p->tgid = bpf_get_current_pid_tgid() >> 32;
	bpf_get_current_comm(p->comm, sizeof(p->comm));
}

SEC("tracepoint/amdgpu/amdgpu_cs_ioctl")
int cs_ioctl(void *ctx)
{
	struct proc_jobs zero = {}, *pj;
	struct job_key key;
	struct amd_job j;

	if (!gfx_uid_ok(target_uid))
		return 0;
	key.context = gfx_ctx_uint(ctx, off_cs_context, size_cs_context);
	key.seqno = gfx_ctx_uint(ctx, off_cs_seqno, size_cs_seqno);
	__builtin_memset(&j, 0, sizeof(j));
	j.submit_ns = bpf_ktime_get_ns();
	current_proc(&j.proc);
	gfx_ctx_str(ctx, off_cs_ring, j.ring, sizeof(j.ring));
	bpf_map_update_elem(&amd_jobs, &key, &j, BPF_ANY);
	pj = gfx_row(&proc_jobs, &j.proc, &zero);
	if (pj)
		__sync_fetch_and_add(&pj->submitted, 1);
	return 0;
}

SEC("tracepoint/amdgpu/amdgpu_sched_run_job")
int sched_run_job(void *ctx)
{
	struct job_key key;
	struct amd_job *jp;
	struct proc_jobs *pj;
	__u64 now = bpf_ktime_get_ns();

	key.context = gfx_ctx_uint(ctx, off_run_context, size_run_context);
	key.seqno = gfx_ctx_uint(ctx, off_run_seqno, size_run_seqno);
	jp = bpf_map_lookup_elem(&amd_jobs, &key);
	if (!jp || jp->run_ns)
		return 0;  /* not submitted while we watched, or another user's */
	jp->run_ns = now;
	gfx_ring_latency(&wait_latency, jp->ring, now - jp->submit_ns);
	pj = bpf_map_lookup_elem(&proc_jobs, &jp->proc);
	if (pj)
		__sync_fetch_and_add(&pj->wait_ns, now - jp->submit_ns);
	return 0;
}

SEC("tracepoint/dma_fence/dma_fence_signaled")
int fence_signaled(void *ctx)
{
	struct job_key key;
	struct amd_job *jp;
	struct proc_jobs *pj;
	__u64 now = bpf_ktime_get_ns();

	key.context = gfx_ctx_uint(ctx, off_sig_context, size_sig_context);
	key.seqno = gfx_ctx_uint(ctx, off_sig_seqno, size_sig_seqno);
	jp = bpf_map_lookup_elem(&amd_jobs, &key);
	if (!jp)
		return 0;  /* most fences are not amdgpu jobs we started */
	pj = bpf_map_lookup_elem(&proc_jobs, &jp->proc);
	if (jp->run_ns) {
		gfx_ring_latency(&run_latency, jp->ring, now - jp->run_ns);
		if (pj)
			__sync_fetch_and_add(&pj->run_ns, now - jp->run_ns);
	}
	if (pj)
		__sync_fetch_and_add(&pj->done, 1);
	bpf_map_delete_elem(&amd_jobs, &key);
	return 0;
}

static __always_inline void on_vm(__s64 start, __s64 last, int map)
{
	struct proc_vm zero = {}, *pv;
	struct proc_key p;
	__u64 bytes = (__u64)(last - start + 1) * GPU_PAGE;

	if (!gfx_uid_ok(target_uid))
		return;
	current_proc(&p);
	pv = gfx_row(&proc_vm, &p, &zero);
	if (!pv)
		return;
	if (map) {
		__sync_fetch_and_add(&pv->bytes_mapped, bytes);
		__sync_fetch_and_add(&pv->maps, 1);
	} else {
		__sync_fetch_and_add(&pv->bytes_unmapped, bytes);
		__sync_fetch_and_add(&pv->unmaps, 1);
	}
}

SEC("tracepoint/amdgpu/amdgpu_vm_bo_map")
int vm_bo_map(void *ctx)
{
	on_vm(gfx_ctx_u64(ctx, off_map_start), gfx_ctx_u64(ctx, off_map_last), 1);
	return 0;
}

SEC("tracepoint/amdgpu/amdgpu_vm_bo_unmap")
int vm_bo_unmap(void *ctx)
{
	on_vm(gfx_ctx_u64(ctx, off_unmap_start), gfx_ctx_u64(ctx, off_unmap_last), 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
