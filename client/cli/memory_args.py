"""gfxclient profile --memory, --memory-live and --cuda: the flags, and what
they make of the profile request (program memstacks; client/profiles/memory)."""

from __future__ import annotations

import argparse

from gfxbpf.catalog import memory_api
from gfxbpf.client.errors import UsageError
from gfxbpf.client.profiles.engine.request import MEMORY, ProfileRequest

# Flags of the other kinds of profile that --memory does not take.
_OTHER_KINDS = ("stacks_at", "off_cpu", "wall", "min_block", "frequency")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--memory",
        action="store_true",
        help="bytes allocated per stack instead of CPU samples: malloc, calloc, realloc, "
        "aligned allocations and anonymous mmap, probed in the process's C library "
        "(one --pid or COMMAND; program memstacks)",
    )
    p.add_argument(
        "--memory-live",
        action="store_true",
        help="as --memory, but the bytes still held when the profile ends, per allocating "
        "stack (frees matched in the kernel): what leaks, or what a process holds",
    )
    p.add_argument(
        "--cuda",
        action="store_true",
        help="with --memory/--memory-live: CUDA device memory (cuMemAlloc*, cuMemCreate) "
        "through the process's libcuda instead of host memory",
    )


def apply(req: ProfileRequest, args: argparse.Namespace) -> None:
    """Make req a memory profile where the flags ask for one (UsageError: a conflict)."""
    memory = args.memory or args.memory_live
    if args.cuda and not memory:
        raise UsageError("--cuda goes with --memory or --memory-live (device memory per stack)")
    if not memory:
        return
    given = [f"--{k.replace('_', '-')}" for k in _OTHER_KINDS if getattr(args, k, None)]
    if given:
        raise UsageError(f"--memory does not go with {', '.join(given)}")
    if len(req.pids) != 1 and not req.command:
        raise UsageError("--memory needs one process: one --pid, or -- COMMAND")
    if args.scope not in (None, "self"):
        raise UsageError("--memory copies your processes' stacks: scope self only")
    req.mode, req.live, req.cuda = MEMORY, bool(args.memory_live), bool(args.cuda)
    req.weight = "bytes"
    req.functions = [f.name for f in memory_api.FUNCTIONS]  # a row's function is its index
