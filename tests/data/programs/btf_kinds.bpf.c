// BTF kinds that older kernels refuse in BPF_BTF_LOAD (FLOAT 5.13, DECL_TAG
// 5.16, TYPE_TAG 5.17, ENUM64 6.0) in a map's value type and on a global
// subprogram; tests/kernel/test_btf_sanitize.py compiles this at test time
// and loads it with its BTF rewritten as libbpf rewrites it for such kernels.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";

enum wide { WIDE_SMALL = 1, WIDE_BIG = 0x100000000ULL };
enum sign { SIGN_NEG = -1, SIGN_POS = 1 };

struct value {
	float ratio;
	enum wide w;
	enum sign s;
	int __attribute__((btf_type_tag("user"))) *p;
	__u64 n;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct value);
} values SEC(".maps");

__attribute__((noinline)) __attribute__((btf_decl_tag("counted"))) int bump(struct value *v)
{
	if (!v)
		return 0;
	v->n++;
	return 1;
}

SEC("raw_tracepoint/sys_enter")
int kinds(void *ctx)
{
	__u32 zero = 0;

	return bump(bpf_map_lookup_elem(&values, &zero));
}
