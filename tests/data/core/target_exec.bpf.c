/* A stand-in "kernel" for execsnoop's tp_btf build: only its BTF is used.
 * task_struct.pid and linux_binprm.filename sit at other offsets than in
 * this machine's kernel, as after a field moves in a later release. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct task_struct {
	long state;
	void *stack;
	unsigned int flags;
	int prio;
	int pid; /* byte 24 */
};

struct linux_binprm {
	char buf[128];
	void *mm;
	const char *filename; /* byte 136 */
};

struct task_struct t_task;
struct linux_binprm t_bprm;

char LICENSE[] SEC("license") = "GPL";
