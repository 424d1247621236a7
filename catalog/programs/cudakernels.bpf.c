// SPDX-License-Identifier: GPL-2.0
/*
 * cudakernels: the GPU's own time per CUDA kernel, joined to the stack that
 * launched it. The data come from gfxbpf's CUPTI injection library
 * (gpu/cupti/inject.c, loaded with CUDA_INJECTION64_PATH) through its USDT
 * probes (records in gfx_cupti.h); attaching raises their semaphores, which
 * is what makes the library collect at all.
 *
 * gfxcupti:launch(runtime id, driver id, weight, kernel) fires on the
 * launching thread, for every launch or, when launches come fast, for 1 in
 * `weight` drawn at random by the library (gfx_cupti.h). In scope self it
 * walks the Python frames there (gfx_python.h), remembers the chain's hash
 * and the stack pointer under (tgid, correlation id) for each id, counts the
 * launch per (tgid, chain, kernel name hash, stack pointer) and, when that
 * count reaches a power of two, sends the Python record and a stack copy
 * (gfx_udeep.h, the name hash in its `elapsed`) that the client unwinds into
 * the native launch stack, as ustackcopy does for a uprobe. Why the kernel
 * and the stack pointer: one Python line (or a thread with none, such as
 * autograd's) launches one kernel through different native paths, and the
 * depth of the stack at the probe tells those paths apart where the 1 KiB
 * ustackcopy hashes cannot (they differ 10-70 KiB up, above cuBLAS's frames);
 * a path met on two threads is two rows that the client joins by the path
 * its copies unwind to. gfxcupti:kernels(records, n) fires later,
 * from the library's thread, once per batch of kernels the GPU ran; for each
 * record it takes the launch's chain and stack pointer by correlation id and
 * adds one kernel and its device nanoseconds (end - start) to the row (tgid,
 * uid, chain, name hash, weight, stack pointer), and keeps the name once per
 * hash. Rows hold exact counts of what
 * they saw; a row's weight scales them into an estimate for its chain. The
 * kernels of launches the library left out go to rows flagged ROW_NOT_SAMPLED
 * (chain 0, weight 0): per kernel name, all rows together are exact. Copies (memcpy, memset) count per
 * (tgid, uid, kind) with bytes and device time; in scope self also per launch
 * (`copy_stacks`, as `kernels` with the kind for the name): the library fires
 * the launch probe for a copy or memset API too, with kernel
 * GFX_CUPTI_COPY_LAUNCH, so its stack copy joins the copy's row. gfxcupti:refused, at each of
 * the library's polls while another CUPTI client keeps it from collecting,
 * counts in `refused` per process, so the client can say why nothing comes.
 *
 * Scope system (target_uid GFX_ANY): no Python walk, no stack copy and no
 * stack pointer (those read or reveal process memory); rows per process and
 * user, chain 0.
 */
/* 4 MiB: a training step's first pass makes a few hundred rows in milliseconds,
 * each sending a copy of up to 72 KiB; 2 MiB lost 35 of them on an H200. */
#define GFX_UREC_RING_BYTES (4 << 20)
/* Launch copies go straight into the ring (gfx_udeep.h): up to 72 KiB
 * reaches past cuBLASLt's 68-70 KiB to the Python that launched. */
#define GFX_DEEP_COPY_MAX 73728
#define GFX_PY_CODES 512
/* A launch from a thread with no Python frame (autograd's) takes the main
 * thread's, marked as such (gfx_python.h). */
#define GFX_PY_BORROW_MAIN 1
#include "gfx_tree.h"
#include "gfx_pychain.h"
#include "gfx_udeep.h"
#include "gfx_cupti.h"
#include <linux/ptrace.h>
#include <stdbool.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

/* Rows are (process, Python chain, kernel, launch path): a training loop has some hundreds.
 * Sized so that many attachments fit a user's map budget (tests/unit/test_budget.py). */
#define MAX_ROWS 4096
#define MAX_NAMES 1024
#define MAX_PENDING 65536
#define ROW_LAUNCHED 1     /* kernel_key.flags: the launch was seen (its chain is known) */
#define ROW_NOT_SAMPLED 2  /* its launch was left out by the library's sampling */

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;

GFX_TREE_PROGRAMS(target_pid)

struct kernel_key {
	__u32 tgid;
	__u32 uid;
	__u64 python;     /* hash of the launch's Python chain (0: none or system scope) */
	__u64 name_hash;  /* FNV-1a 64 of the kernel's name (gfx_cupti.h) */
	__u32 flags;      /* ROW_LAUNCHED, ROW_NOT_SAMPLED */
	__u32 weight;     /* launches each sampled one stands for (ROW_LAUNCHED rows) */
	__u64 sp;         /* the stack pointer at the launch probe: its native path (0: none) */
};

/* What a launch left for its kernel's record. */
struct launch_seen {
	__u64 python;
	__u32 weight;
	__u32 pad;
	__u64 sp;
};

struct kernel_stats {
	__u64 kernels;
	__u64 device_ns;
};

struct launch_key {
	__u32 tgid;
	__u32 correlation_id;
};

struct chain_key {
	__u32 tgid;
	__u32 pad;
	__u64 python;
	__u64 kernel;  /* the kernel's name hash (0: not known) */
	__u64 sp;      /* the stack pointer at the probe */
};

struct copy_key {
	__u32 tgid;
	__u32 uid;
	__u32 kind;  /* memcpy: CUpti_ActivityMemcpyKind; memset: 0x100 */
	__u32 pad;
};

struct copy_stats {
	__u64 copies;
	__u64 bytes;
	__u64 device_ns;
};

/* A copy's row by its launch, as kernel_key with the kind for the name. */
struct copy_stack_key {
	__u32 tgid;
	__u32 uid;
	__u32 kind;    /* as copy_key's */
	__u32 flags;   /* ROW_LAUNCHED, ROW_NOT_SAMPLED */
	__u64 python;
	__u64 sp;
	__u32 weight;
	__u32 pad;
};

struct kernel_name {
	char name[GFX_CUPTI_NAME_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ROWS);
	__type(key, struct kernel_key);
	__type(value, struct kernel_stats);
} kernels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_NAMES);
	__type(key, __u64);
	__type(value, struct kernel_name);
} names SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct copy_key);
	__type(value, struct copy_stats);
} copies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct copy_stack_key);
	__type(value, struct copy_stats);
} copy_stacks SEC(".maps");

/* The name being copied (too large for the BPF stack): one per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kernel_name);
} name_scratch SEC(".maps");

/* (tgid, correlation id) -> the launch's chain hash and weight, until its kernel record comes */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_PENDING);
	__type(key, struct launch_key);
	__type(value, struct launch_seen);
} pending SEC(".maps");

/* (tgid, chain, kernel, sp) -> launches, which picks the launches that send a stack copy */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_ROWS);
	__type(key, struct chain_key);
	__type(value, __u64);
} launches SEC(".maps");

static __always_inline int in_scope(void)
{
	return gfx_tree_ok(target_pid) && gfx_task_ok(target_uid);
}

/* Count a launch under its chain; true when the count is a power of two. */
static __always_inline int count_launch(struct chain_key *ck)
{
	__u64 one = 1, *n, v;

	n = bpf_map_lookup_elem(&launches, ck);
	if (!n) {
		bpf_map_update_elem(&launches, ck, &one, BPF_NOEXIST);
		return 1;
	}
	v = __sync_fetch_and_add(n, 1) + 1;
	return (v & (v - 1)) == 0;
}

/* The launch's stack copy, as ustackcopy sends one (entry_ns joins the
 * Python record; `elapsed` carries the kernel's name hash, as ustackcopy's
 * carries its path hash). */
static __always_inline void send_copy(struct pt_regs *ctx, struct py_rec *py, __u64 python,
				      __u64 kernel)
{
	__u32 zero = 0;
	struct ustack_rec *r;
	__u64 ts = bpf_ktime_get_ns();

	if (py && python) {
		py->ts = ts;
		if (!gfx_py_send(&stack_copies, py))
			gfx_count(&lost, &zero, 1);
	}
	r = gfx_urec_start(0);
	if (!r)
		return;
	r->ip = ctx->rip;
	r->sp = ctx->rsp;
	r->bp = ctx->rbp;
	r->entry_ns = ts;
	r->elapsed = kernel;
	gfx_udeep_send(r);
}

/* Remember the launch's chain under both ids: the kernel's record names one
 * (the other entry ages out of the LRU map). */
SEC("usdt")
int BPF_USDT(cupti_launch, __u32 runtime_id, __u32 driver_id, __u32 weight, __u64 kernel)
{
	struct launch_seen seen = {.weight = weight ? weight : 1};
	struct launch_key lk = {};
	struct chain_key ck = {};
	struct py_rec *py = 0;
	__u64 python = 0;

	if (!in_scope())
		return 0;
	lk.tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
	if (target_uid != GFX_ANY) {  /* scope self: the caller's own process memory */
		py = gfx_py_record();
		if (py && gfx_py_walk(py))
			python = gfx_py_chain_hash(py);
		seen.sp = ctx->rsp;
	}
	seen.python = python;
	if (runtime_id) {
		lk.correlation_id = runtime_id;
		bpf_map_update_elem(&pending, &lk, &seen, BPF_ANY);
	}
	if (driver_id) {
		lk.correlation_id = driver_id;
		bpf_map_update_elem(&pending, &lk, &seen, BPF_ANY);
	}
	if (target_uid == GFX_ANY)
		return 0;
	ck.tgid = lk.tgid;
	ck.python = python;
	ck.kernel = kernel;
	ck.sp = seen.sp;
	if (count_launch(&ck))
		send_copy(ctx, py, python, kernel);
	return 0;
}

/* A new row's name, if its hash has none yet. */
static __always_inline void keep_name(__u64 hash, const char *name)
{
	struct kernel_name *slot;
	__u32 zero = 0;

	if (bpf_map_lookup_elem(&names, &hash))
		return;
	slot = bpf_map_lookup_elem(&name_scratch, &zero);
	if (!slot)
		return;
	if (bpf_probe_read_user_str(slot->name, sizeof(slot->name), name) < 0)
		slot->name[0] = 0;
	bpf_map_update_elem(&names, &hash, slot, BPF_NOEXIST);
}

/* One kernel record of a batch, at address rec in the library. A global
 * function: the verifier checks it once, not once per record of the loop below
 * (the broker's audit allows no bpf_loop). */
__attribute__((noinline)) int count_kernel(__u64 at, __u32 tgid, __u32 uid)
{
	struct kernel_stats first = {}, *st;
	struct gfx_cupti_kernel rec;
	struct kernel_key key = {};
	struct launch_key lk = {};
	struct launch_seen *seen;
	__u32 one = 1;
	__u64 ns;

	if (bpf_probe_read_user(&rec, sizeof(rec), (const void *)at))
		return -1;
	key.tgid = lk.tgid = tgid;
	key.uid = uid;
	key.name_hash = rec.name_hash;
	lk.correlation_id = rec.correlation_id;
	seen = bpf_map_lookup_elem(&pending, &lk);
	if (seen) {
		key.python = seen->python;
		key.weight = seen->weight;
		key.sp = seen->sp;
		key.flags = ROW_LAUNCHED;
		bpf_map_delete_elem(&pending, &lk);
	} else if (rec.flags & GFX_CUPTI_NOT_SAMPLED) {
		key.flags = ROW_NOT_SAMPLED;
	}
	ns = rec.end_ns > rec.start_ns ? rec.end_ns - rec.start_ns : 0;
	st = bpf_map_lookup_elem(&kernels, &key);
	if (!st) {
		first.kernels = 1;
		first.device_ns = ns;
		if (bpf_map_update_elem(&kernels, &key, &first, BPF_NOEXIST) == 0) {
			keep_name(key.name_hash, (const char *)rec.name);
			return 0;
		}
		st = bpf_map_lookup_elem(&kernels, &key);  /* another CPU made it */
		if (!st) {
			gfx_count(&lost, &one, 1);  /* the table is full */
			return 0;
		}
	}
	__sync_fetch_and_add(&st->kernels, 1);
	__sync_fetch_and_add(&st->device_ns, ns);
	return 0;
}

/* Up to GFX_CUPTI_BATCH kernel records per probe: one uprobe for the batch. */
SEC("usdt")
int BPF_USDT(cupti_kernels, __u64 recs, __u32 n)
{
	__u32 tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
	__u32 uid = (__u32)bpf_get_current_uid_gid();

	if (!in_scope())
		return 0;
	for (__u32 i = 0; i < GFX_CUPTI_BATCH && i < n; i++)
		if (count_kernel(recs + (__u64)i * sizeof(struct gfx_cupti_kernel), tgid, uid) < 0)
			break;  /* the array is gone */
	return 0;
}

/* Add one copy to a row of `copies` or `copy_stacks`. */
static __always_inline void add_copy(void *map, void *key, __u64 bytes, __u64 ns)
{
	struct copy_stats first = {.copies = 1, .bytes = bytes, .device_ns = ns}, *st;

	st = bpf_map_lookup_elem(map, key);
	if (!st) {
		if (bpf_map_update_elem(map, key, &first, BPF_NOEXIST) == 0)
			return;
		st = bpf_map_lookup_elem(map, key);  /* another CPU made it, or it is full */
		if (!st)
			return;
	}
	__sync_fetch_and_add(&st->copies, 1);
	__sync_fetch_and_add(&st->bytes, bytes);
	__sync_fetch_and_add(&st->device_ns, ns);
}

/* A copy's row by its launch (scope self): the launch probe's chain, as a
 * kernel's. Its pending entry stays (the LRU ages it out): a runtime copy may
 * make more than one record under its id. */
static __always_inline void count_copy_stack(struct gfx_cupti_copy *rec, struct copy_key *key,
					     __u64 ns)
{
	struct copy_stack_key sk = {.tgid = key->tgid, .uid = key->uid, .kind = key->kind};
	struct launch_key lk = {.tgid = key->tgid, .correlation_id = rec->correlation_id};
	struct launch_seen *seen = bpf_map_lookup_elem(&pending, &lk);

	if (seen) {
		sk.python = seen->python;
		sk.weight = seen->weight;
		sk.sp = seen->sp;
		sk.flags = ROW_LAUNCHED;
	} else if (rec->flags & GFX_CUPTI_NOT_SAMPLED) {
		sk.flags = ROW_NOT_SAMPLED;
	} else {
		return;  /* launched before the attach, or by a library without the probe */
	}
	add_copy(&copy_stacks, &sk, rec->bytes, ns);
}

static __always_inline int count_copy(void *record, __u32 set)
{
	struct gfx_cupti_copy rec;
	struct copy_key key = {};
	__u64 ns;

	if (!in_scope() || bpf_probe_read_user(&rec, sizeof(rec), record))
		return 0;
	key.tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
	key.uid = (__u32)bpf_get_current_uid_gid();
	key.kind = set ? 0x100 : (rec.kind & 0xff);
	ns = rec.end_ns > rec.start_ns ? rec.end_ns - rec.start_ns : 0;
	add_copy(&copies, &key, rec.bytes, ns);
	if (target_uid != GFX_ANY)
		count_copy_stack(&rec, &key, ns);
	return 0;
}

SEC("usdt")
int BPF_USDT(cupti_memcpy, void *record)
{
	return count_copy(record, 0);
}

SEC("usdt")
int BPF_USDT(cupti_memset, void *record)
{
	return count_copy(record, 1);
}

/* Why a process's library collects nothing: another CUPTI client holds CUPTI. */
struct refusal {
	__u64 polls;    /* polls refused while attached */
	__u64 last_ns;  /* the last try (CLOCK_MONOTONIC): a current refusal is recent */
	__s32 result;   /* its CUptiResult: 0, it subscribed at last (collects now) */
	__u32 poll_ms;  /* the library's poll period */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);  /* tgid */
	__type(value, struct refusal);
} refused SEC(".maps");

SEC("usdt")
int BPF_USDT(cupti_refused, __s32 result, __u32 poll_ms)
{
	__u32 tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
	struct refusal first = {.polls = 1, .result = result, .poll_ms = poll_ms}, *r;

	if (!in_scope())
		return 0;
	first.last_ns = bpf_ktime_get_ns();
	r = bpf_map_lookup_elem(&refused, &tgid);
	if (!r) {
		if (result)  /* 0: subscribed after refusals this program never saw */
			bpf_map_update_elem(&refused, &tgid, &first, BPF_NOEXIST);
		return 0;
	}
	if (result)
		__sync_fetch_and_add(&r->polls, 1);
	r->last_ns = first.last_ns;
	r->result = result;
	r->poll_ms = poll_ms;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
