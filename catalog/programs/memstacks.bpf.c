// SPDX-License-Identifier: GPL-2.0
/*
 * memstacks: bytes allocated, and bytes still held, per allocating stack in
 * the caller's own processes: the C library's malloc family and anonymous
 * mmap, or the CUDA driver's device memory (gfxclient profile --memory).
 *
 * The broker attaches memstacks_entry (uprobe) and memstacks_return
 * (uretprobe) to every function of the `memory` table (catalog/memory_api.py)
 * that the library (the process's libc, or its libcuda) defines. Each probe's
 * bpf cookie: bits 0-7 the function's table index, 8-15 its role (ROLE_*),
 * 16-23 the argument holding the size (or the pointer freed), 24-31 the
 * address space (host memory, device pointers, device allocation handles).
 *
 * Rows are ustackcopy's (struct call_key: process, function, the return
 * address on top of the stack at entry, the hash of the Python chain, the
 * hash of the code addresses above the caller, gfx_pathhash.h), with bytes
 * instead of time: allocations through one shared caller (c10::alloc_cpu,
 * operator new) from different paths count apart. A row's 1st, 2nd, 4th ...
 * allocation sends a stack copy (gfx_ucopy.h, carrying the path hash) and
 * its Python record, which the client unwinds into the row's stack as it
 * does ustackcopy's. Each allocation's address is kept
 * in the hidden `blocks` map with its size and row, so a free (or a realloc,
 * or munmap of a whole mapping) takes its bytes off the row's live bytes in
 * the kernel.
 *
 * A call made inside a traced allocation on the same thread (the mmap that
 * malloc makes for a large block, malloc inside realloc(NULL, n)) is not
 * counted again: the outer call holds the thread's `inflight` slot, and the
 * inner one's stack pointer is below the outer one's.
 *
 * sample_bytes (0: every allocation): record about one allocation per that
 * many bytes allocated, as tcmalloc samples (sampled_weight); the sums stay
 * unbiased while the work per allocation not recorded is a subtraction.
 *
 * Scope self only: the copies are process memory.
 */
#define GFX_UREC_RING_BYTES (1 << 20)
#define GFX_PY_CODES 512
#include "gfx_tree.h"
#include "gfx_pychain.h"
#include "gfx_ucopy.h"
#include "gfx_pathhash.h"
#include "gfx_rows.h"
#include "gfx_args.h"
#include <linux/ptrace.h>

#define MAX_FUNCTIONS 64
#define MAX_ROWS 16384
#define MAX_BLOCKS 65536

/* Roles (catalog/function_tables.py ROLES) */
#define ROLE_ALLOC 3    /* the address is written through argument 0; 0 returned on success */
#define ROLE_FREE 4     /* argument `arg` is the address freed */
#define ROLE_MALLOC 6   /* argument `arg` is the size; the address is returned */
#define ROLE_CALLOC 7   /* arguments 0 and 1 are the count and the size */
#define ROLE_REALLOC 8  /* argument 0 is the old block, 1 the new size */
#define ROLE_MMAP 9     /* anonymous mappings only: argument 1 the length, 3 the flags */

#define GFX_MAP_ANONYMOUS 0x20

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;
const volatile __u64 sample_bytes = 0;

GFX_TREE_PROGRAMS(target_pid)

struct call_key {
	__u32 tgid;
	__u32 function;  /* index in the memory table */
	__u64 caller;    /* return address on top of the stack at entry (0: unreadable) */
	__u64 python;    /* hash of the Python chain at entry (0: none) */
	__u64 path;      /* hash of the code addresses above caller (gfx_pathhash.h; 0: unreadable) */
};

struct mem_row {
	__u64 allocs;  /* allocations recorded (at entry) */
	__u64 bytes;   /* bytes they allocated (sampled: their weight) */
	__u64 live;    /* of those, not freed yet */
	__u64 frees;   /* frees matched to this row */
	__u64 untracked;  /* allocations not in `blocks` (it was full): their frees unseen */
};

struct block_key {
	__u32 tgid;
	__u32 space;
	__u64 addr;
};

struct block {
	__u64 bytes;
	struct call_key row;
};

struct inflight {
	__u64 ts;
	__u64 sp;      /* the stack pointer at entry: a call below it is nested in this one */
	__u64 size;
	__u64 weight;  /* 0: not recorded (sampling) */
	__u64 out;     /* ROLE_ALLOC: where the address is written */
	__u64 old;     /* ROLE_REALLOC: the block it replaces */
	struct call_key key;
};

/* (process, function, caller, Python chain, path) -> bytes allocated and held */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ROWS);
	__type(key, struct call_key);
	__type(value, struct mem_row);
} sites SEC(".maps");

/* (process, space, address) -> bytes and row of a live allocation; never shown */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_BLOCKS);
	__type(key, struct block_key);
	__type(value, struct block);
} blocks SEC(".maps");

/* thread -> its allocation in flight; LRU so lost returns cannot fill it */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 10240);
	__type(key, __u32);
	__type(value, struct inflight);
} inflight SEC(".maps");

/* Rows created in `sites` (racy, as a row's count is): rows of one path stop
 * at half the table, so the rows of every path keep room. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} site_count SEC(".maps");

/* Bytes left before the next recorded allocation, per CPU (sampling only). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __s64);
} sample_left SEC(".maps");

/*
 * The weight this allocation is recorded with: its size, or under sampling
 * the sampling points it holds times the mean interval (0: not recorded).
 * The points are a renewal process over the bytes allocated on this CPU,
 * intervals uniform in [1, 2n - 1] (mean n; random, so no loop's period
 * aliases with them): an allocation of s bytes holds s / n of them on
 * average, wherever it falls, so the sums are unbiased. What is left of an
 * interval carries over to the next allocation.
 */
static __always_inline __u64 sampled_weight(__u64 size)
{
	__u64 n = sample_bytes, k = 0, more;
	__u32 zero = 0;
	__s64 *left;
	int i;

	if (!n)
		return size;
	left = bpf_map_lookup_elem(&sample_left, &zero);
	if (!left)
		return 0;
	*left -= (__s64)size;
	for (i = 0; i < 8 && *left <= 0; i++) {
		*left += 1 + (__s64)(bpf_get_prandom_u32() % (2 * n - 1));
		k++;
	}
	if (*left <= 0) {  /* a block of many intervals: the rest at their mean */
		more = 1 + (__u64)(-*left) / n;
		*left += (__s64)(more * n);
		k += more;
	}
	return k * n;
}

/* A free of addr: take its bytes off its row's live bytes. */
static __always_inline void on_free(__u32 tgid, __u32 space, __u64 addr)
{
	struct block_key bk = { .tgid = tgid, .space = space, .addr = addr };
	struct mem_row *row;
	struct block *b;
	struct call_key key;
	__u64 bytes;

	if (!addr)
		return;
	b = bpf_map_lookup_elem(&blocks, &bk);
	if (!b)
		return;  /* allocated before the attach, or not recorded */
	bytes = b->bytes;
	key = b->row;
	if (bpf_map_delete_elem(&blocks, &bk))
		return;  /* another thread freed it first */
	row = bpf_map_lookup_elem(&sites, &key);
	if (!row)
		return;
	__sync_fetch_and_add(&row->live, -bytes);
	__sync_fetch_and_add(&row->frees, 1);
}

/* gfx_row() on `sites`, counting the rows it creates in site_count (NULL:
 * the table is full). */
static __always_inline struct mem_row *site_row(const struct call_key *key,
						 const struct mem_row *zero)
{
	struct mem_row *row = bpf_map_lookup_elem(&sites, key);
	__u32 zero_key = 0;
	__u64 *created;

	if (row)
		return row;
	if (bpf_map_update_elem(&sites, key, zero, BPF_NOEXIST) == 0) {
		created = bpf_map_lookup_elem(&site_count, &zero_key);
		if (created)
			__sync_fetch_and_add(created, 1);
	}
	return bpf_map_lookup_elem(&sites, key);
}

/* Count a recorded allocation in its row; the row's count (0: no row). */
static __always_inline __u64 count_alloc(struct mem_row *row)
{
	if (!row)
		return 0;
	__sync_fetch_and_add(&row->allocs, 1);
	return row->allocs;  /* racy read: it only picks which calls send a copy */
}

/* Whether rows of one path may still be made: under half the table. */
static __always_inline int room_for_paths(void)
{
	__u32 zero_key = 0;
	__u64 *created = bpf_map_lookup_elem(&site_count, &zero_key);

	return created && *created < MAX_ROWS / 2;
}

/* The row of this call, counted; a stack copy when its count is a power of two. */
static __always_inline void record(struct pt_regs *ctx, struct inflight *v, __u32 function)
{
	struct mem_row zero_row = {}, *any, *row;
	struct ustack_rec *r;
	struct py_rec *py;
	__u32 one = 1, zero = 0;
	__u64 n;

	v->key.tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
	v->key.function = function;
	if (bpf_probe_read_user(&v->key.caller, sizeof(v->key.caller), (void *)ctx->rsp))
		v->key.caller = 0;
	py = gfx_py_record();
	if (py && gfx_py_walk(py))
		v->key.python = gfx_py_chain_hash(py);
	/* The caller's row of every path (path 0) first, empty. Rows of one path
	 * are made while the table is under half full: an allocator called from
	 * thousands of code paths (PyTorch's, through c10::alloc_cpu, from every
	 * line) would fill it, and later callers would find no room. Past that,
	 * no path is hashed (a 1 KiB read and a mapping lookup per code address,
	 * at every allocation) and the allocation counts in its caller's row of
	 * every path: its bytes kept, its paths shown merged. */
	row = any = site_row(&v->key, &zero_row);
	if (room_for_paths()) {
		v->key.path = path_hash_at(ctx->rsp);
		if (v->key.path)
			row = site_row(&v->key, &zero_row);
		if (!row) {
			v->key.path = 0;
			row = any;
		}
	}
	n = count_alloc(row);
	if (!n) {
		gfx_count(&lost, &one, 1);  /* the sites table is full */
		v->weight = 0;
		return;
	}
	if (n & (n - 1))
		return;
	if (py && v->key.python) {
		py->ts = v->ts;  /* the copy's entry_ns: the client joins the two by it */
		if (!gfx_py_send(&stack_copies, py))
			gfx_count(&lost, &zero, 1);
	}
	r = gfx_urec_start(0);
	if (!r)
		return;
	r->ip = ctx->rip;
	r->sp = ctx->rsp;
	r->bp = ctx->rbp;
	r->function = function;
	r->entry_ns = v->ts;
	r->elapsed = v->key.path;  /* no return record here: names the copy's row */
	gfx_urec_copy(r);
	gfx_urec_send(r);
}

static __always_inline int in_scope(__u32 function)
{
	return target_uid != GFX_ANY && gfx_tree_ok(target_pid) && gfx_task_ok(target_uid) &&
	       function < MAX_FUNCTIONS;
}

SEC("uprobe")
int memstacks_entry(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 function = cookie & 0xff, role = (cookie >> 8) & 0xff;
	__u32 arg = (cookie >> 16) & 0xff, space = (cookie >> 24) & 0xff;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct inflight v = {}, *busy;

	if (!in_scope(function))
		return 0;
	if (role == ROLE_FREE) {
		on_free((__u32)(bpf_get_current_pid_tgid() >> 32), space, gfx_arg(ctx, arg));
		return 0;
	}
	v.ts = bpf_ktime_get_ns();
	v.sp = ctx->rsp;
	busy = bpf_map_lookup_elem(&inflight, &tid);
	/* Deeper on the stack than the thread's call in flight: inside it, counted
	 * there. A slot whose return was never seen (an exec, a longjmp) is at or
	 * below the stack's top by now, and the next call replaces it. */
	if (busy && v.sp < busy->sp)
		return 0;
	if (role == ROLE_MMAP && !(gfx_arg(ctx, 3) & GFX_MAP_ANONYMOUS))
		return 0;  /* a file's pages: not allocated memory */
	if (role == ROLE_CALLOC) {
		v.size = gfx_arg(ctx, 0) * gfx_arg(ctx, 1);
	} else if (role == ROLE_REALLOC) {
		v.old = gfx_arg(ctx, 0);
		v.size = gfx_arg(ctx, 1);
	} else {
		v.size = gfx_arg(ctx, arg);
		if (role == ROLE_ALLOC)
			v.out = gfx_arg(ctx, 0);
	}
	v.key.function = function;  /* the return probe checks it is its call */
	v.weight = v.size ? sampled_weight(v.size) : 0;
	if (v.weight)
		record(ctx, &v, function);
	bpf_map_update_elem(&inflight, &tid, &v, BPF_ANY);
	return 0;
}

/* The address the allocation returned (0: it failed). */
static __always_inline __u64 returned(struct pt_regs *ctx, __u32 role, __u64 out)
{
	__u64 ret = gfx_ret(ctx), addr = 0;

	if (role == ROLE_ALLOC) {
		if ((__u32)ret || bpf_probe_read_user(&addr, sizeof(addr), (void *)out))
			return 0;
		return addr;
	}
	if (role == ROLE_MMAP && ret == (__u64)-1)
		return 0;  /* MAP_FAILED */
	return ret;
}

SEC("uretprobe")
int memstacks_return(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 function = cookie & 0xff, role = (cookie >> 8) & 0xff, space = (cookie >> 24) & 0xff;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct block b = {};
	struct block_key bk = {};
	struct inflight *in;
	struct mem_row *row;
	__u64 addr, old, size;

	if (!in_scope(function) || role == ROLE_FREE)
		return 0;
	in = bpf_map_lookup_elem(&inflight, &tid);
	if (!in || in->key.function != function)
		return 0;  /* entered before the attach, or a call nested in a traced one */
	b.bytes = in->weight;
	b.row = in->key;
	old = in->old;
	size = in->size;
	addr = returned(ctx, role, in->out);
	bpf_map_delete_elem(&inflight, &tid);
	if (role == ROLE_REALLOC && old && (addr || !size))
		on_free((__u32)(bpf_get_current_pid_tgid() >> 32), space, old);
	if (!addr || !b.bytes)
		return 0;
	row = bpf_map_lookup_elem(&sites, &b.row);
	if (!row)
		return 0;
	__sync_fetch_and_add(&row->bytes, b.bytes);
	bk.tgid = b.row.tgid;
	bk.space = space;
	bk.addr = addr;
	if (bpf_map_update_elem(&blocks, &bk, &b, BPF_ANY)) {
		__sync_fetch_and_add(&row->untracked, 1);  /* its free cannot be matched: not live */
		return 0;
	}
	__sync_fetch_and_add(&row->live, b.bytes);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
