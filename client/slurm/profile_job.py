"""`gfxclient profile --job ID [--all-nodes]`: the processes of one of your
Slurm jobs on this node (scope job: the broker asks Slurm that the job is
yours and runs here, and the kernel keeps to the job's cgroup), or on every
node of the job (all_nodes.py)."""

from __future__ import annotations

import argparse
from typing import TextIO

from gfxbpf.client.cli import gpu_profile
from gfxbpf.client.cli.arguments import add_job_argument
from gfxbpf.client.errors import UsageError

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
        return gpu_profile.command(args, out)
    _check(args)
    args.scope = "job"
    from gfxbpf.client.slurm import all_nodes

    if args.all_nodes:
        return all_nodes.run(args, out)
    if args.node_part:
        return all_nodes.node_part(args, out)
    return gpu_profile.command(args, out)  # profile_cmd: the job goes into the request


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
