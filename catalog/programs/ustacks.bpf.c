// SPDX-License-Identifier: GPL-2.0
/*
 * ustacks: calls of chosen user-space functions per calling user stack,
 * with the time spent in them; a sibling of ucalls.
 *
 * Attached like ucalls: one uprobe and one uretprobe per function, the
 * function's index as the bpf cookie, target_pid the tgid the broker
 * verified the caller owns. At a function's first instruction the frame
 * pointer still belongs to the caller, so a frame-pointer walk skips the
 * caller itself: the return address on top of the stack is read and kept
 * in the key (`caller`), and the client puts it back between the
 * function and the rest of the stack.
 */
#include "gfx_tree.h"
#include "gfx_task.h"
#include "gfx_ustack.h"
#include <linux/ptrace.h>

#define MAX_FUNCTIONS 64

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;
GFX_TREE_PROGRAMS(target_pid)

struct call_key {
	__u32 tgid;
	__s32 user_stack;  /* id in `stacks`, or -errno */
	__u32 function;    /* index in the `functions` parameter */
	__u32 pad;
	__u64 caller;      /* return address into the caller (0: unreadable) */
};

#define GFX_CALL_ROWS MAX_STACKS
#include "gfx_callrows.h"

SEC("uprobe")
int ustack_entry(struct pt_regs *ctx)
{
	__u32 function = (__u32)bpf_get_attach_cookie(ctx);
	struct call_stats first;
	struct entry_key ek;
	struct entry_val ev = {};

	if (!gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid) || function >= MAX_FUNCTIONS)
		return 0;
	/* Field by field: a constant initializer would land in .rodata.cst16. */
	first.calls = 1;
	first.total_ns = 0;
	gfx_entry_key(&ek, function);
	ev.key.tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
	ev.key.function = ek.function;
	ev.key.user_stack = gfx_user_stack(ctx);
	if (bpf_probe_read_user(&ev.key.caller, sizeof(ev.key.caller), (void *)ctx->rsp))
		ev.key.caller = 0;
	gfx_count_or_lost(&calls, &ev.key, &first);  /* calls: the first field */
	ev.ts = bpf_ktime_get_ns();
	bpf_map_update_elem(&entry_ts, &ek, &ev, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int ustack_return(struct pt_regs *ctx)
{
	__u32 function = (__u32)bpf_get_attach_cookie(ctx);

	if (!gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid) || function >= MAX_FUNCTIONS)
		return 0;
	gfx_call_return(function);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
