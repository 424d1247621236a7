// The ids of every BPF map the kernel holds, one u32 each (iter/bpf_map).
// bpf/mapids.py runs it to see when a map a client kept is finally freed.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

struct seq_file;
// Only the members read here; CO-RE finds them in the running kernel's BTF.
struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));
struct bpf_map {
	__u32 id;
} __attribute__((preserve_access_index));
struct bpf_iter__bpf_map {
	struct bpf_iter_meta *meta;
	struct bpf_map *map;
} __attribute__((preserve_access_index));

SEC("iter/bpf_map")
int map_ids(struct bpf_iter__bpf_map *ctx)
{
	struct bpf_map *map = ctx->map;
	__u32 id;

	if (!map)
		return 0;
	id = map->id;
	bpf_seq_write(ctx->meta->seq, &id, sizeof(id));
	return 0;
}
