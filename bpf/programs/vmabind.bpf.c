// SPDX-License-Identifier: GPL-2.0
/*
 * vmabind: i915 VMA binds and unbinds per GPU address space.
 *
 * The address space is the tracepoint's `vm` field, a kernel pointer:
 * vm_ids (broker-only) turns it into a small id (gfx_vmid.h), and the
 * client-visible vm_stats is keyed by that id.
 */
#include "gfx_vmid.h"

#define MAX_VMS 4096

/* i915_vma_bind / i915_vma_unbind: vm ptr@16, size u64@32 (6.2 .. 6.18;
 * older kernels had a u32 size, hence the size knobs). */
const volatile __u32 off_bind_vm = 16;
const volatile __u32 off_bind_size = 32;
const volatile __u32 size_bind_size = 8;
const volatile __u32 off_unbind_vm = 16;
const volatile __u32 off_unbind_size = 32;
const volatile __u32 size_unbind_size = 8;

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

static __always_inline __u32 vm_id(__u64 vm)
{
	return gfx_vm_id(&vm_ids, &vm_id_next, &vm_stats, vm, MAX_VMS);
}

SEC("tracepoint/i915/i915_vma_bind")
int vma_bind(void *ctx)
{
	__u64 vm = gfx_ctx_u64(ctx, off_bind_vm);
	__u64 size = gfx_ctx_uint(ctx, off_bind_size, size_bind_size);
	__u32 slot;
	__u64 *bucket;

	gfx_vm_account(&vm_stats, vm_id(vm), size, 1);
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
	__u64 size = gfx_ctx_uint(ctx, off_unbind_size, size_unbind_size);
	gfx_vm_account(&vm_stats, vm_id(vm), size, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
