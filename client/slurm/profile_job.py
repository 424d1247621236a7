"""`gfxclient profile --job ID [--all-nodes]`: the processes of one of your
Slurm jobs on this node (scope job: the broker asks Slurm that the job is
yours and runs here, and the kernel keeps to the job's cgroup), or on every
node of the job (all_nodes.py)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from typing import TextIO

from gfxbpf.client.cli import connecting, profile_cmd
from gfxbpf.client.cli.arguments import add_job_argument
from gfxbpf.client.cli.kinds import locks as lock_profile
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import UsageError

# How often the profile asks Slurm whether the job still runs.
JOB_POLL_S = 2.0

EXAMPLES = """\
A Slurm job of yours (squeue --me lists them), on the node you are on:
  gfxclient profile --job 4242 --duration 10 -o job.svg
On every node of the job, one file with a [node NAME] frame per node:
  gfxclient profile --job 4242 --all-nodes --duration 10 -o job.svg
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_job_argument(p, "profile every process of yours")
    p.add_argument(
        "--all-nodes",
        action="store_true",
        help="with --job: one profile per node of the job (srun --jobid ID --overlap, as "
        "you), merged into one file under a [node NAME] frame each; needs --duration",
    )
    # What srun runs on each node for --all-nodes (all_nodes.py): not for people.
    p.add_argument("--node-part", action="store_true", help=argparse.SUPPRESS)


def command(args: argparse.Namespace, out: TextIO) -> int:
    """gfxclient profile: --job here, --gpu and every other kind further on."""
    if not args.job:
        if args.all_nodes or args.scope == "job":
            raise UsageError("--all-nodes and --scope job need --job ID (a Slurm job of yours)")
        return lock_profile.command(args, out)
    _check(args)
    args.scope = "job"
    from gfxbpf.client.slurm import all_nodes

    if args.all_nodes:
        return all_nodes.run(args, out)
    if args.node_part:
        return all_nodes.node_part(args, out, profile)
    return profile(args, out)


def profile(args: argparse.Namespace, out: TextIO) -> int:
    """profile_cmd's profile of the job (the job goes into the request), ended
    by Ctrl-C, --duration or the job's end, whichever comes first."""
    with StopSignal() as signal:
        stop = JobStop(signal, args.job)
        code = profile_cmd.run(args, out, connecting.connect, stop)
    if stop.ended:
        print(
            f"gfxclient: Slurm job {args.job} ended: the profile stopped with it", file=sys.stderr
        )
    return code


class JobStop:
    """A stopper (engine.run.Stopper) that a stop signal or the job's end sets."""

    def __init__(self, signal: StopSignal, job: str) -> None:
        self.signal, self.job = signal, job
        self.ended = False
        self._asked = time.monotonic()

    @property
    def stopped(self) -> bool:
        return self.signal.stopped or self.ended

    @stopped.setter
    def stopped(self, value: bool) -> None:  # engine.run.Stopper's flag is settable
        self.signal.stopped = value

    def wait(self, timeout: float) -> bool:
        if self.signal.wait(timeout):
            return True
        if time.monotonic() - self._asked >= JOB_POLL_S:
            self._asked = time.monotonic()
            self.ended = not job_running(self.job)
        return self.stopped


def job_running(job: str) -> bool:
    """Whether Slurm says the job runs (True when Slurm cannot be asked: the
    broker still revokes the attachment at the job's end)."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return True
    try:
        r = subprocess.run(
            [squeue, "--noheader", "--jobs", job, "--format", "%T"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return True
    if r.returncode != 0:
        return "Invalid job id" not in r.stderr
    return r.stdout.strip() in ("RUNNING", "COMPLETING", "SUSPENDED")


def _check(args: argparse.Namespace) -> None:
    """What --job cannot go with (before connecting)."""
    if args.pid or args.argv:
        raise UsageError("--job profiles the job's processes: give no --pid nor COMMAND")
    if args.gpu or args.stacks_at:
        raise UsageError("--job takes CPU samples: not with --gpu nor --stacks-at")
    if args.off_cpu or args.wall:
        raise UsageError("--job takes CPU samples: --off-cpu and --wall are for scope self")
    if args.scope not in (None, "job"):
        raise UsageError(f"--job is scope job, not {args.scope}")
    if args.all_nodes and not args.duration:
        raise UsageError("--all-nodes needs --duration S: how long each node samples")
