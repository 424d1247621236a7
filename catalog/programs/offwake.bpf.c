// SPDX-License-Identifier: GPL-2.0
/*
 * offwake: offcpu (its programs and maps, unchanged: offcpu.bpf.c) and, for
 * each wait, who woke it (offwaketime, for an ordinary user).
 *
 * sched_waking runs in the waker's context as it wakes a task. When that
 * task is one of the caller's threads waiting in `blocked` (offcpu keeps
 * headers only for threads gfx_tree_ok() and gfx_task_ok() accepted) and
 * its wait is already long enough to be kept, one waker record goes to
 * `stack_copies` before the wait's own record, keyed by the waiting thread
 * and the wait's entry_ns (which gfxclient joins). The waker is:
 * - the kernel: the wake-up runs in an interrupt (a timer, a device) or in
 *   a kernel thread (no mm): the record says so and holds nothing else. An
 *   interrupt of kernel code runs on the CPU's interrupt stack (the
 *   program's stack is not the current task's kernel stack); one of user
 *   code runs on the task's stack, but then the task's saved user registers
 *   are the interrupt's, not a system call's (gfx_regs_syscall: -1). A
 *   wake-up in task context outside a system call (a fault) counts as the
 *   kernel's too;
 * - another user's process (or a setuid one): gfx_task_ok() refuses the
 *   current task: the record says so and holds nothing else, no pid, no
 *   name, no address;
 * - the caller's own: its user registers and a copy of the top of its user
 *   stack, as any wait's, with its tgid, tid and name.
 * No kernel address leaves the program: the stack test compares addresses
 * inside it.
 */
#include "offcpu.bpf.c"

/* Waker records' flags (with GFX_UREC_SYSCALL's neighbours unused). */
#define GFX_UREC_WAKER 8192          /* a waker record: function = the woken thread */
#define GFX_UREC_WAKER_OTHER 16384   /* woken by another user's process: nothing copied */
#define GFX_UREC_WAKER_KERNEL 32768  /* woken by the kernel: nothing copied */
/* A task's kernel stack: THREAD_SIZE, 16 KiB on x86-64 (32 KiB with KASAN). */
#define GFX_KSTACK_BYTES (32 << 10)

struct task_struct___gfx_wake {
	void *stack;
	void *mm;
} __attribute__((preserve_access_index));

/* Whether this program runs on the current task's own kernel stack (else on
 * an interrupt stack: a hard or soft interrupt woke the task). */
static __always_inline int gfx_in_task(struct task_struct___gfx_wake *cur)
{
	__u64 here = (__u64)&here;
	__u64 base = (__u64)cur->stack;

	return here >= base && here < base + GFX_KSTACK_BYTES;
}

/* sched_waking(struct task_struct *p): current wakes p. */
SEC("tp_btf/sched_waking")
int offwake_waking(unsigned long long *ctx)
{
	struct task_struct *p = (void *)ctx[0];
	struct task_struct___gfx_wake *cur = (void *)bpf_get_current_task_btf();
	__u32 tid = (__u32)p->pid;
	struct ustack_rec *h = (struct ustack_rec *)bpf_map_lookup_elem(&blocked, &tid);
	__u64 entry, now;
	struct ustack_rec *r;
	__u32 flags = GFX_UREC_WAKER;

	if (!h || !h->pad)
		return 0;  /* not a waiting thread of the caller's */
	entry = h->entry_ns;
	now = bpf_ktime_get_ns();
	if (h->elapsed + (now - entry) < (__u64)min_block_us * 1000)
		return 0;  /* a wait too short to be kept: no waker either */
	if (!gfx_in_task(cur) || !cur->mm || gfx_regs_syscall(gfx_user_regs()) < 0)
		flags |= GFX_UREC_WAKER_KERNEL;
	else if (!gfx_task_ok(target_uid))
		flags |= GFX_UREC_WAKER_OTHER;
	r = gfx_urec_start(flags);
	if (!r)
		return 0;
	if (flags != GFX_UREC_WAKER) {
		/* Nothing of the waker: gfx_urec_start filled in current's ids and name. */
		r->tgid = r->tid = 0;
		__builtin_memset(r->comm, 0, sizeof(r->comm));
	} else {
		gfx_urec_task_regs(r);
		gfx_urec_copy(r);
	}
	r->entry_ns = entry;
	r->function = tid;
	gfx_urec_send(r);
	return 0;
}
