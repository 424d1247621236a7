// SPDX-License-Identifier: GPL-2.0
/*
 * A test object the broker's static audit must refuse: a typeless __ksym is
 * a kernel address (here vfs_read's), which this program copies into a map
 * that clients would read, defeating KASLR. It uses only allowed helpers and
 * an allowed program kind, so only the extern check stops it. Never load it
 * anywhere else.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

extern const void vfs_read __ksym;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} leaked SEC(".maps");

SEC("raw_tracepoint/sys_enter")
int leak_address(void *ctx)
{
	__u32 key = 0;
	__u64 addr = (__u64)&vfs_read;

	bpf_map_update_elem(&leaked, &key, &addr, BPF_ANY);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
