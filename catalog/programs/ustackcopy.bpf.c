// SPDX-License-Identifier: GPL-2.0
/*
 * ustackcopy: calls of chosen functions in one of the caller's processes,
 * counted exactly per (function, calling return address), with stack copies
 * the client unwinds into complete calling stacks (no frame pointers needed).
 *
 * Attached like ustacks: a uprobe and a uretprobe per function, the
 * function's index as the bpf cookie. A burst of calls would overrun any
 * ring buffer if every call sent its stack, so the counts stay in the
 * kernel and a call sends its stack copy (gfx_ucopy.h) only when its row's
 * count reaches a power of two (1, 2, 4, ...): a few copies per row, more
 * for the rows that matter. Rows are keyed by the return address on top of
 * the stack at entry (the immediate caller) and a hash of the code
 * addresses in the stack's next bytes (gfx_pathhash.h), so calls through
 * one shared caller from different paths count apart; the copy carries
 * that hash (`elapsed`) to name its row. Paths that differ only above the
 * scanned bytes share a row, and the client, which unwinds each copy, says
 * so when a row's copies disagree instead of picking one path.
 *
 * In a CPython process registered in `py_files` (gfx_python.h) every call
 * walks the Python frames: the row key holds a hash of the chain (code
 * objects and instruction values), so a C function called from two Python
 * functions counts in two rows, and a copy is preceded by its Python record
 * (as stackcopy sends them).
 *
 * A row also holds the profile's start (`since`, written by the broker at
 * each attach): a warm instance (broker/sharing/warm.py) serves the same
 * user's next profile with rows of its own, counted from 1 again (the
 * visible table is frozen and cannot be emptied), and calls before the
 * broker wrote it are not counted.
 *
 * Scope self only: the copies are process memory.
 */
/* Copies only at powers of two of a row's count: 1 MiB of ring and 512 code
 * objects are plenty, and leave the budget room for the Python key. */
#define GFX_UREC_RING_BYTES (1 << 20)
#define GFX_PY_CODES 512
#include "gfx_tree.h"
#include "gfx_pychain.h"
#include "gfx_ucopy.h"
#include "gfx_pathhash.h"
#include "gfx_since.h"
#include <linux/ptrace.h>

#define MAX_FUNCTIONS 64
#define MAX_ROWS 16384

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;

GFX_TREE_PROGRAMS(target_pid)

struct call_key {
	__u32 tgid;
	__u32 function;  /* index in the `functions` parameter */
	__u64 caller;    /* return address on top of the stack at entry (0: unreadable) */
	__u64 python;    /* hash of the Python chain at entry (0: none) */
	__u64 path;      /* hash of the code addresses above caller (gfx_pathhash.h; 0: unreadable) */
	__u64 since;     /* the profile's start (gfx_since.h) */
};

#define GFX_CALL_ROWS MAX_ROWS
#include "gfx_callrows.h"

/* Count the call in its row; the row's count after it (0: the table is full). */
static __always_inline __u64 count_call(const struct call_key *key)
{
	struct call_stats first = {}, *st;

	st = bpf_map_lookup_elem(&calls, key);
	if (!st) {
		first.calls = 1;
		if (bpf_map_update_elem(&calls, key, &first, BPF_NOEXIST) == 0)
			return 1;
		st = bpf_map_lookup_elem(&calls, key);  /* another CPU created it */
		if (!st)
			return 0;
	}
	__sync_fetch_and_add(&st->calls, 1);
	return st->calls;  /* racy read: it only picks which calls send a copy */
}

SEC("uprobe")
int ustackcopy_entry(struct pt_regs *ctx)
{
	__u32 function = (__u32)bpf_get_attach_cookie(ctx);
	struct entry_val ev = {};
	struct ustack_rec *r;
	struct py_rec *py;
	struct entry_key ek;
	__u32 one = 1, zero = 0;
	__u64 n;

	if (target_uid == GFX_ANY || !gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid) ||
	    function >= MAX_FUNCTIONS)
		return 0;
	ev.key.since = gfx_since();
	if (!ev.key.since)
		return 0;  /* attached, the profile not begun */
	gfx_entry_key(&ek, function);
	ev.key.tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
	ev.key.function = function;
	if (bpf_probe_read_user(&ev.key.caller, sizeof(ev.key.caller), (void *)ctx->rsp))
		ev.key.caller = 0;
	ev.key.path = path_hash_at(ctx->rsp);
	py = gfx_py_record();
	if (py && gfx_py_walk(py))
		ev.key.python = gfx_py_chain_hash(py);
	n = count_call(&ev.key);
	if (!n)
		gfx_count(&lost, &one, 1);  /* the table is full: the call is not counted */
	ev.ts = bpf_ktime_get_ns();
	bpf_map_update_elem(&entry_ts, &ek, &ev, BPF_ANY);
	if (!n || (n & (n - 1)))
		return 0;
	if (py && ev.key.python) {
		py->ts = ev.ts;  /* the copy's entry_ns: the client joins the two by it */
		if (!gfx_py_send(&stack_copies, py))
			gfx_count(&lost, &zero, 1);
	}
	r = gfx_urec_start(0);
	if (!r)
		return 0;
	r->ip = ctx->rip;
	r->sp = ctx->rsp;
	r->bp = ctx->rbp;
	r->function = function;
	r->entry_ns = ev.ts;
	r->elapsed = ev.key.path;  /* unused at entry: names the copy's row */
	gfx_urec_copy(r);
	gfx_urec_send(r);
	return 0;
}

SEC("uretprobe")
int ustackcopy_return(struct pt_regs *ctx)
{
	__u32 function = (__u32)bpf_get_attach_cookie(ctx);

	if (target_uid == GFX_ANY || !gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid) ||
	    function >= MAX_FUNCTIONS)
		return 0;
	gfx_call_return(function);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
