/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Arguments and the return value of a probed user-space call (cuda,
 * memstacks), read from the x86-64 registers of struct pt_regs.
 */
#ifndef GFX_ARGS_H
#define GFX_ARGS_H

#include "gfxbpf.h"

/*
 * Argument n (0-based) of the probed call: di, si, dx, cx, r8, r9 at their
 * offsets in x86-64 struct pt_regs. Each case loads at a constant offset, as
 * the verifier wants for ctx.
 */
static __always_inline __u64 gfx_arg(void *ctx, __u32 n)
{
	switch (n) {
	case 0: return GFX_LDX(ctx, u64, 112);
	case 1: return GFX_LDX(ctx, u64, 104);
	case 2: return GFX_LDX(ctx, u64, 96);
	case 3: return GFX_LDX(ctx, u64, 88);
	case 4: return GFX_LDX(ctx, u64, 72);
	case 5: return GFX_LDX(ctx, u64, 64);
	}
	return 0;
}

/* The return value (ax, at 80), at a return probe. */
#define gfx_ret(ctx) GFX_LDX(ctx, u64, 80)

#endif /* GFX_ARGS_H */
