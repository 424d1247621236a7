/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Stack copies for offline unwinding (profile, ustacks), as perf's
 * --call-graph dwarf takes them: the user registers and the top of the user
 * stack, from sp upward, go into the program's ring buffer `stack_copies`; the
 * client unwinds them with the call-frame information of the files its own
 * process maps (docs/ARCHITECTURE.md, "Complete user stacks").
 *
 * Only in scope self (the catalog offers these programs in no other), and
 * only after gfx_task_ok(): the bytes are the caller's own process's
 * memory, never another user's nor a setuid program's.
 */
#ifndef GFX_UCOPY_H
#define GFX_UCOPY_H

#include "gfx_task.h"
#include "gfxbpf_ring.h"
#include <bpf/bpf_core_read.h>

/* The most stack bytes one record holds. */
#define GFX_COPY_MAX 24576
#define GFX_PAGE 4096
#define GFX_COMM_LEN 16

/* Record flags. */
#define GFX_UREC_KERNEL 1   /* the CPU was in kernel mode (regs: the user ones it entered with) */
#define GFX_UREC_SHORT 2    /* the stack ended (an unreadable page) before stack_bytes */
#define GFX_UREC_NO_COPY 4  /* no byte copied (a return record) */
#define GFX_UREC_RETURN 8   /* ustacks: a return record (no registers, no stack) */
/* offcpu: how the task left the CPU (neither RUNNABLE nor IO: an interruptible
 * sleep). 16 and 32 are Python records' (gfx_python.h). */
#define GFX_UREC_RUNNABLE 256  /* preempted (or yielded) while runnable */
#define GFX_UREC_IO 512        /* an uninterruptible sleep (disk I/O, some locks) */
#define GFX_UREC_SYSCALL 1024  /* it was in a system call: `function` is its number */

/* One record in `stack_copies`: this header, then `size` stack bytes from sp. */
struct ustack_rec {
	__u32 tgid;
	__u32 tid;
	__u32 flags;
	__u32 size;   /* stack bytes that follow */
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u64 entry_ns;  /* ustacks: the entry time, which joins a return to its entry */
	__u64 elapsed;   /* ustacks return records: ns from entry to return */
	__u32 function;  /* ustacks: the function's index */
	__u32 pad;
	char comm[GFX_COMM_LEN];
	__u8 stack[GFX_COPY_MAX];
};

#define GFX_UREC_HDR (sizeof(struct ustack_rec) - GFX_COPY_MAX)

/* Stack bytes per record: perf's default, unless the broker writes a lower
 * one (the policy entry's max_stack_bytes; catalog key stack_bytes_knob). */
const volatile __u32 stack_bytes = 8192;

/* The record being built (too large for the BPF stack): one per CPU. The
 * slack lets the verifier see that a chunk never runs past it; the
 * typed value also puts struct ustack_rec in the object's BTF (the
 * catalog's event_type). */
struct ustack_slot {
	struct ustack_rec rec;
	__u8 slack[GFX_PAGE];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ustack_slot);
} copy_scratch SEC(".maps");

/* The records a client reads, charged to the caller's map budget: 2 MiB
 * hold ~250 ms of one CPU sampled at 999 Hz with 8 KiB copies; the reader
 * is woken at a quarter of it. A program that sends fewer copies (ustackcopy)
 * defines a smaller one. */
#ifndef GFX_UREC_RING_BYTES
#define GFX_UREC_RING_BYTES (2 << 20)
#endif
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, GFX_UREC_RING_BYTES);
} stack_copies SEC(".maps");

/* 0 -> records dropped because the ring buffer was full;
 * 1 -> (ustackcopy) calls not counted because the calls table was full */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* The user registers the kernel saved for the current task (x86-64 names). */
struct pt_regs___gfx {
	unsigned long bp;
	unsigned long ip;
	unsigned long sp;
} __attribute__((preserve_access_index));

/* Clear r's header for the current task (offcpu builds records in its own map). */
static __always_inline void gfx_urec_init(struct ustack_rec *r, __u32 flags)
{
	__u64 id = bpf_get_current_pid_tgid();

	r->tgid = id >> 32;
	r->tid = (__u32)id;
	r->flags = flags;
	r->size = 0;
	r->ip = r->sp = r->bp = r->entry_ns = r->elapsed = 0;
	r->function = r->pad = 0;
	bpf_get_current_comm(r->comm, sizeof(r->comm));
}

/* A cleared record from the per-CPU scratch (NULL: none, never in practice). */
static __always_inline struct ustack_rec *gfx_urec_start(__u32 flags)
{
	__u32 zero = 0;
	struct ustack_slot *slot = bpf_map_lookup_elem(&copy_scratch, &zero);

	if (!slot)
		return 0;
	gfx_urec_init(&slot->rec, flags);
	return &slot->rec;
}

/*
 * Copy up to stack_bytes from sp into r->stack, a page at a time (the first
 * chunk up to sp's page end): a stack shorter than that still gives what
 * exists, and a failed read marks the record SHORT.
 */
static __always_inline void gfx_urec_copy(struct ustack_rec *r)
{
	__u32 want = stack_bytes < GFX_COPY_MAX ? stack_bytes : GFX_COPY_MAX;
	__u32 off = 0, chunk = GFX_PAGE - (__u32)(r->sp & (GFX_PAGE - 1));
	__u64 n, o;
	int i;

	for (i = 0; i < GFX_COPY_MAX / GFX_PAGE + 1; i++) {
		if (off >= want || off >= GFX_COPY_MAX)
			break;
		if (chunk > want - off)
			chunk = want - off;
		/* chunk <= GFX_PAGE and off < GFX_COPY_MAX already, but clang may
		 * fold those into comparisons the verifier cannot use: hide the
		 * values from clang and compare again, unsigned and 64-bit. */
		n = chunk;
		o = off;
		asm volatile("" : "+r"(n), "+r"(o));
		if (n > GFX_PAGE || o >= GFX_COPY_MAX)
			break;
		if (bpf_probe_read_user(&r->stack[o], n, (void *)(r->sp + o))) {
			r->flags |= GFX_UREC_SHORT;
			break;
		}
		off += chunk;
		chunk = GFX_PAGE;
	}
	r->size = off;
}

/* Registers from the task's saved user state (valid in kernel mode too). */
static __always_inline void gfx_urec_task_regs(struct ustack_rec *r)
{
	struct pt_regs___gfx *regs;

	regs = (struct pt_regs___gfx *)bpf_task_pt_regs(bpf_get_current_task_btf());
	r->ip = BPF_CORE_READ(regs, ip);
	r->sp = BPF_CORE_READ(regs, sp);
	r->bp = BPF_CORE_READ(regs, bp);
}

/* Send r with its stack bytes, or count it in `lost` when the ring is full. */
static __always_inline void gfx_urec_send(struct ustack_rec *r)
{
	__u64 size = r->size;
	__u64 avail, mark, flags = BPF_RB_NO_WAKEUP;
	__u32 zero = 0;

	/* size <= GFX_COPY_MAX (gfx_urec_copy); again, for the verifier. */
	asm volatile("" : "+r"(size));
	if (size > GFX_COPY_MAX)
		return;
	/* As gfx_ringbuf_submit: wake the reader only past a quarter of the ring. */
	avail = bpf_ringbuf_query(&stack_copies, BPF_RB_AVAIL_DATA);
	mark = bpf_ringbuf_query(&stack_copies, BPF_RB_RING_SIZE) / 4;
	if (avail >= mark && avail < mark + GFX_UREC_HDR + GFX_COPY_MAX + 8)
		flags = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&stack_copies, r, GFX_UREC_HDR + size, flags))
		gfx_count(&lost, &zero, 1);
}

#endif /* GFX_UCOPY_H */
