// Test programs for the BTF-typed and kprobe program kinds
// (tests/kernel/test_program_kinds.py compiles this at test time).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

#define NR_GETPPID 110 /* x86-64 */

const volatile __u32 target_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} hits SEC(".maps");

static void count(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&hits, &zero);

	if (n)
		__sync_fetch_and_add(n, 1);
}

// BTF-typed tracepoint: ctx holds sys_enter's arguments (regs, id) as u64s.
SEC("tp_btf/sys_enter")
int getppid_enter(unsigned long long *ctx)
{
	if (ctx[1] != NR_GETPPID)
		return 0;
	if ((bpf_get_current_pid_tgid() >> 32) != target_tgid)
		return 0;
	count();
	return 0;
}

// Loads everywhere; attaching needs kprobes (CONFIG_KPROBES).
SEC("?kprobe/do_getppid_unused")
int kprobe_prog(void *ctx)
{
	count();
	return 0;
}

SEC("?ksyscall/getppid")
int ksyscall_prog(void *ctx)
{
	count();
	return 0;
}
