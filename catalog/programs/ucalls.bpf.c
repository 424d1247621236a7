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
#include "gfx_tree.h"
#include "gfx_ucall.h"

#define MAX_FUNCTIONS 64

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;
GFX_TREE_PROGRAMS(target_pid)

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

SEC("uprobe")
int ucall_entry(struct pt_regs *ctx)
{
	struct entry_key key;
	__u64 ts;

	__u32 function = (__u32)bpf_get_attach_cookie(ctx);

	if (!gfx_tree_ok(target_pid) || !gfx_uid_ok(target_uid) || function >= MAX_FUNCTIONS)
		return 0;
	gfx_entry_key(&key, function);
	ts = bpf_ktime_get_ns();
	gfx_count(&calls, &key.function, 1);
	bpf_map_update_elem(&entry_ts, &key, &ts, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int ucall_return(struct pt_regs *ctx)
{
	__u32 function = (__u32)bpf_get_attach_cookie(ctx);
	struct entry_key key;
	__u64 delta;

	if (!gfx_tree_ok(target_pid) || !gfx_uid_ok(target_uid) || function >= MAX_FUNCTIONS)
		return 0;
	gfx_entry_key(&key, function);
	if (!gfx_entry_elapsed(&entry_ts, &key, &delta))
		return 0;  /* entered before we attached */
	bpf_map_delete_elem(&entry_ts, &key);
	gfx_call_latency(&latency, function, delta);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
