// SPDX-License-Identifier: GPL-2.0
/*
 * cuda: kernel launches, memory copies, allocations and synchronization of
 * the CUDA driver API (libcuda) in the caller's own processes.
 *
 * The broker attaches cuda_entry (uprobe) and cuda_return (uretprobe) to
 * every function of the `cuda` table (catalog/cuda_api.py) that the library
 * defines. Each probe's bpf cookie says what to do:
 *   bits 0-7: the function's table index (keys the maps),
 *   bits 8-15: its role (ROLE_*), bits 16-23: the argument holding the
 *   byte count (copy, alloc) or the device pointer (free).
 * target_uid / target_pid are the caller's uid and a process the broker
 * verified they own.
 *
 * Device pointers (GPU virtual addresses) stay in the hidden dptr_size map;
 * client-visible maps hold counts, sizes and times only.
 *
 * Arguments are read from the x86-64 registers of the probed call.
 */
#include "gfx_tree.h"
#include "gfx_task.h"
#include "gfx_ucall.h"
#include "gfx_args.h"

#define MAX_FUNCTIONS 64
#define MAX_PROCESSES 64
#define MAX_ALLOCATIONS 65536

#define ROLE_LAUNCH 1
#define ROLE_COPY 2
#define ROLE_ALLOC 3
#define ROLE_FREE 4
#define ROLE_SYNC 5

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;
GFX_TREE_PROGRAMS(target_pid)

struct fn_key {
	__u32 tgid;
	__u32 function;
};

/* Device memory of one process, as its allocations and frees returned. */
struct cuda_memory {
	__u64 live;       /* bytes allocated and not yet freed */
	__u64 peak;       /* the most live bytes seen */
	__u64 allocs;     /* successful allocations */
	__u64 frees;      /* frees of an allocation seen here */
	__u64 untracked;  /* allocations not counted: dptr_size was full */
};

struct entry_val {
	__u64 ts;         /* first: gfx_entry_elapsed() reads it */
	__u64 bytes;      /* copy or allocation size */
	__u64 dptr_ptr;   /* alloc: where the driver writes the device pointer */
};

struct dptr_key {
	__u32 tgid;
	__u32 pad;
	__u64 dptr;
};

/* (process, function index) -> calls */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FUNCTIONS * MAX_PROCESSES);
	__type(key, struct fn_key);
	__type(value, __u64);
} calls SEC(".maps");

/* (process, function index) -> ns spent in the function (entry to return) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FUNCTIONS * MAX_PROCESSES);
	__type(key, struct fn_key);
	__type(value, __u64);
} time_ns SEC(".maps");

/* (process, copy function index) -> bytes copied by calls that succeeded */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FUNCTIONS * MAX_PROCESSES);
	__type(key, struct fn_key);
	__type(value, __u64);
} bytes SEC(".maps");

/* (process, function index) -> calls that returned an error (CUresult != 0) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FUNCTIONS * MAX_PROCESSES);
	__type(key, struct fn_key);
	__type(value, __u64);
} errors SEC(".maps");

/* (function index, log2(ns)) -> returns */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FUNCTIONS * GFX_SLOTS);
	__type(key, struct latency_key);
	__type(value, __u64);
} latency SEC(".maps");

/* process -> device memory */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PROCESSES);
	__type(key, __u32);
	__type(value, struct cuda_memory);
} memory SEC(".maps");

/* (thread, function) -> entry time and arguments; LRU: lost returns cannot fill it */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 10240);
	__type(key, struct entry_key);
	__type(value, struct entry_val);
} entries SEC(".maps");

/* (process, device pointer) -> allocation size; never shown to a client */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ALLOCATIONS);
	__type(key, struct dptr_key);
	__type(value, __u64);
} dptr_size SEC(".maps");

static __always_inline struct cuda_memory *memory_of(__u32 tgid)
{
	struct cuda_memory zero = {};

	return gfx_row(&memory, &tgid, &zero);
}

/* A free: forget the allocation and take its size off the live bytes. */
static __always_inline void on_free(__u32 tgid, __u64 dptr)
{
	struct dptr_key dk = { .tgid = tgid, .dptr = dptr };
	struct cuda_memory *m;
	__u64 *size, n;

	size = bpf_map_lookup_elem(&dptr_size, &dk);
	if (!size)
		return;  /* allocated before we attached, or never tracked */
	n = *size;
	if (bpf_map_delete_elem(&dptr_size, &dk))
		return;  /* another thread freed it first */
	m = memory_of(tgid);
	if (!m)
		return;
	__sync_fetch_and_add(&m->live, -n);
	__sync_fetch_and_add(&m->frees, 1);
}

/* An allocation returned: remember its size by device pointer, count it live. */
static __always_inline void on_alloc(__u32 tgid, struct entry_val *e)
{
	struct dptr_key dk = { .tgid = tgid };
	struct cuda_memory *m;
	__u64 size = e->bytes;

	if (bpf_probe_read_user(&dk.dptr, sizeof(dk.dptr), (void *)e->dptr_ptr))
		return;
	m = memory_of(tgid);
	if (!m)
		return;
	if (bpf_map_update_elem(&dptr_size, &dk, &size, BPF_ANY)) {
		__sync_fetch_and_add(&m->untracked, 1);
		return;  /* its free could not be matched: leave live alone */
	}
	__sync_fetch_and_add(&m->live, size);
	__sync_fetch_and_add(&m->allocs, 1);
	/* Two threads may race here; the peak can then miss one allocation. */
	if (m->live > m->peak)
		m->peak = m->live;
}

SEC("uprobe")
int cuda_entry(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 role = (cookie >> 8) & 0xff, arg = (cookie >> 16) & 0xff;
	__u64 id = bpf_get_current_pid_tgid();
	struct entry_val val = {};
	struct entry_key key;
	struct fn_key fk;

	if (!gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid))
		return 0;
	fk.tgid = id >> 32;
	fk.function = cookie & 0xff;
	if (fk.function >= MAX_FUNCTIONS)
		return 0;
	gfx_count(&calls, &fk, 1);
	if (role == ROLE_FREE) {
		on_free(fk.tgid, gfx_arg(ctx, arg));
	} else if (role == ROLE_COPY || role == ROLE_ALLOC) {
		val.bytes = gfx_arg(ctx, arg);
		if (role == ROLE_ALLOC)
			val.dptr_ptr = gfx_arg(ctx, 0);
	}
	gfx_entry_key(&key, fk.function);
	val.ts = bpf_ktime_get_ns();
	bpf_map_update_elem(&entries, &key, &val, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int cuda_return(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 role = (cookie >> 8) & 0xff;
	__u64 id = bpf_get_current_pid_tgid();
	struct entry_val *e;
	struct entry_key key;
	struct fn_key fk;
	__u64 delta;
	__u32 rc;

	if (!gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid))
		return 0;
	fk.tgid = id >> 32;
	fk.function = cookie & 0xff;
	if (fk.function >= MAX_FUNCTIONS)
		return 0;
	gfx_entry_key(&key, fk.function);
	e = gfx_entry_elapsed(&entries, &key, &delta);
	if (!e)
		return 0;  /* entered before we attached */
	rc = (__u32)gfx_ret(ctx);  /* CUresult; 0 is CUDA_SUCCESS */
	if (rc)
		gfx_count(&errors, &fk, 1);
	else if (role == ROLE_COPY)
		gfx_count(&bytes, &fk, e->bytes);
	else if (role == ROLE_ALLOC)
		on_alloc(fk.tgid, e);
	bpf_map_delete_elem(&entries, &key);
	gfx_count(&time_ns, &fk, delta);
	gfx_call_latency(&latency, fk.function, delta);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
