// A task iterator (iter/task): one line per task, and a count of its runs
// (tests/kernel/test_program_kinds.py compiles this at test time).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

struct seq_file;
struct task_struct;
// The kernel's context layout (the verifier checks these loads against
// vmlinux BTF): meta->seq and task are each the first member.
struct bpf_iter_meta {
	struct seq_file *seq;
};
struct bpf_iter__task {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
};

__u64 runs = 0;

SEC("iter/task")
int tasks(struct bpf_iter__task *ctx)
{
	static const char line[] = "task\n";

	if (!ctx->task)
		return 0;
	__sync_fetch_and_add(&runs, 1);
	bpf_seq_write(ctx->meta->seq, line, sizeof(line) - 1);
	return 0;
}
