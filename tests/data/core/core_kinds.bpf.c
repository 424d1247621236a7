/* Every CO-RE relocation kind that clang 14 emits, for the offline tests
 * (tests/unit/test_core.py) against target_new/target_old's BTF. Never
 * loaded: its types are not the kernel's. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

struct mm_struct {
	unsigned long total_vm;
} __attribute__((preserve_access_index));

struct task_struct {
	long __state;
	int pid;
	int anon_b;
	char comm[16];
	unsigned int prio : 5;
	int nice : 7;
	struct mm_struct *mm;
	unsigned int usage;
	int weight;
	int missing;
} __attribute__((preserve_access_index));

struct task_struct___old {
	long state;
} __attribute__((preserve_access_index));

enum rq_state { RQ_IDLE, RQ_BUSY, RQ_OLD };

struct only_new {
	int x;
};
struct not_anywhere {
	int y;
};
union u_thing {
	int a;
};
struct amb {
	int x;
} __attribute__((preserve_access_index));

long out;

SEC("raw_tracepoint/fields")
int fields(void *ctx)
{
	struct task_struct *t = (void *)bpf_get_current_task();
	long v = 0;

	v += BPF_CORE_READ(t, pid);
	v += BPF_CORE_READ(t, mm, total_vm);
	v += BPF_CORE_READ(t, anon_b);
	if (bpf_core_field_exists(t->__state)) {
		v += BPF_CORE_READ(t, __state);
	} else {
		struct task_struct___old *o = (void *)t;

		v += BPF_CORE_READ(o, state);
	}
	if (bpf_core_field_exists(t->missing))
		v += BPF_CORE_READ(t, missing);
	v += bpf_core_field_size(t->comm);
	v += bpf_core_field_offset(t->comm);
	out = v;
	return 0;
}

SEC("raw_tracepoint/bitfields")
int bitfields(void *ctx)
{
	struct task_struct *t = (void *)bpf_get_current_task();

	out = BPF_CORE_READ_BITFIELD_PROBED(t, prio) + BPF_CORE_READ_BITFIELD_PROBED(t, nice);
	return 0;
}

SEC("raw_tracepoint/types")
int types(void *ctx)
{
	long v = 0;

	v += bpf_core_type_exists(struct only_new);
	v += bpf_core_type_exists(struct not_anywhere);
	v += bpf_core_type_size(struct task_struct);
	v += bpf_core_type_size(struct not_anywhere);
	v += bpf_core_type_id_local(struct task_struct);
	v += bpf_core_type_id_kernel(struct task_struct);
	v += bpf_core_type_exists(union u_thing);
	out = v;
	return 0;
}

SEC("raw_tracepoint/enums")
int enums(void *ctx)
{
	long v = 0;

	v += bpf_core_enum_value_exists(enum rq_state, RQ_OLD);
	v += bpf_core_enum_value(enum rq_state, RQ_BUSY);
	if (bpf_core_enum_value_exists(enum rq_state, RQ_OLD))
		v += bpf_core_enum_value(enum rq_state, RQ_OLD);
	out = v;
	return 0;
}

/* Direct loads (LDX) carry the offset relocation in the instruction itself,
 * with its size: usage is 4 bytes here, 4 in target_new, 8 in target_old
 * (unsigned: the load grows); weight is a signed int here and a long in
 * target_old, which no load size can fix: poisoned. */
SEC("raw_tracepoint/direct")
int direct(struct task_struct *t)
{
	out = t->pid + t->usage + t->weight;
	return 0;
}

/* Two flavours of struct amb in target_new put x at different offsets. */
SEC("raw_tracepoint/ambiguous")
int ambiguous(struct amb *a)
{
	out = a->x;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
