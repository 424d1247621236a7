// SPDX-License-Identifier: GPL-2.0
/*
 * bench/variant_cost.py: the same two values of sys_enter (syscall id, first
 * argument) read two ways, for the caller's process only:
 * - knob_reads: a tracepoint program at format-file offsets (.rodata knobs,
 *   as the catalog's tracefs builds read fields);
 * - typed_reads: a tp_btf program, the id from its arguments and the
 *   argument through the typed struct pt_regs pointer (a CO-RE load).
 */
#include "gfxbpf.h"

const volatile __u32 off_id = 8;    /* raw_syscalls:sys_enter: long id */
const volatile __u32 off_arg0 = 16; /* unsigned long args[6] */
const volatile __u32 target_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} sums SEC(".maps");

struct pt_regs {
	unsigned long di;
} __attribute__((preserve_access_index));

static __always_inline void add(__u64 id, __u64 arg0)
{
	__u32 k = id & 1;
	__u64 *v = bpf_map_lookup_elem(&sums, &k);

	if (v)
		__sync_fetch_and_add(v, arg0 + 1);
}

SEC("tracepoint/raw_syscalls/sys_enter")
int knob_reads(void *ctx)
{
	if ((bpf_get_current_pid_tgid() >> 32) != target_tgid)
		return 0;
	add(gfx_ctx_u64(ctx, off_id), gfx_ctx_u64(ctx, off_arg0));
	return 0;
}

SEC("tp_btf/sys_enter")
int typed_reads(unsigned long long *ctx)
{
	struct pt_regs *regs = (void *)ctx[0];

	if ((bpf_get_current_pid_tgid() >> 32) != target_tgid)
		return 0;
	add(ctx[1], regs->di);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
