"""Per-job series: program cgroupcpu's CPU samples per cgroup, summed per
Slurm job on this node and labelled slurm_job (the id) and user. Not `job`:
Prometheus gives every scraped series its own `job` label (the scrape job)
and would rename ours to exported_job.

The map is keyed by the sampled task's cgroup id; a job's tasks live in
cgroups below the job's own (its steps, its tasks), which
catalog/jobcgroups.py lists with their ids. Cgroups that belong to no job
running here (the system, logins, jobs that ended) are left out: the label
set is bounded by the jobs running on the node (and max_series_per_metric),
and a job's series ends with the job. Who owns a job comes from Slurm
(`squeue`), asked once a scrape for the jobs found; "" if Slurm does not say.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from gfxbpf.catalog import jobcgroups

PROGRAM = "cgroupcpu"
SQUEUE_TIMEOUT_S = 10.0


def job_users(jobs: Sequence[str]) -> dict[str, str]:
    """{job id: user name} from Slurm; {} when squeue is missing or fails."""
    squeue = shutil.which("squeue")
    if not jobs or squeue is None:
        return {}
    argv = [squeue, "--noheader", "--jobs", ",".join(jobs), "--format", "%i %u"]
    try:
        r = subprocess.run(
            argv, capture_output=True, text=True, timeout=SQUEUE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def relabel(entries: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """cgroupcpu's (cgroup id, samples) as ({job, user}, samples), jobs on this node only."""
    of = jobcgroups.job_of_cgroups()
    users = job_users(sorted(set(of.values()), key=int))
    out = []
    for key, value in entries:
        job = of.get(key) if isinstance(key, int) else None
        if job is not None:
            out.append(({"slurm_job": job, "user": users.get(job, "")}, value))
    return out
