/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The row key of a Python chain (ustackcopy, cudakernels): a hash of a
 * gfx_python.h record's frames, FNV-1a over each frame's code object and
 * instruction value; 0 when there is none, else odd. The client computes
 * the same from the frames it decodes (client/profiles/python/records.py, chain_hash).
 * A chain of the main thread's frames borrowed by another thread
 * (GFX_PY_MAIN) is salted, so it never shares a row key with the main
 * thread's own launches from the same frames.
 */
#ifndef GFX_PYCHAIN_H
#define GFX_PYCHAIN_H

#include "gfx_python.h"

#define GFX_PY_MAIN_SALT 0x6d61696e746872ull  /* "mainthr" */

static __always_inline __u64 gfx_py_chain_hash(struct py_rec *py)
{
	__u64 h = 0xcbf29ce484222325ull;
	__u32 i, idx;

	for (i = 0; i < GFX_PY_MAX_FRAMES; i++) {
		if (i >= py->nframes)
			break;
		idx = i & (GFX_PY_MAX_FRAMES - 1);
		h = (h ^ py->frames[idx].code) * 0x100000001b3ull;
		h = (h ^ py->frames[idx].instr) * 0x100000001b3ull;
	}
	if (py->flags & GFX_PY_MAIN)  /* borrowed frames: never the main thread's own row */
		h ^= GFX_PY_MAIN_SALT;
	return py->nframes ? h | 1 : 0;
}

#endif /* GFX_PYCHAIN_H */
