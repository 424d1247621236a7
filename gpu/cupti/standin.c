// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for NVIDIA's libcupti (as bench/cuda_standin.c stands in for
 * libcuda): the CUPTI functions gpu/cupti/inject.c calls, with CUPTI's
 * signatures (cupti.h), and a pretend GPU. Tests build it with gcc -shared
 * as libcupti.so.13 (or .12) so the injection library loads it in place of
 * the real one, then launch "kernels" through the hooks below:
 *
 *   gfx_standin_init()                    what the driver does at cuInit: loads
 *                                         CUDA_INJECTION64_PATH, calls InitializeInjection
 *   gfx_standin_launch(name, ns, grid, block)
 *                                         a cuLaunchKernel: the driver-API callback
 *                                         (enter, exit) with a new correlation id, and,
 *                                         while CONCURRENT_KERNEL is enabled, a kernel
 *                                         record that ran exactly `ns` nanoseconds
 *   gfx_standin_launch_runtime(...)       the same through a cudaLaunchKernel: runtime
 *                                         callbacks around the driver's, two ids, the
 *                                         record carrying the runtime's
 *   gfx_standin_launch_deep(...)          the same from under a 40 KiB frame, as a
 *                                         cuBLASLt launch sits deep in its library
 *   gfx_standin_launch_pair(a, b, ...)    kernel a deep, kernel b direct, in one call
 *   gfx_standin_launch_below_data(n, ns)  the same as _runtime from a thread whose 64 KiB
 *                                         stack lies right below 64 KiB of other readable
 *                                         memory
 *   gfx_standin_memcpy(bytes, kind, ns)   the same for a copy (MEMCPY) through a
 *                                         cudaMemcpyAsync and its driver call
 *                                         (cuMemcpyHtoDAsync_v2 for kind 1, ...)
 *   gfx_standin_memset(bytes, ns)         a cudaMemsetAsync (cuMemsetD32Async, MEMSET)
 *   GFX_STANDIN_NO_NAMES=1 (environment)  cuptiGetCallbackName names nothing, as
 *                                         libcupti without a driver answers
 *   gfx_standin_hold(1 or 0)              another client holds CUPTI: cuptiSubscribe
 *                                         answers CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
 *   gfx_standin_records()                 records produced so far
 *
 * Timestamps are CLOCK_MONOTONIC plus GFX_STANDIN_OFFSET, so a reader sees
 * whether the injection library maps them back. Kernels run one after the
 * other on the pretend GPU, from the launch on.
 */
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define API __attribute__((visibility("default")))
#define GFX_STANDIN_OFFSET 1000000000000ull  /* 1000 s ahead of CLOCK_MONOTONIC */
#define DEVICE 0
#define CONTEXT 1
#define STREAM 7

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static CUpti_CallbackFunc callback;
static void *callback_data;
static int subscribed, held;
static unsigned char driver_enabled[CUPTI_DRIVER_TRACE_CBID_SIZE];
static unsigned char runtime_enabled[CUPTI_RUNTIME_TRACE_CBID_SIZE];
static int kind_enabled[64];
static CUpti_BuffersCallbackRequestFunc request_fn;
static CUpti_BuffersCallbackCompleteFunc complete_fn;
static uint8_t *buffer;
static size_t buffer_size, buffer_used;
static uint32_t next_correlation = 1;
static uint64_t gpu_free_at;
static unsigned long long produced;

static uint64_t now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + GFX_STANDIN_OFFSET;
}

API CUptiResult cuptiGetTimestamp(uint64_t *timestamp)
{
	*timestamp = now();
	return CUPTI_SUCCESS;
}

API CUptiResult cuptiGetResultString(CUptiResult result, const char **str)
{
	*str = result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
		       ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
		       : (result ? "CUPTI_ERROR_UNKNOWN" : "CUPTI_SUCCESS");
	return CUPTI_SUCCESS;
}

API CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc fn, void *data)
{
	pthread_mutex_lock(&lock);
	if (subscribed || held) {
		pthread_mutex_unlock(&lock);
		return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
	}
	subscribed = 1;
	callback = fn;
	callback_data = data;
	*subscriber = (CUpti_SubscriberHandle)&subscribed;
	pthread_mutex_unlock(&lock);
	return CUPTI_SUCCESS;
}

API CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber)
{
	(void)subscriber;
	pthread_mutex_lock(&lock);
	subscribed = 0;
	callback = NULL;
	memset(driver_enabled, 0, sizeof(driver_enabled));
	memset(runtime_enabled, 0, sizeof(runtime_enabled));
	pthread_mutex_unlock(&lock);
	return CUPTI_SUCCESS;
}

/* The names of the callbacks this stand-in makes (CUPTI's own table has all). */
static const char *const driver_names[CUPTI_DRIVER_TRACE_CBID_SIZE] = {
	[CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel] = "cuLaunchKernel",
	[CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2] = "cuMemcpyHtoDAsync_v2",
	[CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2] = "cuMemcpyDtoHAsync_v2",
	[CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2] = "cuMemcpyDtoDAsync_v2",
	[CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync] = "cuMemcpyAsync",
	[CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async] = "cuMemsetD32Async",
};
static const char *const runtime_names[CUPTI_RUNTIME_TRACE_CBID_SIZE] = {
	[CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000] = "cudaLaunchKernel_v7000",
	[CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020] = "cudaMemcpyAsync_v3020",
	[CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020] = "cudaMemsetAsync_v3020",
};

API CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, const char **name)
{
	*name = NULL;
	if (getenv("GFX_STANDIN_NO_NAMES"))
		return CUPTI_ERROR_UNKNOWN;
	if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid < CUPTI_DRIVER_TRACE_CBID_SIZE)
		*name = driver_names[cbid];
	if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE)
		*name = runtime_names[cbid];
	return *name ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_PARAMETER;
}

API CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
				    CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
	(void)subscriber;
	if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid < CUPTI_DRIVER_TRACE_CBID_SIZE)
		driver_enabled[cbid] = (unsigned char)enable;
	if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE)
		runtime_enabled[cbid] = (unsigned char)enable;
	return CUPTI_SUCCESS;
}

API CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc req,
					       CUpti_BuffersCallbackCompleteFunc done)
{
	request_fn = req;
	complete_fn = done;
	return CUPTI_SUCCESS;
}

API CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind)
{
	if ((unsigned)kind >= 64)
		return CUPTI_ERROR_INVALID_KIND;
	__atomic_store_n(&kind_enabled[kind], 1, __ATOMIC_RELAXED);
	return CUPTI_SUCCESS;
}

API CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind)
{
	if ((unsigned)kind >= 64)
		return CUPTI_ERROR_INVALID_KIND;
	__atomic_store_n(&kind_enabled[kind], 0, __ATOMIC_RELAXED);
	return CUPTI_SUCCESS;
}

/* Hand the current buffer to the client; called with the lock held, released around it. */
static void complete_locked(void)
{
	uint8_t *b = buffer;
	size_t size = buffer_size, used = buffer_used;

	if (!b)
		return;
	buffer = NULL;
	buffer_used = buffer_size = 0;
	pthread_mutex_unlock(&lock);
	complete_fn(NULL, 0, b, size, used);
	pthread_mutex_lock(&lock);
}

API CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
	(void)flag;  /* every record is complete as soon as it is made */
	pthread_mutex_lock(&lock);
	if (buffer && buffer_used)
		complete_locked();
	pthread_mutex_unlock(&lock);
	return CUPTI_SUCCESS;
}

/* Records are laid end to end, each padded to 8 bytes, after a size word. */
API CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **record)
{
	size_t off = *record ? (size_t)((uint8_t *)*record - buf) : 0;

	if (*record)
		off += *(uint32_t *)(buf + off - 8);
	else
		off = 8;
	if (off >= valid)
		return CUPTI_ERROR_MAX_LIMIT_REACHED;
	*record = (CUpti_Activity *)(buf + off);
	return CUPTI_SUCCESS;
}

API CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext ctx, uint32_t stream, size_t *dropped)
{
	(void)ctx;
	(void)stream;
	*dropped = 0;
	return CUPTI_SUCCESS;
}

/* Room for one record of `size` bytes (and its size word) in the buffer. */
static void *append_locked(size_t size)
{
	size_t need = 8 + ((size + 7) & ~(size_t)7);
	uint8_t *at;

	if (buffer && buffer_used + need > buffer_size)
		complete_locked();
	if (!buffer) {
		size_t max_records = 0;

		request_fn(&buffer, &buffer_size, &max_records);
		buffer_used = 0;
		if (!buffer)
			return NULL;
	}
	at = buffer + buffer_used;
	*(uint32_t *)at = (uint32_t)need;  /* read back by cuptiActivityGetNextRecord */
	buffer_used += need;
	produced++;
	return memset(at + 8, 0, need - 8);
}

static uint64_t run_on_gpu(uint64_t ns)
{
	uint64_t start = now();

	if (start < gpu_free_at)
		start = gpu_free_at;
	gpu_free_at = start + ns;
	return start;
}

/* A launch callback: symbol is the kernel's name, as CUPTI's symbolName. */
static void api_callback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const char *name,
			 const char *symbol, uint32_t corr, int site)
{
	CUpti_CallbackData cb = {0};
	CUpti_CallbackFunc fn;
	int on;

	pthread_mutex_lock(&lock);
	on = domain == CUPTI_CB_DOMAIN_DRIVER_API ? driver_enabled[cbid] : runtime_enabled[cbid];
	fn = subscribed && on ? callback : NULL;
	pthread_mutex_unlock(&lock);
	if (!fn)
		return;
	cb.callbackSite = site;
	cb.functionName = name;
	cb.symbolName = symbol;
	cb.correlationId = corr;
	fn(callback_data, domain, cbid, &cb);
}

static void driver_callback(const char *kernel, uint32_t corr, int site)
{
	api_callback(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
		     "cuLaunchKernel", kernel, corr, site);
}

static void kernel_record(const char *name, unsigned long long ns, int grid, int block,
			  uint32_t corr);

API unsigned gfx_standin_launch(const char *name, unsigned long long ns, int grid, int block)
{
	uint32_t corr = __atomic_fetch_add(&next_correlation, 1, __ATOMIC_RELAXED);

	driver_callback(name, corr, CUPTI_API_ENTER);
	kernel_record(name, ns, grid, block, corr);
	driver_callback(name, corr, CUPTI_API_EXIT);
	return corr;
}

/* A runtime call (rt_cbid) entering the driver's call (drv_cbid), each with
 * its own correlation id (the runtime's returned, the driver's the next); the
 * record it makes carries the runtime's. symbol: a launch's kernel name. */
static uint32_t runtime_call(CUpti_CallbackId rt_cbid, const char *rt_name,
			     CUpti_CallbackId drv_cbid, const char *drv_name, const char *symbol)
{
	uint32_t rt = __atomic_fetch_add(&next_correlation, 2, __ATOMIC_RELAXED);

	api_callback(CUPTI_CB_DOMAIN_RUNTIME_API, rt_cbid, rt_name, symbol, rt, CUPTI_API_ENTER);
	api_callback(CUPTI_CB_DOMAIN_DRIVER_API, drv_cbid, drv_name, symbol, rt + 1,
		     CUPTI_API_ENTER);
	return rt;
}

/* Their exits, the driver's first. */
static void runtime_return(uint32_t rt, CUpti_CallbackId rt_cbid, const char *rt_name,
			   CUpti_CallbackId drv_cbid, const char *drv_name, const char *symbol)
{
	api_callback(CUPTI_CB_DOMAIN_DRIVER_API, drv_cbid, drv_name, symbol, rt + 1,
		     CUPTI_API_EXIT);
	api_callback(CUPTI_CB_DOMAIN_RUNTIME_API, rt_cbid, rt_name, symbol, rt, CUPTI_API_EXIT);
}

/* A runtime cudaLaunchKernel around the driver's cuLaunchKernel. */
API unsigned gfx_standin_launch_runtime(const char *name, unsigned long long ns, int grid,
					int block)
{
	CUpti_CallbackId rt_cbid = CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000;
	CUpti_CallbackId drv = CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel;
	uint32_t rt = runtime_call(rt_cbid, "cudaLaunchKernel", drv, "cuLaunchKernel", name);

	kernel_record(name, ns, grid, block, rt);
	runtime_return(rt, rt_cbid, "cudaLaunchKernel", drv, "cuLaunchKernel", name);
	return rt;
}

/* cuBLASLt's launches sit 68-70 KiB below the stack's top on an H200: a launch
 * stack copy must reach past a library's deep frames to the Python above.
 * Every page of the frame is written, as a real one's would be (a stack page
 * never touched is not there to copy). */
API unsigned gfx_standin_launch_deep(const char *name, unsigned long long ns, int grid,
				     int block)
{
	volatile char frame[40 << 10];
	unsigned rt;
	size_t i;

	for (i = 0; i < sizeof(frame); i += 4096)
		frame[i] = 1;
	rt = gfx_standin_launch_runtime(name, ns, grid, block);
	return rt + frame[0] - 1;  /* the frame stays live across the call */
}

/* Two kernels from one call, so from one Python line, through two native
 * paths: `deep` from under gfx_standin_launch_deep's frame, `direct` straight
 * through the runtime (as one PyTorch line launches cuBLAS's product and its
 * own elementwise kernel, or autograd's thread every backward kernel). */
API void gfx_standin_launch_pair(const char *deep, const char *direct, unsigned long long ns_deep,
				 unsigned long long ns_direct)
{
	gfx_standin_launch_deep(deep, ns_deep, 64, 128);
	gfx_standin_launch_runtime(direct, ns_direct, 32, 1024);
}

struct thread_launch {
	const char *name;
	unsigned long long ns;
};

/* Named as PyTorch names autograd's device threads (pt_autograd_N): a
 * launch stack shows the thread that launched. */
#define LAUNCHER_NAME "gfx_autograd_0"

static void *launch_on_thread(void *arg)
{
	struct thread_launch *l = arg;

	pthread_setname_np(pthread_self(), LAUNCHER_NAME);
	gfx_standin_launch_runtime(l->name, l->ns, 1, 32);
	return NULL;
}

/* A launch from a thread whose stack (64 KiB) lies right below 64 KiB of
 * readable memory of another mapping, as a thread's stack may lie below a
 * library or a heap: a copy of the launch's stack ends with the stack's
 * mapping, not at the first unreadable page. 0, or -1 when it could not. */
API int gfx_standin_launch_below_data(const char *name, unsigned long long ns)
{
	const size_t half = 64 << 10;
	struct thread_launch l = {name, ns};
	pthread_attr_t attr;
	pthread_t thread;
	char *region;
	int err;

	region = mmap(NULL, 2 * half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED)
		return -1;
	memset(region + half, 1, half);  /* pages that exist, so a copy could read them */
	err = mprotect(region + half, half, PROT_READ);  /* a mapping of its own */
	err = err ? err : pthread_attr_init(&attr);
	if (!err) {
		err = pthread_attr_setstack(&attr, region, half);
		err = err ? err : pthread_create(&thread, &attr, launch_on_thread, &l);
		err = err ? err : pthread_join(thread, NULL);
		pthread_attr_destroy(&attr);
	}
	munmap(region, 2 * half);
	return err ? -1 : 0;
}

static void kernel_record(const char *name, unsigned long long ns, int grid, int block,
			  uint32_t corr)
{
	CUpti_ActivityKernel9 *k;

	pthread_mutex_lock(&lock);
	if (__atomic_load_n(&kind_enabled[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL], __ATOMIC_RELAXED) &&
	    (k = append_locked(sizeof(*k)))) {
		k->kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
		k->start = run_on_gpu(ns);
		k->end = k->start + ns;
		k->deviceId = DEVICE;
		k->contextId = CONTEXT;
		k->streamId = STREAM;
		k->correlationId = corr;
		k->gridX = grid, k->gridY = 1, k->gridZ = 1;
		k->blockX = block, k->blockY = 1, k->blockZ = 1;
		k->name = name;  /* the caller's string: tests pass literals */
	}
	pthread_mutex_unlock(&lock);
}

static void transfer_record(CUpti_ActivityKind what, unsigned kind, unsigned long long bytes,
			    unsigned long long ns, uint32_t corr);

API unsigned gfx_standin_memcpy(unsigned long long bytes, unsigned kind, unsigned long long ns)
{
	CUpti_CallbackId rt_cbid = CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020;
	CUpti_CallbackId drv = kind == 1   ? CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2
			       : kind == 2 ? CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2
			       : kind == 8 ? CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2
					   : CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync;
	uint32_t rt = runtime_call(rt_cbid, "cudaMemcpyAsync", drv, driver_names[drv], NULL);

	transfer_record(CUPTI_ACTIVITY_KIND_MEMCPY, kind, bytes, ns, rt);
	runtime_return(rt, rt_cbid, "cudaMemcpyAsync", drv, driver_names[drv], NULL);
	return rt;
}

API unsigned gfx_standin_memset(unsigned long long bytes, unsigned long long ns)
{
	CUpti_CallbackId rt_cbid = CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020;
	CUpti_CallbackId drv = CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async;
	uint32_t rt = runtime_call(rt_cbid, "cudaMemsetAsync", drv, "cuMemsetD32Async", NULL);

	transfer_record(CUPTI_ACTIVITY_KIND_MEMSET, 0, bytes, ns, rt);
	runtime_return(rt, rt_cbid, "cudaMemsetAsync", drv, "cuMemsetD32Async", NULL);
	return rt;
}

/* A copy's (MEMCPY, of CUPTI's copy kind) or a memset's (MEMSET) record. */
static void transfer_record(CUpti_ActivityKind what, unsigned kind, unsigned long long bytes,
			    unsigned long long ns, uint32_t corr)
{
	int copy = what == CUPTI_ACTIVITY_KIND_MEMCPY;
	void *r;
	uint64_t at;

	pthread_mutex_lock(&lock);
	if (__atomic_load_n(&kind_enabled[what], __ATOMIC_RELAXED) &&
	    (r = append_locked(copy ? sizeof(CUpti_ActivityMemcpy6) : sizeof(CUpti_ActivityMemset4)))) {
		at = run_on_gpu(ns);
		if (copy)
			*(CUpti_ActivityMemcpy6 *)r = (CUpti_ActivityMemcpy6){
				.kind = what, .copyKind = (uint8_t)kind, .bytes = bytes, .start = at,
				.end = at + ns, .deviceId = DEVICE, .contextId = CONTEXT,
				.streamId = STREAM, .correlationId = corr};
		else
			*(CUpti_ActivityMemset4 *)r = (CUpti_ActivityMemset4){
				.kind = what, .bytes = bytes, .start = at, .end = at + ns,
				.deviceId = DEVICE, .contextId = CONTEXT, .streamId = STREAM,
				.correlationId = corr};
	}
	pthread_mutex_unlock(&lock);
}

API void gfx_standin_hold(int on)
{
	pthread_mutex_lock(&lock);
	held = on;
	pthread_mutex_unlock(&lock);
}

API unsigned long long gfx_standin_records(void)
{
	return __atomic_load_n(&produced, __ATOMIC_RELAXED);
}

/* What the CUDA driver does at cuInit with CUDA_INJECTION64_PATH. */
API int gfx_standin_init(void)
{
	const char *path = getenv("CUDA_INJECTION64_PATH");
	void *lib;
	int (*init)(void);

	if (!path)
		return 0;
	lib = dlopen(path, RTLD_NOW);
	init = lib ? (int (*)(void))dlsym(lib, "InitializeInjection") : NULL;
	if (!init) {
		fprintf(stderr, "standin cupti: cannot load %s: %s\n", path, dlerror());
		return -1;
	}
	return init();
}
