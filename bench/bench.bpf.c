// SPDX-License-Identifier: GPL-2.0
/*
 * bench/'s own programs, built with the catalog by tools/build_bpf.py and
 * committed as bench.bpf.o (never part of the catalog, never loaded by the
 * broker):
 * - empty_*: return at once, on the tracepoints the catalog programs use, so
 *   the cost of the tracepoint and of a BPF call is measured apart from the
 *   program's work (the floor);
 * - stream_sys_enter: one 16-byte ring-buffer record per system call of one
 *   process, counting records the ring had no room for; committed as the
 *   catalog's programs commit (no wake-up), or with a wake-up each when
 *   wake_each is set (the bench measures what the suppression saves).
 */
#include "gfxbpf.h"
#include "gfxbpf_ring.h"

const volatile __u32 target_pid = GFX_ANY;
const volatile __u32 wake_each = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 << 20); /* 2.7M records: the bench's 2M fit */
} records SEC(".maps");

/* [0] records written, [1] records the ring had no room for */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} tally SEC(".maps");

struct record {
	__u64 ts;
	__u64 nr;
};

SEC("tracepoint/raw_syscalls/sys_enter")
int empty_sys_enter(void *ctx)
{
	return 0;
}

SEC("tracepoint/sched/sched_process_exec")
int empty_exec(void *ctx)
{
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_clone")
int empty_clone(void *ctx)
{
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_clone3")
int empty_clone3(void *ctx)
{
	return 0;
}

static __always_inline void tally_add(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&tally, &slot);

	if (v)
		__sync_fetch_and_add(v, 1);
}

SEC("tracepoint/raw_syscalls/sys_enter")
int stream_sys_enter(__u64 *ctx)
{
	struct record *r;

	if (!gfx_tgid_ok(target_pid))
		return 0;
	r = bpf_ringbuf_reserve(&records, sizeof(*r), 0);
	if (!r) {
		tally_add(1);
		return 0;
	}
	r->ts = bpf_ktime_get_ns();
	r->nr = ctx[1]; /* raw_syscalls:sys_enter: 8-byte common header, then long id */
	if (wake_each)
		bpf_ringbuf_submit(r, 0); /* the kernel's default: wake a caught-up reader */
	else
		gfx_ringbuf_submit(&records, r, sizeof(*r)); /* as catalog programs do */
	tally_add(0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
