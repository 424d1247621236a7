// SPDX-License-Identifier: GPL-2.0
/*
 * stackcopy: CPU samples of the caller's own processes as stack copies, for
 * complete user stacks without frame pointers (perf's --call-graph dwarf).
 *
 * The broker attaches it as it attaches `profile`: a software cpu-clock
 * perf event on every CPU at params.frequency Hz. Each sample of a task
 * gfx_task_ok() accepts (the caller's real and effective uid, dumpable)
 * sends one record to `stack_copies`: the user registers the task last
 * entered the kernel with (so a sample taken in the kernel still has its
 * user stack, and no kernel register is copied), the kernel-mode flag, and
 * the top of its user stack (gfx_ucopy.h). The client unwinds each record
 * with the call-frame information of the files the process maps.
 *
 * A task running a CPython interpreter registered in `py_files`
 * (gfx_python.h) first sends a Python record (struct py_rec, flags bit
 * GFX_UREC_PYTHON) with its Python frames, then the stack record of the same
 * sample: the client joins a Python record to the next stack record of the
 * same thread and puts each run of Python frames in place of the evaluation
 * loop's native frame that runs it.
 *
 * Scope self, or job (the caller's processes in one Slurm job's cgroup,
 * gfx_cgroup.h): the copied bytes are process memory.
 */
#include "gfx_tree.h"
#include "gfx_python.h"
#include "gfx_ucopy.h"
#include "gfx_cgroup.h"
#include <linux/bpf_perf_event.h>

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 target_pid = GFX_ANY;
const volatile __u64 target_cgroup = 0;  /* scope job (gfx_cgroup.h) */

GFX_TREE_PROGRAMS(target_pid)

SEC("perf_event")
int stackcopy_sample(struct bpf_perf_event_data *ctx)
{
	struct ustack_rec *r;
	struct py_rec *py;
	__u64 ts;

	/* A build for scope system copies nothing (the catalog offers none). */
	if (target_uid == GFX_ANY || !gfx_tree_ok(target_pid) || !gfx_task_ok(target_uid) ||
	    !gfx_cgroup_ok(target_cgroup))
		return 0;
	ts = bpf_ktime_get_ns();
	py = gfx_py_record();
	if (py && gfx_py_walk(py)) {
		py->ts = ts;
		if (!gfx_py_send(&stack_copies, py)) {
			__u32 zero = 0;

			gfx_count(&lost, &zero, 1);
		}
	}
	r = gfx_urec_start((ctx->regs.cs & 3) == 0 ? GFX_UREC_KERNEL : 0);
	if (!r)
		return 0;
	r->entry_ns = ts;  /* the sample's time: its Python record has the same */
	gfx_urec_task_regs(r);
	gfx_urec_copy(r);
	gfx_urec_send(r);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
