/* SPDX-License-Identifier: GPL-2.0 */
/*
 * VMA binds and unbinds per GPU address space (vmabind for i915, xe): the
 * maps both programs expose and the one function that fills them. Include
 * it once, from the program; its maps are the program's maps.
 */
#ifndef GFX_VMBIND_H
#define GFX_VMBIND_H

#include "gfx_vmid.h"

#define MAX_VMS 4096

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

/* Count one bind (or unbind, when !bind) of size bytes in address space vm. */
static __always_inline void gfx_vma_bind(__u64 vm, __u64 size, int bind)
{
	__u32 id = gfx_vm_id(&vm_ids, &vm_id_next, &vm_stats, vm, MAX_VMS);
	__u32 slot;
	__u64 *bucket;

	gfx_vm_account(&vm_stats, id, size, bind);
	if (!bind)
		return;
	slot = gfx_log2(size);
	bucket = bpf_map_lookup_elem(&bind_size, &slot);
	if (bucket)
		__sync_fetch_and_add(bucket, 1);
}

#endif /* GFX_VMBIND_H */
