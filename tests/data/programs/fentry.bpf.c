// An fentry program (tests/kernel/test_program_kinds.py compiles this at test
// time): counts vfs_read calls of one process.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 target_tgid = 0;
__u64 reads = 0;

SEC("fentry/vfs_read")
int on_vfs_read(unsigned long long *ctx)
{
	if ((bpf_get_current_pid_tgid() >> 32) == target_tgid)
		__sync_fetch_and_add(&reads, 1);
	return 0;
}
