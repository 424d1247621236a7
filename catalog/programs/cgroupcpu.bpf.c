// SPDX-License-Identifier: GPL-2.0
/*
 * cgroupcpu: CPU samples per cgroup v2, host-wide (scope system).
 *
 * The broker attaches it as it attaches `profile`: a software cpu-clock
 * perf event on every CPU at params.frequency Hz (99 by default). Each
 * sample adds 1 to the current task's cgroup id (the cgroup directory's
 * inode number), so samples / frequency is CPU time. gfxbpf-exporter sums
 * the cgroups below each Slurm job's cgroup into one series per job
 * (exporter/jobs.py); a cgroup id names a directory, not a kernel address.
 */
#include "gfxbpf.h"
#include <linux/bpf_perf_event.h>

/* cgroup id -> samples; least recently used ids make room (ended jobs). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u64);
} samples SEC(".maps");

SEC("perf_event")
int cgroupcpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 cgroup = bpf_get_current_cgroup_id();

	gfx_count(&samples, &cgroup, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
