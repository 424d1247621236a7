// SPDX-License-Identifier: GPL-2.0
/*
 * offcpu: where the caller's own threads wait, as stack copies with the time
 * they spent off the CPU (perf record --off-cpu, for an ordinary user).
 *
 * A thread's user registers and stack are readable only while it is
 * current: at sched_switch as it leaves (prev is current), and when it is
 * back in its system call's exit. So:
 * - switch-out of a task gfx_tree_ok() and gfx_task_ok() accept: its user
 *   registers, how it left (the state: preempted while runnable, asleep, or
 *   in an uninterruptible sleep) and the system call it is in go into its
 *   thread's slot of `blocked`, stamped with the time (entry_ns). Outside a
 *   system call (preempted in user code, a page fault) the top of its user
 *   stack is copied there too (gfx_ucopy.h).
 * - switch-in of a thread with a stamped slot: the time off the CPU, if at
 *   least min_block_us, is added to the slot's `elapsed`; a slot with its
 *   stack copy goes to `stack_copies` at once.
 * - sys_exit of a thread whose slot holds time but no copy: the stack is the
 *   one it blocked with (user code has not run since), so it is copied now,
 *   after gfx_task_ok() again, and the slot goes to `stack_copies`.
 * So a switch too short to keep (most of them on a busy host) costs no stack
 * copy. A thread of a CPython interpreter in `py_files` (gfx_python.h) sends
 * its Python frames as a record of their own just before its stack record,
 * as stackcopy does; a wait outside a system call has none (they can only be
 * walked while the thread is current, and its record is sent at switch-in). Kernel frames are never copied. Why it waited is named by the system
 * call number (a user register, orig_ax) and the state flags; the client
 * turns them into a leaf frame such as [wait: futex].
 *
 * Scope self only: the copied bytes are process memory.
 */
#include "gfx_tree.h"
#include "gfx_python.h"
#include "gfx_ucopy.h"

#define GFX_TASK_RUNNING 0
#define GFX_TASK_UNINTERRUPTIBLE 2
#define GFX_OFFCPU_THREADS 512  /* threads of the caller's blocked at once */
#define GFX_NR_EXECVE 59
#define GFX_NR_EXECVEAT 322
/* In `blocked` only (cleared before a record is sent): no stack copy yet. */
#define GFX_UREC_DEFER 2048

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;
/* Shorter waits are dropped in the kernel (the broker writes the request's
 * value, never below the policy's floor): 1 ms by default. */
const volatile __u32 min_block_us = 1000;

GFX_TREE_PROGRAMS(target_pid)

/* tid -> the record of its last switch-out; entry_ns 0: it is running. The
 * slack of struct ustack_slot keeps the page-wise copy inside the value.
 * 512 slots of ~20 KiB; a slot evicted while its thread waits loses that wait. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, GFX_OFFCPU_THREADS);
	__type(key, __u32);
	__type(value, struct ustack_slot);
} blocked SEC(".maps");

/* The registers a system call entry leaves (x86-64): SYSCALL puts the return
 * address in rcx and the flags in r11, which the entry code saves as cx and
 * r11 besides ip and flags, and the number stays in orig_ax. An exception
 * (a page fault) saves the interrupted rcx/r11 instead, which match only by
 * chance. */
struct pt_regs___gfx_sys {
	unsigned long r11;
	unsigned long bp;
	unsigned long cx;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long flags;
	unsigned long sp;
} __attribute__((preserve_access_index));

/* The current task's saved user registers: a typed pointer, read with plain
 * (CO-RE relocated) loads in this tp_btf program. */
static __always_inline struct pt_regs___gfx_sys *gfx_user_regs(void)
{
	return (struct pt_regs___gfx_sys *)bpf_task_pt_regs(bpf_get_current_task_btf());
}

/* The system call these registers are in, or -1 (preempted in user code, a fault). */
static __always_inline long gfx_regs_syscall(struct pt_regs___gfx_sys *regs)
{
	if (regs->cx != regs->ip || regs->r11 != regs->flags)
		return -1;
	return (long)regs->orig_ax;
}

static __always_inline __u32 gfx_state_flags(unsigned int state)
{
	if (state == GFX_TASK_RUNNING)
		return GFX_UREC_RUNNABLE;
	return (state & GFX_TASK_UNINTERRUPTIBLE) ? GFX_UREC_IO : 0;
}

/* The current thread's slot, made from the (never written) scratch the first time. */
static __always_inline struct ustack_slot *gfx_slot(__u32 tid)
{
	struct ustack_slot *slot = bpf_map_lookup_elem(&blocked, &tid);
	struct ustack_slot *blank;
	__u32 zero = 0;

	if (slot)
		return slot;
	blank = bpf_map_lookup_elem(&copy_scratch, &zero);
	if (!blank || bpf_map_update_elem(&blocked, &tid, blank, BPF_NOEXIST) < 0)
		return 0;
	return bpf_map_lookup_elem(&blocked, &tid);
}

/* Send a slot's record (its time in elapsed) and clear the time. */
static __always_inline void gfx_slot_send(struct ustack_slot *slot)
{
	slot->rec.flags &= ~GFX_UREC_DEFER;
	gfx_urec_send(&slot->rec);
	slot->rec.elapsed = 0;
}

/* The current task leaves the CPU: stamp its slot with its registers (and,
 * outside a system call, its stack). */
static __always_inline void offcpu_out(unsigned int state)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct pt_regs___gfx_sys *regs;
	struct ustack_slot *slot;
	struct ustack_rec *r;
	long nr;

	if (target_uid == GFX_ANY || !gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid))
		return;
	slot = gfx_slot(tid);
	if (!slot)
		return;
	r = &slot->rec;
	regs = gfx_user_regs();
	nr = gfx_regs_syscall(regs);
	/* Time kept from earlier in this same system call: it goes on, sent at its exit. */
	if (r->elapsed && (r->flags & GFX_UREC_DEFER) && nr == r->function && regs->sp == r->sp) {
		r->entry_ns = bpf_ktime_get_ns();
		return;
	}
	gfx_urec_init(r, gfx_state_flags(state));
	r->ip = regs->ip;
	r->sp = regs->sp;
	r->bp = regs->bp;
	if (nr >= 0) {
		r->flags |= GFX_UREC_SYSCALL | GFX_UREC_DEFER;
		r->function = (__u32)nr;
	} else {
		gfx_urec_copy(r);
	}
	r->entry_ns = bpf_ktime_get_ns();
}

/* tid runs again: keep its time if it waited long enough; send it if copied. */
static __always_inline void offcpu_in(__u32 tid)
{
	struct ustack_slot *slot = bpf_map_lookup_elem(&blocked, &tid);
	__u64 waited;

	if (!slot || !slot->rec.entry_ns)
		return;
	waited = bpf_ktime_get_ns() - slot->rec.entry_ns;
	slot->rec.entry_ns = 0;
	if (waited < (__u64)min_block_us * 1000 && !slot->rec.elapsed)
		return;
	slot->rec.elapsed += waited;
	if (!(slot->rec.flags & GFX_UREC_DEFER))
		gfx_slot_send(slot);
}

/* sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 * unsigned int prev_state); prev is current. */
SEC("tp_btf/sched_switch")
int offcpu_switch(unsigned long long *ctx)
{
	struct task_struct *next = (void *)ctx[2];
	unsigned int prev_state = (unsigned int)ctx[3];

	offcpu_out(prev_state);
	offcpu_in((__u32)next->pid);
	return 0;
}

/* sys_exit(struct pt_regs *regs, long ret): the current thread leaves a system
 * call; if it waited in it long enough, copy the stack it waited with now. */
SEC("tp_btf/sys_exit")
int offcpu_sys_exit(unsigned long long *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct pt_regs___gfx_sys *regs;
	struct ustack_slot *slot;
	struct ustack_rec *r;
	struct py_rec *py;

	/* Most system calls on the host: one cheap test before the map lookup. */
	if (target_uid == GFX_ANY || (__u32)bpf_get_current_uid_gid() != target_uid)
		return 0;
	slot = bpf_map_lookup_elem(&blocked, &tid);
	if (!slot || !slot->rec.elapsed || !(slot->rec.flags & GFX_UREC_DEFER))
		return 0;
	r = &slot->rec;
	regs = gfx_user_regs();
	/* The same system call at the same user sp, by a thread still in scope (an
	 * execve may have made it another program, a reused tid another thread). */
	if (regs->sp != r->sp || regs->orig_ax != r->function ||
	    r->function == GFX_NR_EXECVE || r->function == GFX_NR_EXECVEAT ||
	    r->tgid != (__u32)(bpf_get_current_pid_tgid() >> 32) || !gfx_task_ok(target_uid)) {
		r->elapsed = 0;
		return 0;
	}
	py = gfx_py_record();
	if (py && gfx_py_walk(py) && !gfx_py_send(&stack_copies, py)) {
		__u32 zero = 0;

		gfx_count(&lost, &zero, 1);
	}
	gfx_urec_copy(r);
	gfx_slot_send(slot);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
