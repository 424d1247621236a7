"""The kernel tests' Slurm cluster (tools/slurm_lab.sh) and jobs on it.

`lab()` starts the one-machine cluster (munge, slurmctld, slurmd with cgroup
v2 containment) for a test module and stops it afterwards unless it was up
before; `submit()` starts a batch job as a test user and waits until it runs
and slurmstepd has made its cgroup.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gfxbpf.catalog import jobcgroups
from tests.conftest import skip_or_fail
from tests.kernel.brokerenv import ROOT, run_as, wait_until

LAB = ROOT / "tools" / "slurm_lab.sh"
LAB_STATE = Path("/run/gfxbpf-slurm-lab")


NODE2 = "gfxlab-n2"  # tools/slurm_lab.sh --two-nodes' second node


@contextmanager
def lab(two_nodes: bool = False) -> Iterator[None]:
    """The Slurm lab up for the with-block, stopped after unless it ran before
    as asked (a lab of the other kind is stopped first, and at the end)."""
    if os.geteuid() != 0:
        skip_or_fail("the Slurm lab needs root")
    was_up = (LAB_STATE / "slurmctld.pid").exists()
    if was_up and (LAB_STATE / "two-nodes").exists() != two_nodes:
        subprocess.run([str(LAB), "stop"], capture_output=True, timeout=120, check=False)
        was_up = False
    argv = [str(LAB), "start", *(["--two-nodes"] if two_nodes else [])]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"tools/slurm_lab.sh start failed:\n{r.stdout}\n{r.stderr}")
    try:
        yield
    finally:
        if not was_up:
            subprocess.run([str(LAB), "stop"], capture_output=True, timeout=120, check=False)


def node2_pid() -> int:
    """The second node's slurmd: its namespaces are the node's."""
    return int((LAB_STATE / f"slurmd-{NODE2}.pid").read_text())


def job_cgroup(job: str) -> str | None:
    """The job's cgroup directory on this node, as slurmstepd made it."""
    return jobcgroups.job_dir(job)


def job_state(job: str) -> str:
    r = subprocess.run(
        ["squeue", "--noheader", "--jobs", job, "--format", "%T"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return r.stdout.strip() or "GONE"


def submit(user: str, workdir: Path, *argv: str, nodes: int = 1) -> str:
    """A batch job of user's running argv (on each of nodes nodes, through
    srun); its id once it runs with its cgroup here."""
    script = workdir / f"job-{time.monotonic_ns()}.sh"
    run = "srun " if nodes > 1 else ""
    script.write_text(f"#!/bin/sh\nexec {run}" + " ".join(argv) + "\n")
    script.chmod(0o755)
    sbatch = ["sbatch", "--parsable", f"--nodes={nodes}", f"--chdir={workdir}"]
    sbatch += [f"--output={workdir}/slurm-%j.out", str(script)]
    r = run_as(user, sbatch, timeout=60)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    running = wait_until(lambda: job_state(job) == "RUNNING" and job_cgroup(job), 60, 0.2)
    assert running, f"job {job} did not start: {job_state(job)}"
    return job


def cancel(job: str) -> None:
    subprocess.run(["scancel", job], capture_output=True, timeout=30, check=False)


def have_slurm() -> bool:
    return all(shutil.which(p) for p in ("sbatch", "squeue", "srun", "scontrol"))


def running_jobs() -> list[str]:
    r = subprocess.run(
        ["squeue", "--noheader", "--states", "RUNNING", "--format", "%i"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return r.stdout.split()
