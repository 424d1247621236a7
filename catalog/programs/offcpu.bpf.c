// SPDX-License-Identifier: GPL-2.0
/*
 * offcpu: where the caller's own threads wait, as stack copies with the time
 * they spent off the CPU (perf record --off-cpu, for an ordinary user).
 *
 * tp_btf/sched_switch runs on the CPU a task leaves while that task (prev)
 * is still current, so its saved user registers and its user stack are
 * readable then, and only then. So:
 * - switch-out of a task gfx_tree_ok() and gfx_task_ok() accept: its user
 *   registers, the top of its user stack (gfx_ucopy.h), how it left (the
 *   state: preempted while runnable, asleep, or in an uninterruptible sleep)
 *   and the system call it is in go into its thread's slot of `blocked`,
 *   stamped with the time (entry_ns).
 * - switch-in of a thread with a stamped slot: if it was off the CPU for at
 *   least min_block_us, the slot goes to `stack_copies` with that time in
 *   `elapsed`; the stamp is cleared either way.
 * Kernel frames are never copied. Why it waited is named by the system call
 * number (a user register, orig_ax) and the state flags; the client turns
 * them into a leaf frame such as [wait: futex].
 *
 * Scope self only: the copied bytes are process memory.
 */
#include "gfx_tree.h"
#include "gfx_ucopy.h"

#define GFX_TASK_RUNNING 0
#define GFX_TASK_UNINTERRUPTIBLE 2
#define GFX_OFFCPU_THREADS 512  /* threads of the caller's blocked at once */

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
	unsigned long cx;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long flags;
} __attribute__((preserve_access_index));

/* The system call the current task is in, or -1 (preempted in user code, a fault). */
static __always_inline long gfx_current_syscall(void)
{
	struct pt_regs___gfx_sys *regs;

	regs = (struct pt_regs___gfx_sys *)bpf_task_pt_regs(bpf_get_current_task_btf());
	if (BPF_CORE_READ(regs, cx) != BPF_CORE_READ(regs, ip) ||
	    BPF_CORE_READ(regs, r11) != BPF_CORE_READ(regs, flags))
		return -1;
	return (long)BPF_CORE_READ(regs, orig_ax);
}

static __always_inline __u32 gfx_state_flags(unsigned int state)
{
	if (state == GFX_TASK_RUNNING)
		return GFX_UREC_RUNNABLE;
	return (state & GFX_TASK_UNINTERRUPTIBLE) ? GFX_UREC_IO : 0;
}

/* The current task leaves the CPU: stamp its slot with its registers and stack. */
static __always_inline void offcpu_out(unsigned int state)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct ustack_slot *slot;
	struct ustack_rec *r;
	long nr;

	if (target_uid == GFX_ANY || !gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid))
		return;
	slot = bpf_map_lookup_elem(&blocked, &tid);
	if (!slot) {
		__u32 zero = 0;
		struct ustack_slot *blank = bpf_map_lookup_elem(&copy_scratch, &zero);

		/* A new thread: its slot is made once, from the (never written) scratch. */
		if (!blank || bpf_map_update_elem(&blocked, &tid, blank, BPF_NOEXIST) < 0)
			return;
		slot = bpf_map_lookup_elem(&blocked, &tid);
		if (!slot)
			return;
	}
	r = &slot->rec;
	gfx_urec_init(r, gfx_state_flags(state));
	nr = gfx_current_syscall();
	if (nr >= 0) {
		r->flags |= GFX_UREC_SYSCALL;
		r->function = (__u32)nr;
	}
	gfx_urec_task_regs(r);
	gfx_urec_copy(r);
	r->entry_ns = bpf_ktime_get_ns();
}

/* tid runs again: send its record if it waited long enough. */
static __always_inline void offcpu_in(__u32 tid)
{
	struct ustack_slot *slot = bpf_map_lookup_elem(&blocked, &tid);
	__u64 now, start;

	if (!slot || !slot->rec.entry_ns)
		return;
	start = slot->rec.entry_ns;
	now = bpf_ktime_get_ns();
	if (now - start >= (__u64)min_block_us * 1000) {
		slot->rec.elapsed = now - start;
		gfx_urec_send(&slot->rec);
	}
	slot->rec.entry_ns = 0;
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

char LICENSE[] SEC("license") = "GPL";
