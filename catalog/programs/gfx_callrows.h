/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Call rows (ustacks, ustackcopy): calls of chosen user-space functions
 * counted per row, with the time spent in them. The program defines its
 * row, struct call_key, and GFX_CALL_ROWS (the most rows) before including
 * this. Its entry probe counts the call in `calls` and stores the entry
 * time and row in `entry_ts`; gfx_call_return() is its return probe's work.
 */
#ifndef GFX_CALLROWS_H
#define GFX_CALLROWS_H

#include "gfx_ucall.h"

struct call_stats {
	__u64 calls;     /* counted at entry */
	__u64 total_ns;  /* entry to return, added at return */
};

struct entry_val {
	__u64 ts;  /* first: gfx_entry_elapsed() reads it */
	struct call_key key;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GFX_CALL_ROWS);
	__type(key, struct call_key);
	__type(value, struct call_stats);
} calls SEC(".maps");

/* (thread, function) -> entry time and row; LRU so lost returns cannot fill it */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 10240);
	__type(key, struct entry_key);
	__type(value, struct entry_val);
} entry_ts SEC(".maps");

/* At function's return on this thread: add the call's time to its row. */
static __always_inline void gfx_call_return(__u32 function)
{
	struct call_stats *st;
	struct entry_val *ev;
	struct entry_key ek;
	__u64 delta;

	gfx_entry_key(&ek, function);
	ev = gfx_entry_elapsed(&entry_ts, &ek, &delta);
	if (!ev)
		return;  /* entered before we attached */
	st = bpf_map_lookup_elem(&calls, &ev->key);
	if (st)
		__sync_fetch_and_add(&st->total_ns, delta);
	bpf_map_delete_elem(&entry_ts, &ek);
}

#endif /* GFX_CALLROWS_H */
