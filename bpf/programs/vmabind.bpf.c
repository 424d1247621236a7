// SPDX-License-Identifier: GPL-2.0
/*
 * vmabind: i915 VMA binds and unbinds per GPU address space.
 *
 * The address space is the tracepoint's `vm` field, a kernel pointer. It
 * never reaches a client: vm_ids (broker-only) turns it into a small id
 * allocated from a counter, and the client-visible vm_stats is keyed by
 * that id. Id 0 collects address spaces that did not fit. A vm pointer
 * reused by the kernel after the address space was freed keeps the old id.
 */
#include "gfxbpf.h"

#define MAX_VMS 4096

/* i915_vma_bind / i915_vma_unbind: vm ptr@16, size u64@32 (6.2 .. 6.18). */
const volatile __u32 off_bind_vm = 16;
const volatile __u32 off_bind_size = 32;
const volatile __u32 off_unbind_vm = 16;
const volatile __u32 off_unbind_size = 32;

struct vm_stats {
	__u64 bytes_bound;    /* sum of bound sizes */
	__u64 bytes_unbound;  /* sum of unbound sizes; bound now = difference */
	__u64 binds;
	__u64 unbinds;
};

/* vm pointer -> id (broker-only: its keys are kernel addresses) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VMS);
	__type(key, __u64);
	__type(value, __u32);
} vm_ids SEC(".maps");

/* next id to hand out (broker-only) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} vm_id_next SEC(".maps");

/* address-space id -> counters */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VMS);
	__type(key, __u32);
	__type(value, struct vm_stats);
} vm_stats SEC(".maps");

/* log2(bind size in bytes) -> binds */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GFX_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} bind_size SEC(".maps");

/*
 * The id of an address space, allocated on first sight. The counter is
 * bumped with a plain atomic add (no fetch in the base instruction set), so
 * two CPUs may read the same value: creating the vm_stats row with
 * BPF_NOEXIST is what reserves an id, and a loser tries the next one.
 */
static __always_inline __u32 vm_id(__u64 vm)
{
	struct vm_stats zero = {};
	__u32 id = 0, key0 = 0, *idp;
	__u64 *next;

	idp = bpf_map_lookup_elem(&vm_ids, &vm);
	if (idp)
		return *idp;
	next = bpf_map_lookup_elem(&vm_id_next, &key0);
	if (!next)
		return 0;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u64 cand = *(volatile __u64 *)next + 1;

		__sync_fetch_and_add(next, 1);
		if (cand >= MAX_VMS)
			break;
		id = (__u32)cand;
		if (bpf_map_update_elem(&vm_stats, &id, &zero, BPF_NOEXIST) == 0)
			break;
		id = 0;
	}
	if (id) {
		if (bpf_map_update_elem(&vm_ids, &vm, &id, BPF_NOEXIST) == 0)
			return id;
		/* Another CPU named this vm first, or vm_ids is full. */
		bpf_map_delete_elem(&vm_stats, &id);
		idp = bpf_map_lookup_elem(&vm_ids, &vm);
		if (idp)
			return *idp;
	}
	id = 0;
	bpf_map_update_elem(&vm_stats, &id, &zero, BPF_NOEXIST);
	return 0;
}

SEC("tracepoint/i915/i915_vma_bind")
int vma_bind(void *ctx)
{
	__u64 vm = gfx_ctx_u64(ctx, off_bind_vm);
	__u64 size = gfx_ctx_u64(ctx, off_bind_size);
	struct vm_stats *st;
	__u32 id, slot;
	__u64 *bucket;

	id = vm_id(vm);
	st = bpf_map_lookup_elem(&vm_stats, &id);
	if (st) {
		__sync_fetch_and_add(&st->bytes_bound, size);
		__sync_fetch_and_add(&st->binds, 1);
	}
	slot = gfx_log2(size);
	bucket = bpf_map_lookup_elem(&bind_size, &slot);
	if (bucket)
		__sync_fetch_and_add(bucket, 1);
	return 0;
}

SEC("tracepoint/i915/i915_vma_unbind")
int vma_unbind(void *ctx)
{
	__u64 vm = gfx_ctx_u64(ctx, off_unbind_vm);
	__u64 size = gfx_ctx_u64(ctx, off_unbind_size);
	struct vm_stats *st;
	__u32 id;

	id = vm_id(vm);
	st = bpf_map_lookup_elem(&vm_stats, &id);
	if (st) {
		__sync_fetch_and_add(&st->bytes_unbound, size);
		__sync_fetch_and_add(&st->unbinds, 1);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
