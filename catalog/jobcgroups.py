"""Where Slurm puts its jobs' cgroups on a node (cgroup v2), for scope job
(the broker, catalog/programs/gfx_cgroup.h) and the exporter's per-job series.

slurmstepd (root) makes <cgroup2>/system.slice/<node>_slurmstepd.scope/job_ID
(Debian's build names the scope after the node; slurmstepd.scope in others),
with the job's steps and tasks below it. Only root can create it, so a user
cannot fake a job there; its absence means the job has no processes on this
node. A cgroup's id, as bpf_get_current_cgroup_id() and
bpf_get_current_ancestor_cgroup_id() return it, is its directory's inode.
Reads the file system only.
"""

from __future__ import annotations

import glob
import os

__all__ = ["cgroup2_mounts", "job_dir", "job_dirs", "job_of_cgroups"]


def cgroup2_mounts() -> list[str]:
    """Mount points of the cgroup v2 hierarchy, from this process's mount table."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                out.append(left.split(" ")[4])
    return out


def node_name() -> str:
    """This host's short name, which slurmd takes as its NodeName by default."""
    return os.uname().nodename.split(".")[0]


def _scopes() -> list[str]:
    """slurmstepd's scope directories of this node: the one named after this
    host, or slurmstepd.scope; another <node>_slurmstepd.scope only when it
    is the only one. Several slurmd on one machine (one per network
    namespace, each with its own host name) each find their own."""
    out = []
    for root in cgroup2_mounts():
        base = f"{root}/system.slice"
        own = [f"{base}/{node_name()}_slurmstepd.scope", f"{base}/slurmstepd.scope"]
        found = [p for p in own if os.path.isdir(p)]
        if not found:
            others = glob.glob(f"{base}/*_slurmstepd.scope")
            found = others if len(others) == 1 else []
        out.extend(found)
    return out


def job_dir(job: str) -> str | None:
    """The cgroup directory of job on this node (None: no processes here)."""
    for scope in _scopes():
        path = os.path.join(scope, f"job_{job}")
        if os.path.isdir(path):
            return path
    return None


def job_dirs() -> dict[str, str]:
    """Every job with a cgroup on this node: {job id: its directory}."""
    out: dict[str, str] = {}
    for scope in _scopes():
        for path in sorted(glob.glob(os.path.join(scope, "job_*"))):
            out.setdefault(os.path.basename(path).removeprefix("job_"), path)
    return out


def job_of_cgroups() -> dict[int, str]:
    """{cgroup id: job id} for every cgroup of every job on this node (the
    job's own and its steps' and tasks' below it)."""
    out: dict[int, str] = {}
    for job, path in job_dirs().items():
        for d, _, _ in os.walk(path):
            try:
                out[os.stat(d).st_ino] = job
            except OSError:
                continue  # gone meanwhile: a step ended
    return out
