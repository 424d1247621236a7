// A map-in-map and a program array with initial values (`.values = {...}`)
// (tests/kernel/test_program_kinds.py compiles this at test time).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

struct inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
};

struct inner first SEC(".maps"), second SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 4);
	__type(key, __u32);
	__array(values, struct inner);
} outer SEC(".maps") = {
	.values = { [0] = &first, [2] = &second },
};

SEC("raw_tp/sys_enter")
int leaf(void *ctx)
{
	return 0;
}

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 2);
	__uint(key_size, sizeof(__u32));
	__array(values, int (void *));
} jump SEC(".maps") = {
	.values = { [1] = (void *)&leaf },
};

SEC("raw_tp/sys_enter")
int counts(void *ctx)
{
	__u32 zero = 0, slot = 2;
	void *in = bpf_map_lookup_elem(&outer, &slot);
	__u64 *n;

	if (!in)
		return 0;
	n = bpf_map_lookup_elem(in, &zero);
	if (n)
		__sync_fetch_and_add(n, 1);
	bpf_tail_call(ctx, &jump, 1);
	return 0;
}
