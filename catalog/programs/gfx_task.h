/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Scope `self` for programs that read a process's user memory or user
 * stacks (profile, ustacks, ucalls, cuda): the current task must be one the
 * caller could trace with perf_event_open or ptrace, checked in the kernel
 * at every event.
 *
 * bpf_get_current_uid_gid() gives the real uid only. A setuid program the
 * caller runs keeps the caller's real uid, but it is another user's process:
 * its effective uid differs, and the kernel marks its mm not dumpable
 * (suid_dumpable), which stays so after it drops privileges. So the event
 * counts only when the task's real AND effective uid are the caller's and
 * its mm is dumpable as SUID_DUMP_USER. A kernel thread (no mm) never counts.
 *
 * The fields are read with CO-RE through the kernel's BTF. mm->flags was an
 * unsigned long until Linux 6.18 made it mm_flags_t, a bitmap whose first
 * word holds the same bits; both layouts are declared below as flavours and
 * the one the running kernel has is chosen at load time.
 */
#ifndef GFX_TASK_H
#define GFX_TASK_H

#include "gfxbpf.h"
#include <bpf/bpf_core_read.h>

#define GFX_MMF_DUMPABLE_MASK 3UL  /* the low two bits of mm->flags */
#define GFX_SUID_DUMP_USER 1UL

typedef struct {
	__u32 val;
} gfx_kuid_t;

struct cred {
	gfx_kuid_t uid;
	gfx_kuid_t euid;
} __attribute__((preserve_access_index));

struct mm_struct___gfx_word {  /* up to 6.17: unsigned long flags */
	unsigned long flags;
} __attribute__((preserve_access_index));

struct gfx_mm_flags {  /* 6.18: mm_flags_t { unsigned long __mm_flags[]; } */
	unsigned long __mm_flags[1];
};

struct mm_struct___gfx_bitmap {
	struct gfx_mm_flags flags;
} __attribute__((preserve_access_index));

struct task_struct___gfx {
	const struct cred *cred;
	void *mm;
} __attribute__((preserve_access_index));

/* The dumpable bits of mm->flags, whichever layout this kernel has. */
static __always_inline __u64 gfx_mm_dumpable(void *mm)
{
	struct mm_struct___gfx_bitmap *bm = mm;
	struct mm_struct___gfx_word *w = mm;
	unsigned long flags = 0;

	if (bpf_core_field_exists(w->flags))
		flags = BPF_CORE_READ(w, flags);
	else if (bpf_core_field_exists(bm->flags))
		flags = BPF_CORE_READ(bm, flags.__mm_flags[0]);
	else
		return 0;  /* an unknown layout: treated as not dumpable */
	return flags & GFX_MMF_DUMPABLE_MASK;
}

/*
 * True when target_uid is GFX_ANY (scope system), or the current task's
 * real and effective uid are target_uid and its mm is dumpable by its user.
 */
static __always_inline int gfx_task_ok(__u32 target_uid)
{
	struct task_struct___gfx *task;
	const struct cred *cred;
	void *mm;

	if (target_uid == GFX_ANY)
		return 1;
	task = (struct task_struct___gfx *)bpf_get_current_task_btf();
	cred = BPF_CORE_READ(task, cred);
	if (!cred || BPF_CORE_READ(cred, uid.val) != target_uid ||
	    BPF_CORE_READ(cred, euid.val) != target_uid)
		return 0;
	mm = BPF_CORE_READ(task, mm);
	return mm && gfx_mm_dumpable(mm) == GFX_SUID_DUMP_USER;
}

#endif /* GFX_TASK_H */
