// A BPF_USDT program (libbpf's usdt.bpf.h): counts the hits of a USDT probe
// and sums its arguments (tests/kernel/test_usdt.py compiles this at test time).
#define __TARGET_ARCH_x86
#include <linux/bpf.h>
#include <asm/ptrace.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

char LICENSE[] SEC("license") = "GPL";

__u64 hits = 0;
__s64 sum_first = 0;  // a signed int argument, from a register
__s64 sum_second = 0; // a negative constant or a stack slot
__u64 cookie = 0;
__u64 gated_hits = 0;

SEC("usdt")
int BPF_USDT(tick, int i, long minus_seven)
{
	__sync_fetch_and_add(&hits, 1);
	__sync_fetch_and_add(&sum_first, i);
	__sync_fetch_and_add(&sum_second, minus_seven);
	cookie = bpf_usdt_cookie(ctx);
	return 0;
}

SEC("usdt")
int BPF_USDT(gated, int i)
{
	__sync_fetch_and_add(&gated_hits, 1);
	return 0;
}
