/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The records gfxbpf's CUPTI injection library (gpu/cupti/inject.c) hands to
 * its USDT probes, provider `gfxcupti`; the `cudakernels` program reads them
 * with bpf_probe_read_user. Shared by both sides: change one, rebuild both.
 *
 *   gfxcupti:kernels(struct gfx_cupti_kernel *recs, __u32 n)  -- n records (at most
 *       GFX_CUPTI_BATCH) at a time, from the library's own thread
 *   gfxcupti:memcpy(struct gfx_cupti_copy *rec)
 *   gfxcupti:memset(struct gfx_cupti_copy *rec)
 *   gfxcupti:launch(__u32 runtime_id, __u32 driver_id, __u32 weight, __u64 kernel)  -- on the
 *       launching thread, once per probed launch: in a runtime launch
 *       (cudaLaunchKernel*, cudaGraphLaunch) at the entry of the driver launch it
 *       makes, with both ids (or at its exit with driver id 0 if it made none);
 *       at the entry of a driver launch called directly, runtime id 0. A
 *       kernel's record carries one of the two. weight: 1 while every launch
 *       fires the probe; N (a power of two) while launches come too fast and 1
 *       in N, drawn at random, does.
 *       The kernels of the others carry GFX_CUPTI_NOT_SAMPLED. kernel: the
 *       launched kernel's name hash, as its record's name_hash (0: unknown, a
 *       graph launch or a library before this argument; GFX_CUPTI_COPY_LAUNCH:
 *       a copy or memset API, cuMemcpy*, cuMemset*, cudaMemcpy*, cudaMemset*,
 *       whose record carries one of the ids as a kernel's does; libraries
 *       before 2026-11-29 fire no probe for copies).
 *   gfxcupti:refused(__s32 result, __u32 poll_ms)  -- from the library's thread, at
 *       each poll (every poll_ms) while a probe is attached but another CUPTI
 *       client (torch.profiler, Nsight) holds CUPTI: cuptiSubscribe's result, so
 *       nothing is collected; and with result 0 when a try succeeds after a
 *       refused one (it collects now). Libraries before 2026-11-29 lack it.
 *
 * Times are CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns's clock): the
 * library maps CUPTI's GPU timestamps onto it.
 */
#ifndef GFX_CUPTI_H
#define GFX_CUPTI_H

#include <linux/types.h>

#define GFX_CUPTI_NAME_MAX 256  /* kernel name bytes a reader keeps, NUL included */
#define GFX_CUPTI_NOT_SAMPLED 1  /* gfx_cupti_kernel and _copy .flags: its launch fired no probe */
#define GFX_CUPTI_COPY_LAUNCH 1  /* gfxcupti:launch's kernel for a copy or memset API */
#define GFX_CUPTI_BATCH 256      /* kernel records per gfxcupti:kernels probe, at most */

struct gfx_cupti_kernel {
	__u64 start_ns;
	__u64 end_ns;
	__u64 name_hash;  /* FNV-1a 64 of the whole (mangled) name */
	__u32 correlation_id;
	__u32 device;
	__u32 context;
	__u32 stream;
	__s32 grid[3];
	__s32 block[3];
	__u32 flags;  /* GFX_CUPTI_NOT_SAMPLED */
	__u32 pad;
	__u64 name;   /* the kernel's (mangled) name: a NUL-terminated string in the process */
};

struct gfx_cupti_copy {
	__u64 start_ns;
	__u64 end_ns;
	__u64 bytes;
	__u32 correlation_id;
	__u32 device;
	__u32 context;
	__u32 stream;
	__u32 kind;  /* memcpy: CUpti_ActivityMemcpyKind (1 HtoD, 2 DtoH, 8 DtoD, ...); memset: 0 */
	__u32 flags;  /* GFX_CUPTI_NOT_SAMPLED (0 from libraries before 2026-11-29) */
};

#endif /* GFX_CUPTI_H */
