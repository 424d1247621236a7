/* CO-RE against the running kernel's BTF (tests/kernel/test_core_conformance.py):
 * gfxbpf must load exactly the code `bpftool prog loadall` (libbpf) loads.
 * Local types are minimal, as a program built without vmlinux.h declares them:
 * a flavour for an old layout, a field no kernel has (guarded: its read is
 * poisoned and pruned), bitfields, type and enum relocations, and a
 * subprogram with relocations that two programs append. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

struct mm_struct {
	unsigned long total_vm;
} __attribute__((preserve_access_index));

struct task_struct {
	unsigned int __state;
	int pid;
	int tgid;
	struct task_struct *real_parent;
	struct mm_struct *mm;
	char comm[16];
	unsigned int in_execve : 1;
	unsigned int frozen : 1;
	int no_such_field;
} __attribute__((preserve_access_index));

struct task_struct___old {
	long state;
} __attribute__((preserve_access_index));

struct gfxbpf_not_a_kernel_type {
	int x;
};

/* Matches the kernel's list_head; task_struct above does not (no_such_field).
 * clang 14 cannot emit TYPE_MATCHES: the kernel test turns these two
 * type-exists records into type-matches ones. */
struct list_head {
	struct list_head *next, *prev;
};

enum pid_type { PIDTYPE_PID, PIDTYPE_TGID, PIDTYPE_GFXBPF_NONE };
/* An ENUM64 in the kernel's BTF (values near 2^64), a 32-bit enum here. */
enum perf_callchain_context { PERF_CONTEXT_KERNEL = 1 };

long total;
char last_comm[16];

static __attribute__((noinline)) long parent_tgid(struct task_struct *t)
{
	return BPF_CORE_READ(t, real_parent, tgid);
}

SEC("raw_tracepoint/sys_enter")
int core_fields(void *ctx)
{
	struct task_struct *t = (void *)bpf_get_current_task();
	long v = BPF_CORE_READ(t, pid) + BPF_CORE_READ(t, tgid);

	v += BPF_CORE_READ(t, mm, total_vm);
	if (bpf_core_field_exists(t->__state)) {
		v += BPF_CORE_READ(t, __state);
	} else {
		struct task_struct___old *o = (void *)t;

		v += BPF_CORE_READ(o, state);
	}
	if (bpf_core_field_exists(t->no_such_field))
		v += BPF_CORE_READ(t, no_such_field);
	BPF_CORE_READ_STR_INTO(&last_comm, t, comm);
	v += parent_tgid(t);
	__sync_fetch_and_add(&total, v);
	return 0;
}

SEC("raw_tracepoint/sys_exit")
int core_kinds(void *ctx)
{
	struct task_struct *t = (void *)bpf_get_current_task();
	long v = BPF_CORE_READ_BITFIELD_PROBED(t, in_execve);

	v += BPF_CORE_READ_BITFIELD_PROBED(t, frozen);
	v += bpf_core_field_size(t->comm) + bpf_core_field_offset(t->comm);
	v += bpf_core_type_exists(struct gfxbpf_not_a_kernel_type);
	v += bpf_core_type_exists(struct list_head) << 1;
	v += bpf_core_type_exists(struct task_struct) << 2;
	v += bpf_core_type_size(struct task_struct);
	v += bpf_core_type_id_kernel(struct task_struct);
	v += bpf_core_type_id_local(struct task_struct);
	v += bpf_core_enum_value(enum pid_type, PIDTYPE_TGID);
	v += bpf_core_enum_value(enum perf_callchain_context, PERF_CONTEXT_KERNEL);
	if (bpf_core_enum_value_exists(enum pid_type, PIDTYPE_GFXBPF_NONE))
		v += bpf_core_enum_value(enum pid_type, PIDTYPE_GFXBPF_NONE);
	v += parent_tgid(t);
	__sync_fetch_and_add(&total, v);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
