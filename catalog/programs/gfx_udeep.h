/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Deep stack copies, for programs that copy rarely (cudakernels: a chain's
 * 1st, 2nd, 4th ... launch) from deep under a library: cuBLASLt launches
 * 68-70 KiB below the stack's top on an H200 (docs/gpu-hosts.md), past the
 * GFX_COPY_MAX a per-CPU scratch record holds (gfx_ucopy.h). The record is
 * reserved in the ring itself, sized to the stack that exists (up to the end
 * of sp's mapping, then a walk of its pages), and filled a page at a time
 * through the scratch record's stack; the header goes in last. The record's
 * layout is gfx_ucopy.h's, so clients read both alike.
 *
 * The includer defines GFX_DEEP_COPY_MAX (a multiple of GFX_PAGE): the most
 * a copy takes, whatever stack_bytes says.
 */
#ifndef GFX_UDEEP_H
#define GFX_UDEEP_H

#include "gfx_pathhash.h"  /* gfx_path_vma_cb: the mapping that holds an address */
#include "gfx_ucopy.h"

#ifndef GFX_DEEP_COPY_MAX
#error "define GFX_DEEP_COPY_MAX before including gfx_udeep.h"
#endif

/* Bytes from sp to the end of its mapping, the thread's stack (its top and
 * TLS), up to want: a thread's stack may lie below other readable memory,
 * which a copy need not take (a PyTorch launch 15 KiB deep would copy 72).
 * want itself where the lookup fails (the mm's lock busy). */
static __always_inline __u32 gfx_udeep_stack_left(__u64 sp, __u32 want)
{
	struct gfx_path_vma seen = {};

	bpf_find_vma(bpf_get_current_task_btf(), sp, gfx_path_vma_cb, &seen, 0);
	if (seen.end > sp && seen.end - sp < want)
		return (__u32)(seen.end - sp);
	return want;
}

/* Bytes readable from sp, up to want: one byte per page, since a page is
 * readable whole or not at all. */
static __always_inline __u32 gfx_udeep_readable(__u64 sp, __u32 want)
{
	__u32 off = 0, chunk = GFX_PAGE - (__u32)(sp & (GFX_PAGE - 1));
	char byte;
	int i;

	for (i = 0; i < GFX_DEEP_COPY_MAX / GFX_PAGE + 1; i++) {
		if (off >= want || bpf_probe_read_user(&byte, 1, (void *)(sp + off)))
			break;
		off += chunk;
		chunk = GFX_PAGE;
	}
	return off < want ? off : want;
}

/* Copy the stack above r->sp (r from gfx_urec_start, registers set) and send
 * it, or count it in `lost` when the ring is full. */
static __always_inline void gfx_udeep_send(struct ustack_rec *r)
{
	__u32 want = stack_bytes < GFX_DEEP_COPY_MAX ? stack_bytes : GFX_DEEP_COPY_MAX;
	__u32 have = gfx_udeep_readable(r->sp, gfx_udeep_stack_left(r->sp, want));
	__u32 off = 0, chunk = GFX_PAGE - (__u32)(r->sp & (GFX_PAGE - 1));
	__u64 n, o, avail, mark, wake = BPF_RB_NO_WAKEUP;
	struct bpf_dynptr rec;
	__u32 zero = 0;
	int i;

	if (have < want)
		r->flags |= GFX_UREC_SHORT;
	if (bpf_ringbuf_reserve_dynptr(&stack_copies, GFX_UREC_HDR + have, 0, &rec)) {
		bpf_ringbuf_discard_dynptr(&rec, 0);  /* released even when none was made */
		gfx_count(&lost, &zero, 1);
		return;
	}
	for (i = 0; i < GFX_DEEP_COPY_MAX / GFX_PAGE + 1; i++) {
		if (off >= have)
			break;
		if (chunk > have - off)
			chunk = have - off;
		n = chunk;
		o = off;
		asm volatile("" : "+r"(n), "+r"(o));  /* bounds the verifier can use, as gfx_urec_copy */
		if (n > GFX_PAGE || o >= GFX_DEEP_COPY_MAX)
			break;
		if (bpf_probe_read_user(r->stack, n, (void *)(r->sp + o)) ||
		    bpf_dynptr_write(&rec, GFX_UREC_HDR + o, r->stack, n, 0))
			break;
		off += chunk;
		chunk = GFX_PAGE;
	}
	if (off < have) {
		/* A page gone since the walk (unmapped meanwhile): the reservation's
		 * rest holds none of this copy; drop the record rather than send it. */
		bpf_ringbuf_discard_dynptr(&rec, 0);
		gfx_count(&lost, &zero, 1);
		return;
	}
	r->size = have;
	bpf_dynptr_write(&rec, 0, r, GFX_UREC_HDR, 0);
	/* As gfx_urec_send: wake the reader only as the ring passes a quarter. */
	avail = bpf_ringbuf_query(&stack_copies, BPF_RB_AVAIL_DATA);
	mark = bpf_ringbuf_query(&stack_copies, BPF_RB_RING_SIZE) / 4;
	if (avail >= mark && avail < mark + GFX_UREC_HDR + GFX_DEEP_COPY_MAX + 8)
		wake = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit_dynptr(&rec, wake);
}

#endif /* GFX_UDEEP_H */
