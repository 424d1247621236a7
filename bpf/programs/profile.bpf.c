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
#include "gfx_rows.h"
#include <linux/bpf_perf_event.h>

#define MAX_STACKS 8192
#define MAX_DEPTH 127  /* PERF_MAX_STACK_DEPTH */
#define TASK_COMM_LEN 16

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;

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

/* stack id -> user return addresses, innermost first, zero-padded */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, MAX_STACKS);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, MAX_DEPTH * sizeof(__u64));
} stacks SEC(".maps");

/* 0 -> samples dropped because `counts` was full */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

SEC("perf_event")
int profile_sample(struct bpf_perf_event_data *ctx)
{
	struct sample_key key = {};
	__u64 one = 1;
	__u32 zero = 0;

	if (!gfx_tgid_ok(target_pid) || !gfx_uid_ok(target_uid))
		return 0;
	key.tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
	key.user_stack = (__s32)bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK);
	key.kernel = (ctx->regs.cs & 3) == 0;  /* CPL 0 */
	bpf_get_current_comm(&key.comm, sizeof(key.comm));
	if (gfx_count_first(&counts, &key, &one, 1))
		gfx_count(&lost, &zero, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
