/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Timing user-space calls with a uprobe at entry and a uretprobe at return
 * (cuda, ucalls, ustacks). The entry probe stores a record whose first
 * field is the entry time, keyed by thread and function; the return probe
 * finds it, takes the elapsed time and deletes it. Programs keep their own
 * record type, cookie layout and counters.
 */
#ifndef GFX_UCALL_H
#define GFX_UCALL_H

#include "gfx_rows.h"

/* A call in flight: nested traced calls on one thread keep apart by function. */
struct entry_key {
	__u32 tid;
	__u32 function;
};

/* (function index, log2(ns)) -> returns */
struct latency_key {
	__u32 function;
	__u32 slot;
};

/* The in-flight key of function on the current thread. */
static __always_inline void gfx_entry_key(struct entry_key *key, __u32 function)
{
	key->tid = (__u32)bpf_get_current_pid_tgid();
	key->function = function;
}

/*
 * The record the entry probe stored at key (its first __u64 is the entry
 * time) and, in *ns, the time since; NULL when the call entered before the
 * probes were attached.
 */
static __always_inline void *gfx_entry_elapsed(void *entries, const struct entry_key *key,
					       __u64 *ns)
{
	__u64 *ts = bpf_map_lookup_elem(entries, key);

	if (!ts)
		return NULL;
	*ns = bpf_ktime_get_ns() - *ts;
	return ts;
}

/* Count one return of function after ns in a latency_key histogram. */
static __always_inline void gfx_call_latency(void *latency, __u32 function, __u64 ns)
{
	struct latency_key lkey;

	lkey.function = function;
	lkey.slot = gfx_log2(ns);
	gfx_count(latency, &lkey, 1);
}

#endif /* GFX_UCALL_H */
