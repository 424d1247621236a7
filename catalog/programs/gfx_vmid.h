/* SPDX-License-Identifier: GPL-2.0 */
/*
 * GPU address spaces named by small ids instead of kernel pointers.
 *
 * A driver's tracepoint names an address space by its `vm` pointer. That
 * must never reach a client, so a broker-only hash map turns each pointer
 * into an id allocated from a counter, and client-visible maps are keyed by
 * the id. Id 0 collects address spaces that did not fit. A pointer reused
 * by the kernel after its address space was freed keeps the old id.
 */
#ifndef GFX_VMID_H
#define GFX_VMID_H

#include "gfxbpf.h"

struct vm_stats {
	__u64 bytes_bound;    /* sum of bound sizes */
	__u64 bytes_unbound;  /* sum of unbound sizes; bound now = difference */
	__u64 binds;
	__u64 unbinds;
};

/*
 * The id of address space vm, allocated on first sight. ids: u64 pointer ->
 * u32 id (hash, broker-only); next: a one-slot u64 array; stats: u32 id ->
 * struct vm_stats, at most max_ids rows. The counter is bumped with a plain
 * atomic add (no fetch in the base instruction set), so two CPUs may read
 * the same value: creating the stats row with BPF_NOEXIST is what reserves
 * an id, and a loser tries the next one.
 */
static __always_inline __u32 gfx_vm_id(void *ids, void *next_map, void *stats, __u64 vm,
				       __u32 max_ids)
{
	struct vm_stats zero = {};
	__u32 id = 0, key0 = 0, *idp;
	__u64 *next;

	idp = bpf_map_lookup_elem(ids, &vm);
	if (idp)
		return *idp;
	next = bpf_map_lookup_elem(next_map, &key0);
	if (!next)
		return 0;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u64 cand = *(volatile __u64 *)next + 1;

		__sync_fetch_and_add(next, 1);
		if (cand >= max_ids)
			break;
		id = (__u32)cand;
		if (bpf_map_update_elem(stats, &id, &zero, BPF_NOEXIST) == 0)
			break;
		id = 0;
	}
	if (id) {
		if (bpf_map_update_elem(ids, &vm, &id, BPF_NOEXIST) == 0)
			return id;
		/* Another CPU named this vm first, or the id map is full. */
		bpf_map_delete_elem(stats, &id);
		idp = bpf_map_lookup_elem(ids, &vm);
		if (idp)
			return *idp;
	}
	id = 0;
	bpf_map_update_elem(stats, &id, &zero, BPF_NOEXIST);
	return 0;
}

/* Count one bind (or unbind, when !bind) of size bytes in vm's row. */
static __always_inline void gfx_vm_account(void *stats, __u32 id, __u64 size, int bind)
{
	struct vm_stats *st = bpf_map_lookup_elem(stats, &id);

	if (!st)
		return;
	if (bind) {
		__sync_fetch_and_add(&st->bytes_bound, size);
		__sync_fetch_and_add(&st->binds, 1);
	} else {
		__sync_fetch_and_add(&st->bytes_unbound, size);
		__sync_fetch_and_add(&st->unbinds, 1);
	}
}

#endif /* GFX_VMID_H */
