// SPDX-License-Identifier: GPL-2.0
/*
 * profile: CPU samples per (process, user stack, in-kernel flag).
 *
 * The broker opens a software cpu-clock perf event on every CPU at the
 * frequency the client asked for (the policy may cap it) and attaches
 * profile_sample to each. Only user stacks are walked (BPF_F_USER_STACK):
 * a sample taken in the kernel is marked `kernel` and its user stack is the
 * one the task entered the kernel with, so no kernel address is ever
 * stored in a map a client can read. A sample whose user stack could not be
 * taken (a kernel thread, a full or colliding stack table) keeps the
 * negative error as its stack id: it is counted, not dropped.
 */
#include "gfx_tree.h"
#include "gfx_task.h"
#include "gfx_cgroup.h"
#include "gfx_ustack.h"
#include <linux/bpf_perf_event.h>

#define TASK_COMM_LEN 16

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;
const volatile __u64 target_cgroup = 0;  /* scope job (gfx_cgroup.h) */
GFX_TREE_PROGRAMS(target_pid)

struct sample_key {
	__u32 tgid;
	__s32 user_stack;  /* id in `stacks`, or -errno when none was taken */
	__u32 kernel;      /* 1: the CPU was in kernel mode */
	char comm[TASK_COMM_LEN];
};

/* (tgid, user stack, kernel) -> samples */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_STACKS);
	__type(key, struct sample_key);
	__type(value, __u64);
} counts SEC(".maps");

SEC("perf_event")
int profile_sample(struct bpf_perf_event_data *ctx)
{
	struct sample_key key = {};
	__u64 one = 1;

	if (!gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid) || !gfx_cgroup_ok(target_cgroup))
		return 0;
	key.tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
	key.user_stack = gfx_user_stack(ctx);
	key.kernel = (ctx->regs.cs & 3) == 0;  /* CPL 0 */
	bpf_get_current_comm(&key.comm, sizeof(key.comm));
	gfx_count_or_lost(&counts, &key, &one);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
