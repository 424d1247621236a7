// SPDX-License-Identifier: GPL-2.0
/*
 * locks: user-space lock contention of the caller's own threads, per futex
 * word (perf lock contention, for an ordinary user and for user-space locks).
 *
 * A contended pthread mutex (or condition variable, semaphore, barrier, and
 * most runtimes' locks) waits in futex(FUTEX_WAIT*) and is released with
 * futex(FUTEX_WAKE*) by the thread that held it. So:
 * - sys_enter of futex by a thread gfx_tree_ok() and gfx_task_ok() accept:
 *   its futex word's address, the operation and the time go into `pending`;
 * - sys_exit of that call (current again, its user stack as it entered):
 *   a wait that slept (not -EAGAIN: the word had already changed) or a wake
 *   that woke at least one thread sends one record to `stack_copies` with
 *   the stack copied now (gfx_ucopy.h), gfx_task_ok() checked again.
 * A wait's record holds when it entered (entry_ns) and how long it took
 * (elapsed); a wake's, when it entered and how many it woke. gfxclient joins
 * each wait with the last wake of the same word between its entry and its
 * exit: that thread held the lock and released it, and its stack is where.
 *
 * The futex word's address is one of the caller's own process (a global's,
 * named by its symbol in gfxclient); no kernel address is read. Scope self
 * only: the records hold process memory.
 */
/* A contended lock sends two records per hand-over (8 KiB stacks by default):
 * 2 MiB hold ~120 hand-overs between two reads. */
#define GFX_UREC_RING_BYTES (2 << 20)
#include "gfx_tree.h"
#include "gfx_ucopy.h"

#define GFX_NR_FUTEX 202   /* x86-64 */
#define GFX_EAGAIN 11
#define GFX_FUTEX_CMD_MASK 127  /* without FUTEX_PRIVATE_FLAG (128), FUTEX_CLOCK_REALTIME (256) */
#define GFX_LOCK_THREADS 4096  /* threads of the caller's in a futex call at once */
/* Record flags: which side of the lock (GFX_UREC_SYSCALL is set too). */
#define GFX_UREC_LOCK_WAIT 8192
#define GFX_UREC_LOCK_WAKE 16384

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;

GFX_TREE_PROGRAMS(target_pid)

/* A futex call under way: its word, the side, when it entered. */
struct lock_call {
	__u64 uaddr;
	__u64 entry_ns;
	__u32 flags;  /* GFX_UREC_LOCK_WAIT or GFX_UREC_LOCK_WAKE */
	__u32 tgid;   /* whose: a stale slot of an exited thread never serves a reused tid */
};

/* tid -> its futex call under way (the word is its own process's address). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, GFX_LOCK_THREADS);
	__type(key, __u32);
	__type(value, struct lock_call);
} pending SEC(".maps");

/* The registers a system call entry leaves: the arguments and the number. */
struct pt_regs___gfx_lock {
	unsigned long di;  /* uaddr */
	unsigned long si;  /* op */
	unsigned long orig_ax;
} __attribute__((preserve_access_index));

/* The futex operation's side: waits sleep on the word, wakes release it. */
static __always_inline __u32 gfx_lock_side(unsigned long op)
{
	switch (op & GFX_FUTEX_CMD_MASK) {
	case 0:   /* FUTEX_WAIT */
	case 6:   /* FUTEX_LOCK_PI */
	case 9:   /* FUTEX_WAIT_BITSET */
	case 11:  /* FUTEX_WAIT_REQUEUE_PI */
	case 13:  /* FUTEX_LOCK_PI2 */
		return GFX_UREC_LOCK_WAIT;
	case 1:   /* FUTEX_WAKE */
	case 3:   /* FUTEX_REQUEUE */
	case 4:   /* FUTEX_CMP_REQUEUE */
	case 5:   /* FUTEX_WAKE_OP */
	case 7:   /* FUTEX_UNLOCK_PI */
	case 10:  /* FUTEX_WAKE_BITSET */
		return GFX_UREC_LOCK_WAKE;
	}
	return 0;
}

/* sys_enter(struct pt_regs *regs, long id): a futex call of the caller's threads. */
SEC("tp_btf/sys_enter")
int locks_sys_enter(unsigned long long *ctx)
{
	struct pt_regs___gfx_lock *regs = (void *)ctx[0];
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct lock_call call = {};

	/* Most system calls on the host: two cheap tests first. */
	if ((long)ctx[1] != GFX_NR_FUTEX || target_uid == GFX_ANY ||
	    (__u32)bpf_get_current_uid_gid() != target_uid)
		return 0;
	call.flags = gfx_lock_side(regs->si);
	if (!call.flags || !gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid))
		return 0;
	call.uaddr = regs->di;
	call.entry_ns = bpf_ktime_get_ns();
	call.tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
	bpf_map_update_elem(&pending, &tid, &call, BPF_ANY);
	return 0;
}

/* sys_exit(struct pt_regs *regs, long ret): a wait that slept or a wake that
 * woke someone sends its record, with the stack it entered with. */
SEC("tp_btf/sys_exit")
int locks_sys_exit(unsigned long long *ctx)
{
	struct pt_regs___gfx_lock *regs = (void *)ctx[0];
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	long ret = (long)ctx[1];
	struct lock_call *call;
	struct ustack_rec *r;
	__u64 now;

	if (target_uid == GFX_ANY || (__u32)bpf_get_current_uid_gid() != target_uid)
		return 0;
	call = bpf_map_lookup_elem(&pending, &tid);
	if (!call)
		return 0;
	now = bpf_ktime_get_ns();
	if (call->tgid != (__u32)(id >> 32) || regs->orig_ax != GFX_NR_FUTEX)
		goto done;  /* not the call stashed: a reused tid */
	if (call->flags == GFX_UREC_LOCK_WAIT ? ret == -GFX_EAGAIN : ret <= 0)
		goto done;  /* no sleep, or no one woken: no contention */
	/* An execve since the entry makes the thread another program (maybe setuid). */
	if (!gfx_task_ok(target_uid))
		goto done;
	r = gfx_urec_start(GFX_UREC_SYSCALL | call->flags);
	if (!r)
		goto done;
	gfx_urec_task_regs(r);
	r->entry_ns = call->entry_ns;
	/* A wait: ns from entry to exit; a wake: the threads it woke. */
	r->elapsed = call->flags == GFX_UREC_LOCK_WAIT ? now - call->entry_ns : (__u64)ret;
	/* function and pad: the futex word's address, low and high half. */
	r->function = (__u32)call->uaddr;
	r->pad = (__u32)(call->uaddr >> 32);
	gfx_urec_copy(r);
	gfx_urec_send(r);
done:
	bpf_map_delete_elem(&pending, &tid);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
