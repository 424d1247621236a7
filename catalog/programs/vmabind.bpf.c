// SPDX-License-Identifier: GPL-2.0
/*
 * vmabind: i915 VMA binds and unbinds per GPU address space.
 *
 * The address space is the tracepoint's `vm` field, a kernel pointer:
 * vm_ids (broker-only) turns it into a small id (gfx_vmid.h), and the
 * client-visible vm_stats is keyed by that id; the maps and their filling
 * are shared with xe (gfx_vmbind.h).
 */
#include "gfx_vmbind.h"

/* i915_vma_bind / i915_vma_unbind: vm ptr@16, size u64@32 (6.2 .. 6.18;
 * older kernels had a u32 size, hence the size knobs). */
const volatile __u32 off_bind_vm = 16;
const volatile __u32 off_bind_size = 32;
const volatile __u32 size_bind_size = 8;
const volatile __u32 off_unbind_vm = 16;
const volatile __u32 off_unbind_size = 32;
const volatile __u32 size_unbind_size = 8;

SEC("tracepoint/i915/i915_vma_bind")
int vma_bind(void *ctx)
{
	gfx_vma_bind(gfx_ctx_u64(ctx, off_bind_vm),
		     gfx_ctx_uint(ctx, off_bind_size, size_bind_size), 1);
	return 0;
}

SEC("tracepoint/i915/i915_vma_unbind")
int vma_unbind(void *ctx)
{
	gfx_vma_bind(gfx_ctx_u64(ctx, off_unbind_vm),
		     gfx_ctx_uint(ctx, off_unbind_size, size_unbind_size), 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
