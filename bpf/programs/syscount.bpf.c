// SPDX-License-Identifier: GPL-2.0
/*
 * syscount: system calls per syscall number, for every uid (scope system)
 * or for the caller's uid only (scope self: the broker sets target_uid).
 */
#include "gfxbpf.h"

const volatile __u32 target_uid = GFX_ANY;

/* syscall number (as the kernel saw it; -1 = invalid) -> calls */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

/* raw sys_enter(struct pt_regs *regs, long id): args[1] is the number. */
SEC("raw_tracepoint/sys_enter")
int sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 nr;

	if (!gfx_uid_ok(target_uid))
		return 0;
	nr = (__u32)ctx->args[1];
	gfx_count(&counts, &nr, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
