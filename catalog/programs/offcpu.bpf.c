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
 *   thread's header in `blocked`, stamped with the time (entry_ns). Outside
 *   a system call (preempted in user code, a page fault) the top of its user
 *   stack is copied now (gfx_ucopy.h), into its slot of `copied`.
 * - switch-in of a thread with a stamped header: the time off the CPU, if at
 *   least min_block_us, is added to its `elapsed`; a wait copied at
 *   switch-out goes to `stack_copies` at once.
 * - sys_exit of a thread whose header holds time: the stack is the one it
 *   blocked with (user code has not run since), so it is copied now, after
 *   gfx_task_ok() again, and the record goes to `stack_copies`.
 * So a switch too short to keep (most of them on a busy host) costs no stack
 * copy, and a waiting thread holds ~100 bytes, not a stack's 20 KiB. A thread
 * of a CPython interpreter in `py_files` (gfx_python.h) sends its Python
 * frames as a record of their own just before its stack record, as
 * stackcopy does; a wait outside a system call has none (they can only be
 * walked while the thread is current, and its record is sent at switch-in).
 * A thread already off the CPU in a system call when the profile began
 * (a wait that began before the attach) has no header: at its first
 * switch-in it gets one marked GFX_UREC_BEFORE whose time counts from
 * `since` (when the broker attached), and its record goes out at the
 * system call's exit like any other.
 * Kernel frames are never copied. Why it waited is named by the system call
 * number (a user register, orig_ax) and the state flags; the client turns
 * them into a leaf frame such as [wait: futex].
 *
 * Scope self only: the copied bytes are process memory.
 */
/* One record per kept wait (>= min_block_us): 4 MiB hold ~500 records of
 * 8 KiB stack, 20 ms of 32 threads that each wait 1 ms at a time, so a
 * reader that loses the CPU for a moment does not lose waits (1 MiB dropped
 * copies at defaults: issue 33). Waits meet fewer code objects than samples. */
#define GFX_UREC_RING_BYTES (4 << 20)
#define GFX_PY_CODES 512
#include "gfx_tree.h"
#include "gfx_python.h"
#include "gfx_ucopy.h"

#define GFX_TASK_RUNNING 0
#define GFX_TASK_UNINTERRUPTIBLE 2
#define GFX_OFFCPU_THREADS 4096  /* threads of the caller's off the CPU at once */
#define GFX_OFFCPU_COPIES 48     /* ... of which preempted outside a system call (~28 KiB each) */
#define GFX_NR_EXECVE 59
#define GFX_NR_EXECVEAT 322
/* In `blocked` only (cleared before a record is sent): no stack copy yet. */
#define GFX_UREC_DEFER 2048
/* The wait began before the profile: entry_ns is `since`, not its start. */
#define GFX_UREC_BEFORE 4096

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;
/* Shorter waits are dropped in the kernel (the broker writes the request's
 * value, never below the policy's floor): 1 ms by default. */
const volatile __u32 min_block_us = 1000;

GFX_TREE_PROGRAMS(target_pid)

#include "gfx_since.h"

/* A record's header (struct ustack_rec without the stack bytes). */
struct offcpu_head {
	__u8 bytes[GFX_UREC_HDR];
};

/* tid -> the header of its last switch-out: registers, state, system call,
 * entry_ns (when it left), the time kept so far (elapsed), and `pad` 1 while
 * it is off the CPU (0 in every record sent). ~100 bytes a thread; a slot
 * evicted while its thread waits loses that wait. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, GFX_OFFCPU_THREADS);
	__type(key, __u32);
	__type(value, struct offcpu_head);
} blocked SEC(".maps");

/* tid -> the whole record of a wait outside a system call, whose stack can
 * only be copied at switch-out (~28 KiB each, the slack of struct ustack_slot
 * keeping the page-wise copy inside the value). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, GFX_OFFCPU_COPIES);
	__type(key, __u32);
	__type(value, struct ustack_slot);
} copied SEC(".maps");

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

/* The current thread's header slot, made the first time. */
static __always_inline struct ustack_rec *gfx_head(__u32 tid)
{
	struct offcpu_head *h = bpf_map_lookup_elem(&blocked, &tid);
	struct offcpu_head blank = {};

	if (!h) {
		if (bpf_map_update_elem(&blocked, &tid, &blank, BPF_NOEXIST) < 0)
			return 0;
		h = bpf_map_lookup_elem(&blocked, &tid);
	}
	/* Only the header fields of the record are ever touched through it. */
	return (struct ustack_rec *)h;
}

/* Copy the current task's stack under the header h into tid's `copied` slot
 * (made from the per-CPU scratch the first time: its stale bytes past the
 * copy's size are never sent). */
static __always_inline void gfx_copy_now(__u32 tid, struct ustack_rec *h)
{
	struct ustack_slot *slot = bpf_map_lookup_elem(&copied, &tid);
	__u32 zero = 0;

	if (!slot) {
		struct ustack_slot *scratch = bpf_map_lookup_elem(&copy_scratch, &zero);

		if (!scratch || bpf_map_update_elem(&copied, &tid, scratch, BPF_ANY) < 0)
			return;
		slot = bpf_map_lookup_elem(&copied, &tid);
		if (!slot)
			return;
	}
	__builtin_memcpy(&slot->rec, h, GFX_UREC_HDR);
	gfx_urec_copy(&slot->rec);
}

/* Send tid's copy taken at switch-out (if it is this wait's) with h's time. */
static __always_inline void gfx_send_copied(__u32 tid, struct ustack_rec *h)
{
	struct ustack_slot *slot = bpf_map_lookup_elem(&copied, &tid);

	if (!slot || slot->rec.entry_ns != h->entry_ns)
		return;
	slot->rec.elapsed = h->elapsed;
	slot->rec.pad = 0;
	gfx_urec_send(&slot->rec);
}

/* The current task leaves the CPU: stamp its header with its registers, state
 * and system call (outside one, copy its stack now). */
static __always_inline void offcpu_out(unsigned int state)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct pt_regs___gfx_sys *regs;
	struct ustack_rec *h;
	long nr;

	if (target_uid == GFX_ANY || !gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid))
		return;
	h = gfx_head(tid);
	if (!h)
		return;
	regs = gfx_user_regs();
	nr = gfx_regs_syscall(regs);
	/* Time kept from earlier in this same system call: it goes on, sent at its exit. */
	if (h->elapsed && (h->flags & GFX_UREC_DEFER) && nr == h->function && regs->sp == h->sp) {
		h->entry_ns = bpf_ktime_get_ns();
		h->pad = 1;
		return;
	}
	gfx_urec_init(h, gfx_state_flags(state));
	h->ip = regs->ip;
	h->sp = regs->sp;
	h->bp = regs->bp;
	h->entry_ns = bpf_ktime_get_ns();
	h->pad = 1;
	if (nr >= 0) {
		h->flags |= GFX_UREC_SYSCALL | GFX_UREC_DEFER;
		h->function = (__u32)nr;
	} else {
		gfx_copy_now(tid, h);
	}
}

struct task_struct___gfx_start {
	__u64 start_time;  /* ktime_get_ns() at fork (CLOCK_MONOTONIC) */
} __attribute__((preserve_access_index));

/* next, a thread with no header, runs again: if it is the caller's, older
 * than the profile and in a system call, it has waited since before the
 * profile began. Its
 * header takes the wait from `since` on (kept if that is long enough), to be
 * sent at the system call's exit, where gfx_same_wait() checks it again. */
static __always_inline void offcpu_first_in(struct task_struct *next)
{
	struct task_struct___gfx *t = (void *)next;
	struct pt_regs___gfx_sys *regs;
	struct offcpu_head blank = {};
	struct ustack_rec *h;
	__u32 zero = 0, tid = (__u32)next->pid;
	__u64 *start, now;
	long nr;

	if (!gfx_tree_ok_tgid((__u32)next->tgid, target_pid) ||
	    BPF_CORE_READ(t, cred, uid.val) != target_uid ||
	    BPF_CORE_READ(t, cred, euid.val) != target_uid)
		return;
	start = bpf_map_lookup_elem(&since, &zero);
	now = bpf_ktime_get_ns();
	if (!start || !*start || now - *start < (__u64)min_block_us * 1000)
		return;
	/* A thread made since then has not waited since before: it is just new. */
	if (BPF_CORE_READ((struct task_struct___gfx_start *)next, start_time) >= *start)
		return;
	regs = (struct pt_regs___gfx_sys *)bpf_task_pt_regs(next);
	nr = gfx_regs_syscall(regs);
	if (nr < 0 || bpf_map_update_elem(&blocked, &tid, &blank, BPF_NOEXIST) < 0)
		return;
	h = (struct ustack_rec *)bpf_map_lookup_elem(&blocked, &tid);
	if (!h)
		return;
	h->tgid = (__u32)next->tgid;
	h->tid = tid;
	h->flags = GFX_UREC_SYSCALL | GFX_UREC_DEFER | GFX_UREC_BEFORE;
	h->ip = regs->ip;
	h->sp = regs->sp;
	h->bp = regs->bp;
	h->function = (__u32)nr;
	h->entry_ns = *start;
	h->elapsed = now - *start;
}

/* tid runs again: keep its time if it waited long enough; send it if copied. */
static __always_inline void offcpu_in(struct task_struct *next)
{
	__u32 tid = (__u32)next->pid;
	struct ustack_rec *h = (struct ustack_rec *)bpf_map_lookup_elem(&blocked, &tid);
	__u64 waited;

	if (!h) {
		if (target_uid != GFX_ANY)
			offcpu_first_in(next);
		return;
	}
	if (!h->pad)
		return;
	h->pad = 0;
	waited = bpf_ktime_get_ns() - h->entry_ns;
	if (waited >= (__u64)min_block_us * 1000 || h->elapsed) {
		h->elapsed += waited;
		if (!(h->flags & GFX_UREC_DEFER)) {
			gfx_send_copied(tid, h);
			h->elapsed = 0;
		}
	}
}

/* sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 * unsigned int prev_state); prev is current. */
SEC("tp_btf/sched_switch")
int offcpu_switch(unsigned long long *ctx)
{
	struct task_struct *next = (void *)ctx[2];
	unsigned int prev_state = (unsigned int)ctx[3];

	offcpu_out(prev_state);
	offcpu_in(next);
	return 0;
}

/* Is h's kept time from the system call the current thread leaves, by a thread
 * still in scope? (An execve may have made it another program, a reused tid
 * another thread.) */
static __always_inline int gfx_same_wait(struct ustack_rec *h)
{
	struct pt_regs___gfx_sys *regs = gfx_user_regs();

	return regs->sp == h->sp && regs->orig_ax == h->function &&
	       h->function != GFX_NR_EXECVE && h->function != GFX_NR_EXECVEAT &&
	       h->tgid == (__u32)(bpf_get_current_pid_tgid() >> 32) && gfx_task_ok(target_uid);
}

/* sys_exit(struct pt_regs *regs, long ret): the current thread leaves a system
 * call; if it waited in it long enough, copy the stack it waited with now. */
SEC("tp_btf/sys_exit")
int offcpu_sys_exit(unsigned long long *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct ustack_rec *h, *r;
	struct py_rec *py;
	__u32 zero = 0;

	/* Most system calls on the host: one cheap test before the map lookup. */
	if (target_uid == GFX_ANY || (__u32)bpf_get_current_uid_gid() != target_uid)
		return 0;
	h = (struct ustack_rec *)bpf_map_lookup_elem(&blocked, &tid);
	if (!h || !h->elapsed || !(h->flags & GFX_UREC_DEFER))
		return 0;
	r = (struct ustack_rec *)bpf_map_lookup_elem(&copy_scratch, &zero);
	if (r && gfx_same_wait(h)) {
		py = gfx_py_record();
		if (py && gfx_py_walk(py)) {
			py->ts = h->entry_ns;  /* the stack record's entry_ns: the reader joins them */
			if (!gfx_py_send(&stack_copies, py))
				gfx_count(&lost, &zero, 1);
		}
		__builtin_memcpy(r, h, GFX_UREC_HDR);
		if (r->flags & GFX_UREC_BEFORE)  /* made at a switch-in: the name is current's */
			bpf_get_current_comm(r->comm, sizeof(r->comm));
		r->flags &= ~GFX_UREC_DEFER;
		r->pad = 0;
		gfx_urec_copy(r);
		gfx_urec_send(r);
	}
	h->elapsed = 0;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
