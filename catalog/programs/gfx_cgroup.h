/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Scope `job`: the current task must be in one cgroup (v2) or below it,
 * e.g. a Slurm job's <cgroup2>/system.slice/<node>_slurmstepd.scope/job_ID,
 * whose steps and tasks are its descendants. The broker writes the cgroup's
 * id (its directory's inode number on cgroup2) into the knob before loading;
 * 0 (the default) filters nothing, as GFX_ANY does for the uid knob.
 *
 * The task's ancestors are compared level by level from the top, through
 * bpf_get_current_ancestor_cgroup_id(); past the task's own level it returns
 * 0 and the walk stops. GFX_CGROUP_LEVELS bounds the walk for the verifier.
 */
#ifndef GFX_CGROUP_H
#define GFX_CGROUP_H

#include "gfxbpf.h"

#define GFX_CGROUP_LEVELS 16

static __always_inline int gfx_cgroup_ok(__u64 target_cgroup)
{
	int level;

	if (target_cgroup == 0)
		return 1;
#pragma unroll
	for (level = 1; level <= GFX_CGROUP_LEVELS; level++) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(level);

		if (id == target_cgroup)
			return 1;
		if (id == 0)
			return 0;
	}
	return 0;
}

#endif /* GFX_CGROUP_H */
