// SPDX-License-Identifier: GPL-2.0
/*
 * gfxbpf's CUPTI injection library: the GPU's own time of each kernel, copy
 * and memset, handed to USDT probes (provider gfxcupti, records in
 * catalog/programs/gfx_cupti.h) that the `cudakernels` catalog program reads.
 *
 * Loaded by the CUDA driver at cuInit from CUDA_INJECTION64_PATH, which calls
 * InitializeInjection. Nothing is collected while no probe is attached: a
 * thread looks at the probes' USDT semaphores (the kernel raises them while a
 * uprobe holds them) every GFX_CUPTI_POLL_MS (default 100) ms, and only while
 * one is raised does the library subscribe to CUPTI, enable the kernel
 * (CONCURRENT_KERNEL), memcpy and memset activity kinds and the callbacks of
 * the launch, copy and memset APIs (the launch probe, which takes the stack).
 * When the last probe goes, it flushes, disables and unsubscribes, so a
 * profiler started later (torch.profiler, Nsight) can subscribe. If another
 * CUPTI client already holds the subscription, it says so once on stderr, and
 * at every poll to the listener (gfxcupti:refused), and collects nothing.
 *
 * CUPTI's timestamps are mapped onto CLOCK_MONOTONIC by an offset measured
 * (cuptiGetTimestamp between two clock_gettime calls, the tightest of a few)
 * when collection starts and at every poll while it runs.
 *
 * Built per CUDA major version by gpu/cupti/build.sh (headers and libcupti
 * from PyPI's nvidia-cuda-cupti wheels); the record fields used here sit at
 * the same offsets in CUPTI 12 and 13 (Kernel9, Memcpy6, Memset4).
 */
#define _GNU_SOURCE
#define _SDT_HAS_SEMAPHORES 1
#include <cupti.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <time.h>

#include "gfx_cupti.h"

#define EXPORT __attribute__((visibility("default")))
#define BUFFER_BYTES (1 << 20)
#define ALIGN 8
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The semaphores dtrace -G would make; the kernel counts attached uprobes here. */
EXPORT unsigned short gfxcupti_kernels_semaphore __attribute__((section(".probes")));
EXPORT unsigned short gfxcupti_memcpy_semaphore __attribute__((section(".probes")));
EXPORT unsigned short gfxcupti_memset_semaphore __attribute__((section(".probes")));
EXPORT unsigned short gfxcupti_launch_semaphore __attribute__((section(".probes")));
/* Not one that asks for collection (listened() leaves it out): it says why
 * there is none, at each poll while another CUPTI client holds CUPTI. */
EXPORT unsigned short gfxcupti_refused_semaphore __attribute__((section(".probes")));

static atomic_ullong records;   /* activity records CUPTI handed us */
static atomic_ullong launches;  /* launches (and copy or memset calls) seen */
static atomic_ullong dropped;   /* records CUPTI says it dropped */
static atomic_ullong incomplete;  /* kernel records without an end time (not counted) */
static atomic_llong clock_offset;  /* CLOCK_MONOTONIC minus CUPTI time, ns */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static CUpti_SubscriberHandle subscriber;
static int collecting;
static int warned;
static int refused;  /* the last try to subscribe was refused */
static atomic_ullong refusals;  /* tries refused while listened to */
static long poll_ms = 100;  /* GFX_CUPTI_POLL_MS */

/* Knobs for bench/gpu_overhead_parts.py, which takes the cost of listening
 * apart on a GPU host; read once at InitializeInjection, unset in production.
 *   GFX_CUPTI_ALWAYS=1        collect from the start, listened to or not
 *   GFX_CUPTI_NO_CALLBACKS=1  no launch callbacks (kernels without launch stacks)
 *   GFX_CUPTI_NO_ACTIVITY=1   launch callbacks only, no activity records
 *   GFX_CUPTI_LAUNCH_EVERY=N  sample 1 launch in N (a power of two), not adapting
 *   GFX_CUPTI_DUTY=ON/PERIOD  while listened to, CUPTI collects only ON ms of
 *                             every PERIOD ms (what a duty cycle would save). On
 *                             an H200 it saved too little to meet 5% (+11-13% at
 *                             2/20) and one of two runs at 5/20 ended the process
 *                             with SIGSEGV (switching CUPTI while it launches):
 *                             a measurement, never a product setting */
static int always, no_callbacks, no_activity, report_depth;
static unsigned duty_on_ms, duty_period_ms;
static int duty_active;  /* while collecting: CUPTI's records and callbacks are on */

/* Launch sampling. The launch probe walks the launching thread's stacks (a
 * uprobe trap and the Python walk: 2-8 us on an H200 against a 7-11 us
 * launch), so when a thread launches faster than GFX_CUPTI_LAUNCH_RATE per
 * second (default 2000) only 1 in `every` of its launches (a power of two,
 * set after each BURST launches from their rate) fires it, drawn at random,
 * with that number as its weight: a burst of up to BURST launches is probed
 * whole. Kernels of launches left out are marked GFX_CUPTI_NOT_SAMPLED in
 * their records: `skipped` remembers those correlation ids until the records
 * come (the ids are process-wide and increase; 65536 slots cover several
 * polls' launches at the fastest launch rates). */
static unsigned launch_rate = 2000;
#define BURST 256
static unsigned fixed_every;  /* GFX_CUPTI_LAUNCH_EVERY */
#define SKIP_SLOTS 65536
static _Atomic unsigned char skipped[SKIP_SLOTS];

/* Counters for tests and tools (ctypes or dlsym in the traced process). */
EXPORT unsigned long long gfx_cupti_records(void) { return atomic_load(&records); }
EXPORT unsigned long long gfx_cupti_launches(void) { return atomic_load(&launches); }
EXPORT unsigned long long gfx_cupti_dropped(void) { return atomic_load(&dropped); }
EXPORT unsigned long long gfx_cupti_incomplete(void) { return atomic_load(&incomplete); }
EXPORT int gfx_cupti_collecting(void) { return __atomic_load_n(&collecting, __ATOMIC_RELAXED); }
EXPORT unsigned long long gfx_cupti_refusals(void) { return atomic_load(&refusals); }

static volatile unsigned short *const semaphores[] = {
	&gfxcupti_kernels_semaphore, &gfxcupti_memcpy_semaphore,
	&gfxcupti_memset_semaphore, &gfxcupti_launch_semaphore,
};

static int listened(void)
{
	for (size_t i = 0; i < sizeof(semaphores) / sizeof(semaphores[0]); i++)
		if (*semaphores[i])
			return 1;
	return 0;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The offset from the tightest of a few (monotonic, CUPTI, monotonic) triples. */
static void calibrate(void)
{
	uint64_t best = UINT64_MAX;
	int64_t offset = 0;

	for (int i = 0; i < 5; i++) {
		uint64_t a = mono_ns(), c = 0, b;

		if (cuptiGetTimestamp(&c) != CUPTI_SUCCESS)
			return;
		b = mono_ns();
		if (b - a < best) {
			best = b - a;
			offset = (int64_t)(a + (b - a) / 2) - (int64_t)c;
		}
	}
	atomic_store(&clock_offset, offset);
}

static uint64_t to_mono(uint64_t cupti_ns)
{
	return cupti_ns + (uint64_t)atomic_load(&clock_offset);
}

static uint64_t fnv1a(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (; s && *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return h;
}

/* Kernel records go to the probe GFX_CUPTI_BATCH at a time: one uprobe per
 * batch instead of one per kernel (on an H200 the per-record probe cost the
 * launching threads +28% at ~100,000 kernels a second). Only the thread that
 * drains the buffers (below) touches the batch. */
static struct gfx_cupti_kernel batch[GFX_CUPTI_BATCH];
static unsigned batched;

static void flush_batch(void)
{
	if (batched && gfxcupti_kernels_semaphore) {
		struct gfx_cupti_kernel *recs = batch;
		uint32_t n = batched;

		__asm__("" : "+r"(recs), "+r"(n));  /* register operands for the probe */
		STAP_PROBE2(gfxcupti, kernels, recs, n);
	}
	batched = 0;
}

static void emit_kernel(const CUpti_ActivityKernel9 *k)
{
	unsigned char left_out = atomic_load_explicit(&skipped[k->correlationId % SKIP_SLOTS],
						      memory_order_relaxed);

	batch[batched++] = (struct gfx_cupti_kernel){
		.flags = left_out ? GFX_CUPTI_NOT_SAMPLED : 0,
		.start_ns = to_mono(k->start), .end_ns = to_mono(k->end),
		.name_hash = fnv1a(k->name), .correlation_id = k->correlationId,
		.device = k->deviceId, .context = k->contextId, .stream = k->streamId,
		.grid = {k->gridX, k->gridY, k->gridZ},
		.block = {k->blockX, k->blockY, k->blockZ},
		.name = (uint64_t)(uintptr_t)(k->name ? k->name : ""),
	};
	if (batched == GFX_CUPTI_BATCH)
		flush_batch();
}

static void emit_copy(uint64_t start, uint64_t end, uint64_t bytes, uint32_t corr,
		      uint32_t dev, uint32_t ctx, uint32_t stream, uint32_t kind, int is_set)
{
	unsigned char left_out = atomic_load_explicit(&skipped[corr % SKIP_SLOTS],
						      memory_order_relaxed);
	struct gfx_cupti_copy rec = {
		.start_ns = to_mono(start), .end_ns = to_mono(end), .bytes = bytes,
		.correlation_id = corr, .device = dev, .context = ctx, .stream = stream,
		.kind = kind, .flags = left_out ? GFX_CUPTI_NOT_SAMPLED : 0,
	};

	if (is_set && gfxcupti_memset_semaphore)
		STAP_PROBE1(gfxcupti, memset, &rec);
	else if (!is_set && gfxcupti_memcpy_semaphore)
		STAP_PROBE1(gfxcupti, memcpy, &rec);
}

static void emit(const CUpti_Activity *r)
{
	atomic_fetch_add(&records, 1);
	if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
		const CUpti_ActivityKernel9 *k = (const CUpti_ActivityKernel9 *)r;

		/* A forced flush (stopping, exiting) may hand over a kernel still
		 * running: no end time yet, nothing to count. */
		if (!k->start || k->end <= k->start)
			atomic_fetch_add(&incomplete, 1);
		else
			emit_kernel(k);
	} else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
		const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;

		emit_copy(m->start, m->end, m->bytes, m->correlationId, m->deviceId,
			  m->contextId, m->streamId, m->copyKind, 0);
	} else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
		const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;

		emit_copy(m->start, m->end, m->bytes, m->correlationId, m->deviceId,
			  m->contextId, m->streamId, 0, 1);
	}
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
	*buffer = aligned_alloc(ALIGN, BUFFER_BYTES);
	*size = *buffer ? BUFFER_BYTES : 0;
	*max_records = 0;
}

/* Completed buffers wait here for drain_buffers(): CUPTI calls
 * buffer_completed inside its own flush (and from its thread when buffers
 * fill), where the probes' cost would hold up whatever CUPTI holds. */
struct done_buffer {
	struct done_buffer *next;
	uint8_t *buffer;
	size_t valid;
};
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static struct done_buffer *queue_head, **queue_tail = &queue_head;

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
				      size_t size, size_t valid)
{
	struct done_buffer *d = malloc(sizeof(*d));
	size_t lost = 0;

	(void)size;
	if (cuptiActivityGetNumDroppedRecords(ctx, stream, &lost) == CUPTI_SUCCESS && lost)
		atomic_fetch_add(&dropped, lost);
	if (!d) {
		free(buffer);
		return;
	}
	*d = (struct done_buffer){NULL, buffer, valid};
	pthread_mutex_lock(&queue_lock);
	*queue_tail = d;
	queue_tail = &d->next;
	pthread_mutex_unlock(&queue_lock);
}

/* Hand the queued buffers' records to the probes (the poller, or exit). */
static void drain_buffers(void)
{
	struct done_buffer *d, *next;
	CUpti_Activity *r;

	pthread_mutex_lock(&queue_lock);
	d = queue_head;
	queue_head = NULL;
	queue_tail = &queue_head;
	pthread_mutex_unlock(&queue_lock);
	for (; d; d = next) {
		next = d->next;
		r = NULL;
		while (cuptiActivityGetNextRecord(d->buffer, d->valid, &r) == CUPTI_SUCCESS)
			emit(r);
		flush_batch();
		free(d->buffer);
		free(d);
	}
}

/* The launch probe fires once per probed launch, on the launching thread,
 * with both correlation ids a kernel record may carry: a runtime launch's
 * (kept here from its entry) and the driver's; a driver launch called
 * directly has runtime id 0. */
static __thread uint32_t runtime_corr, driver_corr;
static __thread const char *runtime_symbol;  /* the runtime launch's kernel name */
static __thread int in_runtime_launch, runtime_copy;
/* Collection sessions: a thread inside a launch when collection stopped never
 * saw its exit; its nesting count is from an older session and starts over. */
static atomic_uint session;
static __thread unsigned thread_session;

static __thread uint64_t rng_state;
static __thread unsigned every = 1, in_burst, burst_poll;
static __thread uint64_t burst_start_ns;
static atomic_uint polls;  /* a thread idle for a poll period re-adapts at its next launch */

/* xorshift64: a per-thread draw for the sampling, a few ns. */
static uint64_t draw(void)
{
	uint64_t x = rng_state;

	if (!x)
		x = (uint64_t)(uintptr_t)&rng_state ^ mono_ns() ^ 0x9e3779b97f4a7c15ull;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	rng_state = x;
	return x;
}

static void mark(uint32_t id, unsigned char left_out)
{
	if (id)
		atomic_store_explicit(&skipped[id % SKIP_SLOTS], left_out, memory_order_relaxed);
}

/* After each BURST launches of this thread: 1 in how many to probe, from the
 * launches' rate since the last time. At its first launch after a pause (two
 * polls since: at least a poll period) a burst starts whole again, as the
 * header says: the last burst's rate would otherwise leave out launches of a
 * burst shorter than BURST (a few dozen launches in a few ms, a pause in which
 * two polls fell, and the next few dozen were sampled at that rate). */
static void adapt_sampling(int pause)
{
	uint64_t now = mono_ns(), dt = now - burst_start_ns;

	if (fixed_every) {
		every = fixed_every;
	} else {
		every = 1;
		while (!pause && burst_start_ns && every < (1u << 16) &&
		       (uint64_t)in_burst * 1000000000ull > (uint64_t)launch_rate * every * dt)
			every <<= 1;
	}
	in_burst = 0;
	burst_start_ns = now;
	burst_poll = atomic_load_explicit(&polls, memory_order_relaxed);
}

/* Whether this launch is probed: decided when it begins, so that the ids are
 * marked before the GPU can have run the kernel. */
static __thread unsigned char left_out_now, fired;

static void decide(void)
{
	if (atomic_load_explicit(&polls, memory_order_relaxed) - burst_poll > 1)
		adapt_sampling(1);
	else if (in_burst == BURST)
		adapt_sampling(0);
	in_burst++;
	left_out_now = every > 1 && (draw() & (every - 1)) != 0;
	fired = 0;
	atomic_fetch_add(&launches, 1);
}

/* The kernel's name hash (as its record's name_hash), per name pointer: a
 * launch callback's symbolName points into the driver's function, the same
 * string at every launch of it, so a probed launch hashes a name once. */
#define NAME_SLOTS 64
static __thread struct {
	const char *name;
	uint64_t hash;
} names[NAME_SLOTS];

static uint64_t kernel_hash(const char *name)
{
	unsigned slot;

	if (!name)
		return 0;
	slot = (unsigned)(((uintptr_t)name >> 4) % NAME_SLOTS);
	if (names[slot].name != name) {
		names[slot].hash = fnv1a(name);
		names[slot].name = name;
	}
	return names[slot].hash;
}

static void fire_launch(uint32_t runtime, uint32_t driver, const char *symbol, int copy)
{
	fired = 1;
	if (!left_out_now && gfxcupti_launch_semaphore) {
		uint32_t weight = every;
		uint64_t kernel = copy ? GFX_CUPTI_COPY_LAUNCH : kernel_hash(symbol);

		/* register operands, not TLS ones readers cannot take */
		__asm__("" : "+r"(weight), "+r"(kernel));
		STAP_PROBE4(gfxcupti, launch, runtime, driver, weight, kernel);
	}
}

/* GFX_CUPTI_DEPTH (a diagnostic): once per launch function, how far below
 * the driver API's parameters (in the driver's own frame) CUPTI calls this
 * callback, and how far the thread's stack reaches above it: what a stack
 * copy taken at the launch probe must span to reach the thread's first frame. */
static void say_depth(const CUpti_CallbackData *cb, CUpti_CallbackId cbid)
{
	static _Atomic uint64_t said[16];  /* a bit per callback id below 1024 */
	uintptr_t here = (uintptr_t)__builtin_frame_address(0), params = (uintptr_t)cb->functionParams;
	uintptr_t top = 0;
	pthread_attr_t attr;
	void *low;
	size_t size;
	uint64_t bit = 1ull << (cbid % 64);

	if (cbid < 1024 && (atomic_fetch_or(&said[cbid / 64], bit) & bit))
		return;
	if (pthread_getattr_np(pthread_self(), &attr) == 0) {
		if (pthread_attr_getstack(&attr, &low, &size) == 0)
			top = (uintptr_t)low + size;
		pthread_attr_destroy(&attr);
	}
	fprintf(stderr, "gfxcupti: depth: %s: callback %ld bytes below the driver's parameters, "
		"%ld below the stack's top\n", cb->functionName ? cb->functionName : "?",
		(long)(params - here), top ? (long)(top - here) : -1L);
}

/* Which API callbacks make a copy or a memset: found by name once, from
 * CUPTI's own table (cuptiGetCallbackName), so that every variant (_v2,
 * Async, _ptds, 2D, 3D, Peer, ToSymbol) of this header is in; should CUPTI
 * name none, the ones PyTorch calls. Their records carry a correlation id as
 * a kernel's do, and their launch probe joins the copy's device time to the
 * stack that asked for it. */
static unsigned char copy_driver[CUPTI_DRIVER_TRACE_CBID_SIZE];
static unsigned char copy_runtime[CUPTI_RUNTIME_TRACE_CBID_SIZE];
static unsigned copy_apis;  /* how many were found (gfx_cupti_copy_apis) */

static const CUpti_CallbackId fallback_driver[] = {
	CUPTI_DRIVER_TRACE_CBID_cuMemcpy, CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync,
	CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2,
	CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2,
	CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2, CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2,
	CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeer, CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync,
	CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2, CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2,
	CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async, CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async,
};

static const CUpti_CallbackId fallback_runtime[] = {
	CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020,
	CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyPeerAsync_v4000,
	CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020, CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020,
};

EXPORT unsigned gfx_cupti_copy_apis(void) { return copy_apis; }

static int named(CUpti_CallbackDomain domain, uint32_t cbid, const char *a, const char *b)
{
	const char *name = NULL;

	if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name)
		return 0;
	return !strncmp(name, a, strlen(a)) || !strncmp(name, b, strlen(b));
}

/* Once: afterwards copy_apis is never 0 (the fallback lists are not empty). */
static void find_copy_apis(void)
{
	if (copy_apis)
		return;
	for (uint32_t i = 1; i < COUNT(copy_driver); i++)
		copy_apis += copy_driver[i] =
			(unsigned char)named(CUPTI_CB_DOMAIN_DRIVER_API, i, "cuMemcpy", "cuMemset");
	for (uint32_t i = 1; i < COUNT(copy_runtime); i++)
		copy_apis += copy_runtime[i] = (unsigned char)named(CUPTI_CB_DOMAIN_RUNTIME_API, i,
								    "cudaMemcpy", "cudaMemset");
	if (copy_apis)
		return;
	for (size_t i = 0; i < COUNT(fallback_driver); i++, copy_apis++)
		copy_driver[fallback_driver[i]] = 1;
	for (size_t i = 0; i < COUNT(fallback_runtime); i++, copy_apis++)
		copy_runtime[fallback_runtime[i]] = 1;
}

static int is_copy(CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
	if (domain == CUPTI_CB_DOMAIN_DRIVER_API)
		return cbid < COUNT(copy_driver) && copy_driver[cbid];
	return cbid < COUNT(copy_runtime) && copy_runtime[cbid];
}

/* A runtime launch fires the probe when it calls the driver's launch (both
 * ids known, the kernel not yet queued), or at its exit if it called none; a
 * driver launch called directly fires at its entry. A copy or memset API
 * does the same, as a launch of GFX_CUPTI_COPY_LAUNCH. */
static void CUPTIAPI on_api(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
			    const void *data)
{
	const CUpti_CallbackData *cb = data;
	int enter = cb->callbackSite == CUPTI_API_ENTER, copy = is_copy(domain, cbid);

	(void)userdata;
	if (thread_session != atomic_load(&session)) {
		thread_session = atomic_load(&session);
		in_runtime_launch = 0;
		in_burst = 0;  /* the sampling starts over too */
		burst_start_ns = 0;
		every = fixed_every ? fixed_every : 1;
	}
	if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
		if (enter) {
			if (in_runtime_launch++ == 0)
				decide();
			runtime_corr = cb->correlationId;
			runtime_symbol = cb->symbolName;
			runtime_copy = copy;
			driver_corr = 0;
			mark(runtime_corr, left_out_now);
		} else if (in_runtime_launch > 0 && --in_runtime_launch == 0 && !fired) {
			fire_launch(runtime_corr, driver_corr, runtime_symbol, runtime_copy);
		}
	} else if (domain == CUPTI_CB_DOMAIN_DRIVER_API && enter) {
		if (report_depth)
			say_depth(cb, cbid);
		if (!in_runtime_launch)
			decide();
		mark(cb->correlationId, left_out_now);
		if (!in_runtime_launch)
			fire_launch(0, cb->correlationId, cb->symbolName, copy);
		else if (!fired)
			fire_launch(runtime_corr, driver_corr = cb->correlationId, cb->symbolName,
				    runtime_copy);
	}
}

static const CUpti_CallbackId runtime_launches[] = {
	CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
	CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
	CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
	CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
	CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
	CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000,
	CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000,
};

static const CUpti_CallbackId driver_launches[] = {
	CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
	CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
	CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
	CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
	CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
	CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
	CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
	CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
};

static const CUpti_ActivityKind kinds[] = {
	CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
};

/* CUPTI's launch callbacks and activity records on or off (the subscription stays). */
static void set_active(int on)
{
	if (!no_callbacks) {
		for (size_t i = 0; i < COUNT(runtime_launches); i++)
			cuptiEnableCallback(on, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
					    runtime_launches[i]);
		for (size_t i = 0; i < COUNT(driver_launches); i++)
			cuptiEnableCallback(on, subscriber, CUPTI_CB_DOMAIN_DRIVER_API,
					    driver_launches[i]);
		find_copy_apis();
		for (uint32_t i = 0; i < COUNT(copy_runtime); i++)
			if (copy_runtime[i])
				cuptiEnableCallback(on, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, i);
		for (uint32_t i = 0; i < COUNT(copy_driver); i++)
			if (copy_driver[i])
				cuptiEnableCallback(on, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, i);
	}
	for (size_t i = 0; i < COUNT(kinds) && !no_activity; i++)
		(on ? cuptiActivityEnable : cuptiActivityDisable)(kinds[i]);
	if (on)  /* a launch cut off by the last switch: threads start their state over */
		atomic_fetch_add(&session, 1);
	duty_active = on;
}

/* gfxcupti:refused: the subscription's result, at each refused try and at
 * the first success after one (0), so the listener learns it too. */
static void tell_refused(CUptiResult r)
{
	if (gfxcupti_refused_semaphore && (r != CUPTI_SUCCESS || refused)) {
		int32_t result = (int32_t)r;
		uint32_t period = (uint32_t)poll_ms;

		__asm__("" : "+r"(result), "+r"(period));  /* register operands for the probe */
		STAP_PROBE2(gfxcupti, refused, result, period);
	}
	refused = r != CUPTI_SUCCESS;
}

static void start_collecting(void)
{
	const char *why = NULL;
	CUptiResult r = cuptiSubscribe(&subscriber, (CUpti_CallbackFunc)on_api, NULL);

	tell_refused(r);
	if (r != CUPTI_SUCCESS) {
		atomic_fetch_add(&refusals, 1);
		if (!warned) {
			cuptiGetResultString(r, &why);
			fprintf(stderr, "gfxcupti: not collecting GPU activity: another CUPTI client "
					"(a profiler) holds CUPTI (%s); retrying while probes are attached\n",
				why ? why : "?");
			warned = 1;
		}
		return;
	}
	atomic_fetch_add(&session, 1);
	for (size_t i = 0; i < SKIP_SLOTS; i++)
		atomic_store_explicit(&skipped[i], 0, memory_order_relaxed);
	calibrate();
	cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
	set_active(1);
	__atomic_store_n(&collecting, 1, __ATOMIC_RELAXED);
}

/* GFX_CUPTI_DUTY: on or off by the clock, while collecting (the poller's thread). */
static void duty_step(void)
{
	int on;

	pthread_mutex_lock(&lock);
	on = (mono_ns() / 1000000) % duty_period_ms < duty_on_ms;
	if (collecting && on != duty_active)
		set_active(on);
	pthread_mutex_unlock(&lock);
}

static void stop_collecting(void)
{
	for (size_t i = 0; i < COUNT(kinds); i++)
		cuptiActivityDisable(kinds[i]);
	cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
	drain_buffers();  /* no probe attached any more: frees them */
	cuptiUnsubscribe(subscriber);
	__atomic_store_n(&collecting, 0, __ATOMIC_RELAXED);
}

/* One poll: follow the semaphores, and while collecting hand over what is done. */
EXPORT void gfx_cupti_poll(void)
{
	int want = always || listened();

	atomic_fetch_add_explicit(&polls, 1, memory_order_relaxed);
	pthread_mutex_lock(&lock);
	if (want && !collecting)
		start_collecting();
	else if (!want && collecting)
		stop_collecting();
	if (collecting) {
		calibrate();
		cuptiActivityFlushAll(0);
		drain_buffers();
	}
	pthread_mutex_unlock(&lock);
}

static void *poller(void *arg)
{
	long ms = poll_ms;  /* set before this thread starts */
	struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};

	struct timespec step = {0, 1000000L};

	(void)arg;
	if (duty_period_ms)  /* the duty cycle's switches by the millisecond, polls as before */
		for (long t = 0;; t++) {
			if (t % ms == 0)
				gfx_cupti_poll();
			duty_step();
			nanosleep(&step, NULL);
		}
	for (;;) {
		gfx_cupti_poll();
		nanosleep(&pause, NULL);
	}
	return NULL;
}

/* At exit, the records still in CUPTI's buffers reach the probes. */
static void flush_at_exit(void)
{
	pthread_mutex_lock(&lock);
	if (collecting) {
		cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
		drain_buffers();
	}
	pthread_mutex_unlock(&lock);
}

EXPORT int InitializeInjection(void)
{
	static int done;
	const char *env;
	long ms;
	pthread_t thread;
	pthread_attr_t attr;

	if (__atomic_exchange_n(&done, 1, __ATOMIC_SEQ_CST))
		return 1;
	always = getenv("GFX_CUPTI_ALWAYS") != NULL;
	no_callbacks = getenv("GFX_CUPTI_NO_CALLBACKS") != NULL;
	no_activity = getenv("GFX_CUPTI_NO_ACTIVITY") != NULL;
	report_depth = getenv("GFX_CUPTI_DEPTH") != NULL;
	env = getenv("GFX_CUPTI_LAUNCH_EVERY");
	if (env)  /* rounded up to a power of two; 1: every launch, always */
		for (fixed_every = 1; fixed_every < strtoul(env, NULL, 10) && fixed_every < (1u << 16);)
			fixed_every <<= 1;
	env = getenv("GFX_CUPTI_LAUNCH_RATE");
	if (env && strtoul(env, NULL, 10) > 0)
		launch_rate = (unsigned)strtoul(env, NULL, 10);
	env = getenv("GFX_CUPTI_DUTY");
	if (env && sscanf(env, "%u/%u", &duty_on_ms, &duty_period_ms) != 2)
		duty_period_ms = 0;
	if (duty_on_ms >= duty_period_ms)
		duty_period_ms = 0;  /* always on */
	env = getenv("GFX_CUPTI_POLL_MS");
	ms = env ? strtol(env, NULL, 10) : 100;
	if (ms < 1 || ms > 10000)
		ms = 100;
	poll_ms = ms;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&thread, &attr, poller, NULL)) {
		fprintf(stderr, "gfxcupti: cannot start its thread; collecting nothing\n");
		return 1;  /* the program runs on untouched */
	}
	pthread_setname_np(thread, "gfxcupti");
	atexit(flush_at_exit);
	return 1;
}
