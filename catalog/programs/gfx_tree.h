/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Process trees (profile, ustacks, ucalls, cuda): a program that filters on
 * target_pid may also count the target's descendants, those alive at attach
 * and those forked later (threads share their process's tgid).
 *
 * - `tree` holds the tgids of the target's descendants. The broker seeds it
 *   after attaching with the descendants the caller owns; the fork programs
 *   below add each new process whose parent is in the tree. It is never
 *   passed to a client (catalog: visible = false).
 * - follow_children (the catalog's children_knob) turns it on; at 0 the
 *   filter is the plain target_pid test.
 * - target_pid GFX_TREE_ONLY: the tree holds the targets themselves, which
 *   the broker writes at each attach, so one loaded (verified) instance
 *   serves one profile after another of different pids (broker/sharing/warm.py).
 * The uid filter stays with each program: a descendant outside the caller's
 * scope is dropped there, whatever the tree says.
 *
 * Use: include this header, then GFX_TREE_PROGRAMS(target_pid) once after
 * the knob's declaration, and gfx_tree_ok(target_pid) in place of
 * gfx_tgid_ok(target_pid).
 */
#ifndef GFX_TREE_H
#define GFX_TREE_H

#include "gfxbpf.h"

#define GFX_TREE_MAX 8192  /* descendants tracked at once */
#define GFX_TREE_ONLY ((__u32)-2)  /* target_pid: the targets are the tree's tgids */

const volatile __u32 follow_children = 0;
const volatile __u32 off_child_pid = 20;  /* sched_process_fork: pid_t child_pid */

/* tgid -> 1: a descendant of target_pid (target_pid itself is the knob) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GFX_TREE_MAX);
	__type(key, __u32);
	__type(value, __u8);
} tree SEC(".maps");

/* Is tgid the target or, following children, one of its descendants? */
static __always_inline int gfx_tree_has(__u32 tgid, __u32 target_pid)
{
	if (tgid == target_pid)
		return 1;
	if (target_pid != GFX_TREE_ONLY && !follow_children)
		return 0;
	return bpf_map_lookup_elem(&tree, &tgid) != NULL;
}

/* The scope filter on processes, for any task's tgid. */
static __always_inline int gfx_tree_ok_tgid(__u32 tgid, __u32 target_pid)
{
	return target_pid == GFX_ANY || gfx_tree_has(tgid, target_pid);
}

/* The scope filter on processes: gfx_tgid_ok that follows the tree. */
static __always_inline int gfx_tree_ok(__u32 target_pid)
{
	return gfx_tree_ok_tgid((__u32)(bpf_get_current_pid_tgid() >> 32), target_pid);
}

/* At a fork, in the parent: a new process whose parent is in the tree joins it. */
static __always_inline void gfx_tree_fork(__u32 child, __u32 target_pid)
{
	__u8 one = 1;

	if (!follow_children || target_pid == GFX_ANY || !child)
		return;
	if (gfx_tree_has((__u32)(bpf_get_current_pid_tgid() >> 32), target_pid))
		bpf_map_update_elem(&tree, &child, &one, BPF_ANY);
}

/* The fields the tp_btf build reads, relocated by CO-RE. */
struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

/*
 * Two builds of the fork hook (catalog variants "btf" and "tracefs"). With
 * BTF a new thread (pid != tgid) is told apart and skipped; the tracepoint
 * record has only the child's pid, so there a thread's id lands in the tree
 * too: a later process of the caller's that reuses it would be counted
 * (the uid filter still holds).
 */
#define GFX_TREE_PROGRAMS(target_pid)                                          \
	SEC("tp_btf/sched_process_fork")                                       \
	int tree_fork_btf(unsigned long long *ctx)                             \
	{                                                                      \
		struct task_struct *child = (void *)ctx[1];                    \
		if (child->pid == child->tgid)                                 \
			gfx_tree_fork((__u32)child->tgid, target_pid);         \
		return 0;                                                      \
	}                                                                      \
	SEC("tracepoint/sched/sched_process_fork")                             \
	int tree_fork(void *ctx)                                               \
	{                                                                      \
		gfx_tree_fork(gfx_ctx_u32(ctx, off_child_pid), target_pid);    \
		return 0;                                                      \
	}

#endif /* GFX_TREE_H */
