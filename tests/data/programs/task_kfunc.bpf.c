// A kfunc declared as libbpf-tools' sigsnoop declares it: `bpf_task_from_pid`
// with its parameter unnamed in BTF, a global subprogram beside it (so that
// func and line info show in the translated code), compiled at test time by
// tests/kernel/test_kfunc_btf.py. The kernel checks a global FUNC's
// parameters by name: the loader must name them before BPF_BTF_LOAD.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
struct task_struct {
	int pid;
}; // never read: only its kind must match the kernel's
extern struct task_struct *bpf_task_from_pid(int) __ksym __weak;
extern void bpf_task_release(struct task_struct *) __ksym __weak;
__u64 found = 0;
__u32 target_pid = 0;

__attribute__((noinline)) int count_found(int hit)
{
	if (hit)
		found++;
	return hit;
}

SEC("tp_btf/sys_enter")
int task_lookup(unsigned long long *ctx)
{
	struct task_struct *t;

	if (!bpf_task_from_pid || !target_pid)
		return 0;
	t = bpf_task_from_pid(target_pid);
	if (!t)
		return count_found(0);
	bpf_task_release(t);
	return count_found(1);
}
