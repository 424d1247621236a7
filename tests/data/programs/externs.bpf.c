// .kconfig, __ksym and kfunc externs (tests/kernel/test_externs.py compiles
// this at test time, loads it with gfxbpf and bpftool, and runs it).
#include <linux/bpf.h>
#include <stdbool.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

extern int LINUX_KERNEL_VERSION __kconfig;
extern bool LINUX_HAS_BPF_COOKIE __kconfig;
extern bool CONFIG_BPF_SYSCALL __kconfig;
extern int CONFIG_HZ __kconfig __weak;
extern enum libbpf_tristate CONFIG_BPF_JIT __kconfig __weak;
extern char CONFIG_DEFAULT_HOSTNAME[16] __kconfig __weak;
extern bool CONFIG_GFXBPF_NOT_AN_OPTION __kconfig __weak;

extern const void vfs_read __ksym;       // typeless: its address, from /proc/kallsyms

extern void bpf_rcu_read_lock(void) __ksym;
extern void bpf_rcu_read_unlock(void) __ksym;

const volatile __u32 target_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, __u64);
} out SEC(".maps");

static void put(__u32 i, __u64 v)
{
	bpf_map_update_elem(&out, &i, &v, BPF_ANY);
}

SEC("raw_tp/sys_enter")
int kconfig_values(void *ctx)
{
	if ((bpf_get_current_pid_tgid() >> 32) != target_tgid)
		return 0;
	put(0, LINUX_KERNEL_VERSION);
	put(1, LINUX_HAS_BPF_COOKIE);
	put(2, CONFIG_BPF_SYSCALL);
	put(3, CONFIG_HZ);
	put(4, CONFIG_BPF_JIT);
	put(5, CONFIG_GFXBPF_NOT_AN_OPTION);
	put(6, *(__u64 *)CONFIG_DEFAULT_HOSTNAME);
	return 0;
}

SEC("tp_btf/sys_enter")
int ksyms(unsigned long long *ctx)
{
	if ((bpf_get_current_pid_tgid() >> 32) != target_tgid)
		return 0;
	bpf_rcu_read_lock();
	put(7, (__u64)&vfs_read);
	bpf_rcu_read_unlock();
	return 0;
}
