// SPDX-License-Identifier: GPL-2.0
/*
 * A test object the broker's static audit must refuse: it prints into the
 * global trace pipe (bpf_trace_printk) instead of using a ring buffer.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("raw_tracepoint/sys_enter")
int chatty(struct bpf_raw_tracepoint_args *ctx)
{
	bpf_printk("syscall %ld", ctx->args[1]);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
