// SPDX-License-Identifier: GPL-2.0
/*
 * clonecount: clone() and clone3() calls per command name, for every uid
 * (scope system) or the caller's uid (scope self: target_uid).
 */
#include "gfxbpf.h"

const volatile __u32 target_uid = GFX_ANY;

struct comm_key {
	char comm[16];
};

/* command name of the caller -> clone/clone3 calls; room for 16384 names
 * (a busy host, or bench/'s 10,000-entry map read) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct comm_key);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline int count_clone(void)
{
	struct comm_key key;

	if (!gfx_uid_ok(target_uid))
		return 0;
	/* Zero first: the whole key is hashed, bytes after the NUL included. */
	__builtin_memset(&key, 0, sizeof(key));
	bpf_get_current_comm(key.comm, sizeof(key.comm));
	gfx_count(&counts, &key, 1);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_clone")
int enter_clone(void *ctx)
{
	return count_clone();
}

SEC("tracepoint/syscalls/sys_enter_clone3")
int enter_clone3(void *ctx)
{
	return count_clone();
}

char LICENSE[] SEC("license") = "GPL";
