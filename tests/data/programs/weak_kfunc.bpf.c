// __weak kfuncs tested with `if (kfunc)` before the call: one this kernel
// lacks, one it has (tests/kernel/test_externs.py compiles this at test time).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
extern void bpf_gfx_no_such_kfunc(void) __ksym __weak;
extern void bpf_rcu_read_lock(void) __ksym __weak;
extern void bpf_rcu_read_unlock(void) __ksym __weak;
__u64 seen = 0; // bit 0: the missing kfunc ran (never), bit 1: the present one
SEC("tp_btf/sys_enter")
int weak_kfuncs(unsigned long long *ctx)
{
	if (bpf_gfx_no_such_kfunc) {
		bpf_gfx_no_such_kfunc();
		seen |= 1;
	}
	if (bpf_rcu_read_lock) {
		bpf_rcu_read_lock();
		seen |= 2;
		bpf_rcu_read_unlock();
	}
	return 0;
}
