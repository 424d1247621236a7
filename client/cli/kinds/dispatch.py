"""gfxclient profile's entry point: every kind's flags on one parser, and the
dispatch: --job (client/slurm/profile_job.py), then --locks (locks.py), then
--gpu (gpu_profile.py), then every other profile (profile_cmd.py). gfxclient
imports this module only when the command is `profile`."""

from __future__ import annotations

import argparse

from gfxbpf.client.cli import gpu_profile, profile_cmd
from gfxbpf.client.cli.kinds import locks, memory
from gfxbpf.client.slurm import profile_job

EXAMPLES = profile_cmd.EXAMPLES + "\n" + profile_job.EXAMPLES
command = profile_job.command


def add_arguments(p: argparse.ArgumentParser) -> None:
    profile_cmd.add_arguments(p)
    gpu_profile.add_arguments(p)
    profile_job.add_arguments(p)
    locks.add_arguments(p)
    memory.add_arguments(p)
