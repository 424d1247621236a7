"""gfxclient profile --memory, --memory-live and --cuda: the flags, and what
they make of the profile request (program memstacks; client/profiles/memory)."""

from __future__ import annotations

import argparse

from gfxbpf.catalog import memory_api
from gfxbpf.client.errors import UsageError
from gfxbpf.client.profiles.engine.request import MEMORY, ProfileRequest

# The broker's bound (its random draw is modulo twice the interval, in 32 bits).
MAX_SAMPLE_BYTES = 1 << 30
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
    add_sampling(p)


def add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sample-bytes",
        type=_bytes,
        default=0,
        metavar="N",
        help="with --memory: record about one allocation per N bytes allocated, weighed "
        "by the bytes it stands for (as tcmalloc samples; e.g. 524288), so an "
        "allocation-heavy program pays less (default: every allocation, exact)",
    )


def _bytes(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= MAX_SAMPLE_BYTES:
        raise argparse.ArgumentTypeError(f"not a byte count (1-{MAX_SAMPLE_BYTES}): {text!r}")
    return int(text)


def empty(req: ProfileRequest) -> tuple[str, str] | None:
    """What an empty memory profile says (None: not a memory profile)."""
    if req.mode != MEMORY:
        return None
    if req.live:
        return "no bytes were held at the end", "what the target allocated was freed"
    return "no allocation was recorded", "the target allocated nothing through " + (
        "its libcuda" if req.cuda else "its C library while it was profiled"
    )


def apply(req: ProfileRequest, args: argparse.Namespace) -> None:
    """Make req a memory profile where the flags ask for one (UsageError: a conflict)."""
    memory = args.memory or args.memory_live
    if args.sample_bytes and not memory:
        raise UsageError("--sample-bytes goes with --memory or --memory-live")
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
    req.weight, req.sample_bytes = "bytes", args.sample_bytes
    req.functions = [f.name for f in memory_api.FUNCTIONS]  # a row's function is its index
