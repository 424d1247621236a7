"""Scope job: a Slurm job of the caller's, running on this node, as its cgroup.

The broker decides from two sources the client cannot touch, never from what
the client says:
- Slurm's controller, asked with `scontrol show job` (authenticated by
  munge): whose the job is and that it is running;
- this node's cgroup v2 tree, where slurmstepd (root) made the job's
  directory (catalog/jobcgroups.py): only root can create it, and its
  absence means the job has no processes on this node.

The directory's inode number is the cgroup id the kernel filters on
(catalog/programs/gfx_cgroup.h); when slurmstepd removes it at the job's
end, JobCgroup.alive() turns false and the broker revokes the attachment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from gfxbpf.broker.callers import Caller
from gfxbpf.broker.errors import BrokerError
from gfxbpf.catalog import jobcgroups
from gfxbpf.proto import gfxbpf_pb2 as pb

__all__ = ["JobCgroup", "check_job"]

# A job id as Slurm prints it (array and het jobs have their own numeric ids).
_JOB_ID = re.compile(r"[1-9][0-9]{0,18}")
SCONTROL_TIMEOUT = 10.0
_FIELD = re.compile(r"(?:^|\s)(UserId|JobState)=(\S+)")


@dataclass(frozen=True)
class JobCgroup:
    """A job's cgroup on this node, as checked at attach."""

    job: str
    uid: int
    path: str
    cgroup_id: int

    def alive(self) -> bool:
        """The job still has its cgroup here (the same one: same inode)."""
        try:
            return os.stat(self.path).st_ino == self.cgroup_id
        except OSError:
            return False


def check_job(caller: Caller, job: str) -> JobCgroup:
    """The caller's running job on this node, or BrokerError saying why not."""
    if not _JOB_ID.fullmatch(job):
        raise BrokerError(pb.ERROR_INVALID_ARGUMENT, f"job {job!r} is not a Slurm job id")
    uid, state = _ask_slurm(job)
    if uid != caller.uid:
        raise BrokerError(
            pb.ERROR_PERMISSION_DENIED,
            f"Slurm job {job} is not yours: scope job profiles only your own jobs",
        )
    if state != "RUNNING":
        raise BrokerError(pb.ERROR_NOT_FOUND, f"Slurm job {job} is {state.lower()}, not running")
    path = jobcgroups.job_dir(job)
    if path is None:
        raise BrokerError(
            pb.ERROR_NOT_FOUND,
            f"Slurm job {job} has no processes on this node ({os.uname().nodename}): run "
            "gfxclient on one of the job's nodes (srun --jobid "
            f"{job} --overlap ...), or gfxclient profile --job {job} --all-nodes",
        )
    try:
        ino = os.stat(path).st_ino
    except OSError:
        raise BrokerError(pb.ERROR_NOT_FOUND, f"Slurm job {job} ended meanwhile") from None
    return JobCgroup(job, uid, path, ino)


def _ask_slurm(job: str) -> tuple[int, str]:
    """(owner uid, JobState) of the job, from the controller."""
    scontrol = shutil.which("scontrol") or "/usr/bin/scontrol"
    try:
        r = subprocess.run(
            [scontrol, "--oneliner", "show", "job", job],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT,
            env={"PATH": "/usr/bin:/bin", "LANG": "C"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BrokerError(
            pb.ERROR_UNAVAILABLE, f"cannot ask Slurm about job {job} (scontrol: {e})"
        ) from None
    fields = dict(_FIELD.findall(r.stdout))
    owner = re.fullmatch(r"[^()]*\((\d+)\)", fields.get("UserId", ""))
    if r.returncode != 0 or owner is None or "JobState" not in fields:
        said = (r.stderr or r.stdout).strip().splitlines()
        if "Invalid job id" in r.stderr:
            raise BrokerError(pb.ERROR_NOT_FOUND, f"Slurm knows no job {job}")
        raise BrokerError(
            pb.ERROR_UNAVAILABLE,
            f"cannot ask Slurm about job {job}: {said[-1] if said else 'no answer'}",
        )
    return int(owner.group(1)), fields["JobState"]
