// A typed __ksym (tests/kernel/test_externs.py compiles this at test time).
// The kernel resolves a typed ksym's address with kallsyms, which lists
// variables only with CONFIG_KALLSYMS_ALL.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

extern const int bpf_prog_active __ksym; // a per-CPU variable in vmlinux BTF

int seen = 0;

SEC("tp_btf/sys_enter")
int typed_ksym(unsigned long long *ctx)
{
	const int *active = bpf_this_cpu_ptr(&bpf_prog_active);

	seen = active ? *active : -1;
	return 0;
}
