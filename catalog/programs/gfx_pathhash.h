/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A row key for the calling path of a probed call, without unwinding
 * (ustackcopy): FNV-1a over the words at the top of the user stack, from
 * sp + 8 up, that point into an executable mapping of the process. Return
 * addresses of the live caller frames are such words, so two calls whose
 * paths differ within the scanned bytes get different keys even when they
 * share the immediate caller (path_alpha -> launch_inner -> f and
 * path_beta -> launch_inner -> f). Other code pointers (a function pointer
 * in a local) only split a path into more rows, which the client merges
 * again by the path it unwinds from each row's copy: more rows, never a
 * wrong count.
 *
 * Cost, bounded: one read of GFX_PATH_SCAN_BYTES and at most one
 * bpf_find_vma per word that is not below GFX_PATH_LOW (counters, flags:
 * no code is mapped that low, a non-PIE executable starts at 4 MiB), a
 * pointer into this thread's stack, or inside the last two code mappings
 * or the last data mapping met (a path alternates between a few files).
 */
#ifndef GFX_PATHHASH_H
#define GFX_PATHHASH_H

#include "gfxbpf.h"
#include <bpf/bpf_core_read.h>

#define GFX_PATH_SCAN_BYTES 1024
#define GFX_PATH_LOW 0x400000ULL
#define GFX_PATH_VM_EXEC 0x4
#define GFX_PATH_STACK_SPAN (8ULL << 20)  /* words within this above sp: stack pointers */
#define GFX_PATH_PAGE 4096

struct vm_area_struct___gfxpath {
	unsigned long vm_start;
	unsigned long vm_end;
	unsigned long vm_flags;
} __attribute__((preserve_access_index));

/* A mapping met by the scan: [start, end), and whether it holds code. */
struct gfx_path_vma {
	__u64 start;
	__u64 end;
	__u64 exec;
};

/* bpf_find_vma's callback: the mapping that holds the word. */
static long gfx_path_vma_cb(void *task, struct vm_area_struct___gfxpath *vma,
			    struct gfx_path_vma *seen)
{
	seen->start = BPF_CORE_READ(vma, vm_start);
	seen->end = BPF_CORE_READ(vma, vm_end);
	seen->exec = BPF_CORE_READ(vma, vm_flags) & GFX_PATH_VM_EXEC;
	return 0;
}

/* Whether w (a user word) lies in an executable mapping; code (two, the
 * latest first) and data remember the mappings met, so a path through a
 * few files costs a lookup per file. */
static __always_inline int gfx_path_is_code(void *task, __u64 w, struct gfx_path_vma *code,
					    struct gfx_path_vma *data)
{
	struct gfx_path_vma seen = {};

	if (w >= code[0].start && w < code[0].end)
		return 1;
	if (w >= code[1].start && w < code[1].end)
		return 1;
	if (w >= data->start && w < data->end)
		return 0;
	bpf_find_vma(task, w, gfx_path_vma_cb, &seen, 0);
	if (!seen.end)
		return 0;  /* unmapped, or the mm lock was busy: left out of the hash */
	if (seen.exec) {
		code[1] = code[0];
		code[0] = seen;
		return 1;
	}
	*data = seen;
	return 0;
}

/*
 * The hash of the code addresses among the words at sp + 8 (the word at sp
 * is the immediate caller, already in the row key) up to
 * GFX_PATH_SCAN_BYTES, or to the end of sp's page where the stack ends
 * sooner. words: a buffer of at least GFX_PATH_SCAN_BYTES. 0: unreadable.
 */
static __always_inline __u64 gfx_path_hash(__u64 sp, __u64 *words)
{
	struct gfx_path_vma code[2] = {}, data = {};
	void *task = bpf_get_current_task_btf();
	__u64 h = 0xcbf29ce484222325ull, w;
	__u64 n = GFX_PATH_SCAN_BYTES;
	int i;

	if (bpf_probe_read_user(words, GFX_PATH_SCAN_BYTES, (void *)sp)) {
		n = GFX_PATH_PAGE - (sp & (GFX_PATH_PAGE - 1));
		asm volatile("" : "+r"(n));
		if (n > GFX_PATH_SCAN_BYTES || bpf_probe_read_user(words, n, (void *)sp))
			return 0;
	}
	for (i = 1; i < GFX_PATH_SCAN_BYTES / 8; i++) {
		if (i >= n / 8)
			break;
		w = words[i];
		if (w < GFX_PATH_LOW || w >= 0x800000000000ULL ||
		    (w >= sp && w < sp + GFX_PATH_STACK_SPAN))
			continue;
		if (gfx_path_is_code(task, w, code, &data))
			h = (h ^ w) * 0x100000001b3ull;
	}
	return h | 1;
}

#ifdef GFX_UCOPY_H
/* The path hash at sp in a global function: the verifier checks its 127-word
 * scan once, apart from the entry program's Python walk (inline, the two
 * together passed the kernel's instruction limit). The scratch record's
 * stack bytes (gfx_ucopy.h) are the scan's buffer; the copy overwrites them.
 * ustackcopy and memstacks key their rows with it. */
__attribute__((noinline)) __u64 path_hash_at(__u64 sp)
{
	struct ustack_slot *slot;
	__u32 zero = 0;

	slot = bpf_map_lookup_elem(&copy_scratch, &zero);
	return slot ? gfx_path_hash(sp, (__u64 *)slot->rec.stack) : 0;
}
#endif

#endif /* GFX_PATHHASH_H */
