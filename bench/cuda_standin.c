// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for NVIDIA's libcuda.so.1: the CUDA driver API entry points
 * the `cuda` program probes (catalog/cuda_api.py), with the driver's signatures
 * (cuda.h), doing no GPU work. Tests and the bench build it with
 * gcc -shared -fPIC as libcuda.so.1, so gfxclient finds it by name in a
 * process's maps like the real one.
 *
 * Allocations hand out made-up device pointers from a bump counter; a
 * null destination makes cuMemcpyHtoD_v2 fail (so tests see an error
 * return); synchronization sleeps GFX_SYNC_US microseconds.
 *
 * -DGFX_OLD_DRIVER leaves out the per-thread-stream (_ptsz/_ptds) variants
 * and cuLaunchKernelEx, as an older driver would: the broker must skip and
 * list them. -DGFX_FILLER_H=file includes extra exported functions (the
 * bench's large library).
 */
#include <stddef.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUfunction, *CUstream, *CUcontext, *CUevent, *CUgraphExec, *CUmemoryPool;
typedef struct CUlaunchConfig_st CUlaunchConfig;

#define OK 0
#define ERR_INVALID_VALUE 1
#define API __attribute__((visibility("default"), noinline))
#ifndef GFX_SYNC_US
#define GFX_SYNC_US 1000
#endif

static CUdeviceptr next_dptr = 0x700000000000ULL;
static volatile unsigned long long work;  /* keeps calls from being folded away */

static CUresult alloc(CUdeviceptr *dptr, size_t bytesize)
{
	if (!dptr || !bytesize)
		return ERR_INVALID_VALUE;
	*dptr = next_dptr;
	next_dptr += (bytesize + 255) & ~255ULL;
	return OK;
}

static CUresult copy(unsigned long long dst, size_t n)
{
	work += n;
	return dst ? OK : ERR_INVALID_VALUE;
}

static CUresult wait_gpu(void)
{
	struct timespec ts = { 0, GFX_SYNC_US * 1000L };

	nanosleep(&ts, NULL);
	return OK;
}

#define LAUNCH_ARGS CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, \
	unsigned by, unsigned bz, unsigned shared, CUstream s
API CUresult cuLaunchKernel(LAUNCH_ARGS, void **params, void **extra) { work++; return OK; }
API CUresult cuLaunchCooperativeKernel(LAUNCH_ARGS, void **params) { work++; return OK; }
API CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { work++; return OK; }

API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { return copy(d, n); }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s) { return copy(d, n); }
API CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { return copy((CUdeviceptr)h, n); }
API CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s) { return copy((CUdeviceptr)h, n); }
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr src, size_t n) { return copy(d, n); }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) { return copy(d, n); }
API CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr src, size_t n) { return copy(d, n); }
API CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) { return copy(d, n); }
API CUresult cuMemcpyPeer(CUdeviceptr d, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n) { return copy(d, n); }
API CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream s) { return copy(d, n); }

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc(p, n); }
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { return alloc(p, n); }
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) { return alloc(p, n); }
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { return alloc(p, n); }
API CUresult cuMemFree_v2(CUdeviceptr p) { return p ? OK : ERR_INVALID_VALUE; }
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return p ? OK : ERR_INVALID_VALUE; }
/* Virtual memory management (PyTorch's expandable segments): a handle per allocation. */
API CUresult cuMemCreate(CUdeviceptr *handle, size_t n, const void *prop, unsigned long long flags) { return alloc(handle, n); }
API CUresult cuMemRelease(CUdeviceptr handle) { return handle ? OK : ERR_INVALID_VALUE; }

API CUresult cuStreamSynchronize(CUstream s) { return wait_gpu(); }
API CUresult cuCtxSynchronize(void) { return wait_gpu(); }
API CUresult cuEventSynchronize(CUevent e) { return wait_gpu(); }
API CUresult cuCtxSynchronize_v2(CUcontext c) { return wait_gpu(); }

#ifndef GFX_OLD_DRIVER
API CUresult cuLaunchKernel_ptsz(LAUNCH_ARGS, void **params, void **extra) { work++; return OK; }
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) { work++; return OK; }
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) { work++; return OK; }
API CUresult cuLaunchCooperativeKernel_ptsz(LAUNCH_ARGS, void **params) { work++; return OK; }
API CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { work++; return OK; }
API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *h, size_t n) { return copy(d, n); }
API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *h, size_t n, CUstream s) { return copy(d, n); }
API CUresult cuMemcpyDtoH_v2_ptds(void *h, CUdeviceptr d, size_t n) { return copy((CUdeviceptr)h, n); }
API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *h, CUdeviceptr d, size_t n, CUstream s) { return copy((CUdeviceptr)h, n); }
API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr src, size_t n) { return copy(d, n); }
API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) { return copy(d, n); }
API CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr src, size_t n) { return copy(d, n); }
API CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) { return copy(d, n); }
API CUresult cuMemcpyPeer_ptds(CUdeviceptr d, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n) { return copy(d, n); }
API CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr d, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream s) { return copy(d, n); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return alloc(p, n); }
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { return alloc(p, n); }
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return p ? OK : ERR_INVALID_VALUE; }
API CUresult cuStreamSynchronize_ptsz(CUstream s) { return wait_gpu(); }
#endif

#ifdef GFX_FILLER_H
#include GFX_FILLER_H
#endif
