// SPDX-License-Identifier: GPL-2.0
/*
 * ucalls: calls and latency of user-space functions of one process.
 *
 * The broker attaches ucall_entry (uprobe) and ucall_return (uretprobe) to
 * each function the client chose, one attachment per function, with the
 * function's index in the client's list as the bpf cookie. target_pid is
 * the tgid the broker verified the caller owns (the uprobes are opened
 * for that pid too; the knob also drops events from other processes that
 * map the same library).
 */
#include "gfxbpf.h"

#define MAX_FUNCTIONS 64

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;

struct entry_key {
	__u32 tid;
	__u32 function;  /* nested traced calls on one thread keep apart */
};

struct latency_key {
	__u32 function;
	__u32 slot;
};

/* function index -> calls */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FUNCTIONS);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps");

/* (function index, log2(ns)) -> returns */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FUNCTIONS * GFX_SLOTS);
	__type(key, struct latency_key);
	__type(value, __u64);
} latency SEC(".maps");

/* (thread, function) -> entry time; LRU so lost returns cannot fill it */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 10240);
	__type(key, struct entry_key);
	__type(value, __u64);
} entry_ts SEC(".maps");

static __always_inline int in_scope(void)
{
	return gfx_tgid_ok(target_pid) && gfx_uid_ok(target_uid);
}

SEC("uprobe")
int ucall_entry(struct pt_regs *ctx)
{
	struct entry_key key;
	__u64 ts;

	if (!in_scope())
		return 0;
	key.function = (__u32)bpf_get_attach_cookie(ctx);
	if (key.function >= MAX_FUNCTIONS)
		return 0;
	key.tid = (__u32)bpf_get_current_pid_tgid();
	ts = bpf_ktime_get_ns();
	gfx_count(&calls, &key.function, 1);
	bpf_map_update_elem(&entry_ts, &key, &ts, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int ucall_return(struct pt_regs *ctx)
{
	struct latency_key lkey;
	struct entry_key key;
	__u64 *start, delta;

	if (!in_scope())
		return 0;
	key.function = (__u32)bpf_get_attach_cookie(ctx);
	if (key.function >= MAX_FUNCTIONS)
		return 0;
	key.tid = (__u32)bpf_get_current_pid_tgid();
	start = bpf_map_lookup_elem(&entry_ts, &key);
	if (!start)
		return 0;  /* entered before we attached */
	delta = bpf_ktime_get_ns() - *start;
	bpf_map_delete_elem(&entry_ts, &key);
	lkey.function = key.function;
	lkey.slot = gfx_log2(delta);
	gfx_count(&latency, &lkey, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
