// SPDX-License-Identifier: GPL-2.0
/*
 * A test object the broker's static audit must refuse: it writes into the
 * memory of the process that calls openat() (bpf_probe_write_user). It is
 * otherwise an ordinary tracepoint program, so only the helper check stops
 * it. Never load it anywhere else.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} writes SEC(".maps");

/* sys_enter_openat: 8-byte header, int __syscall_nr (+pad), then the args;
 * `filename` is the second argument, at offset 24. */
SEC("tracepoint/syscalls/sys_enter_openat")
int clobber_path(void *ctx)
{
	const char evil[2] = "X";
	__u64 where = *(__u64 *)((char *)ctx + 24);
	__u32 key = 0;
	__u64 one = 1;

	bpf_probe_write_user((void *)where, evil, 1);
	bpf_map_update_elem(&writes, &key, &one, BPF_ANY);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
