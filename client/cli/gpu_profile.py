"""`gfxclient profile --gpu --pid PID`: a flame graph of GPU time, weighted by the
nanoseconds each kernel ran on the GPU, with the Python code that launched it
below the kernel's name (the leaf).

Program `cudakernels` on the process's CUPTI injection library, as `watch
cuda --gpu` attaches it (client/cli/cuda_kernels.py): rows of (Python chain,
kernel) with device time, the chains named from the Python records of the
launches' stack copies. The stack is the process, its Python frames (root
first) and the kernel; native frames of the launch are not unwound here yet.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, TextIO

from gfxbpf.client.cli import profile_cmd
from gfxbpf.client.cli.session import connect, sleep_renewing
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import EXIT_OK, UsageError
from gfxbpf.client.printable import printable
from gfxbpf.client.profiles.model import Profile

if TYPE_CHECKING:
    from gfxbpf.client.cli.cuda_kernels import Kernel

# Flags of the other kinds of profile that --gpu does not take.
_OTHER_KINDS = ("stacks_at", "off_cpu", "wall", "min_block", "frequency")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu",
        action="store_true",
        help="GPU time per kernel, in ns from the GPU's clock, under the Python code that "
        "launched it (one --pid, run with gfxbpf's CUPTI injection library: "
        "CUDA_INJECTION64_PATH; program cudakernels)",
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """gfxclient profile: --gpu here, every other kind in profile_cmd."""
    if not args.gpu:
        return profile_cmd.command(args, out)
    _check(args)
    with StopSignal() as stop, connect(args) as broker:
        from gfxbpf.client.cli import cuda_kernels

        view = argparse.Namespace(
            pid=args.pid[0], scope="self", library=None, interval=1.0, no_children=True
        )
        w = cuda_kernels.attach(broker, view)
        start = time.monotonic()
        sleep_renewing(stop, args.duration or 1e9, broker)
        w.sample()
        prof = gpu_profile(w.kernels, args.pid[0], time.monotonic() - start)
        w.att.detach()
    return _report(prof, args, out)


def _check(args: argparse.Namespace) -> None:
    if len(args.pid) != 1 or args.argv:
        raise UsageError("profile --gpu takes one --pid PID (a process of yours), no COMMAND")
    given = [f"--{k.replace('_', '-')}" for k in _OTHER_KINDS if getattr(args, k, None)]
    if given:
        raise UsageError(f"profile --gpu does not go with {', '.join(given)}")


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or str(pid)
    except OSError:
        return str(pid)


def gpu_profile(kernels: list[Kernel], pid: int, seconds: float) -> Profile:
    """The rows as stacks: process, Python chain root first, kernel name; weight: device ns."""
    root = _comm(pid)
    stacks: dict[tuple[str, ...], int] = {}
    for k in kernels:
        for chain, (_n, ns) in k.chains.items():
            stack = (root, *chain, k.name)
            stacks[stack] = stacks.get(stack, 0) + ns
    prof = Profile(stacks=stacks, unit="nanoseconds", duration_s=round(seconds, 3))
    if not stacks:
        prof.notes.append(
            "no kernel ran on the GPU while attached (is the process launching, and was it "
            "started with CUDA_INJECTION64_PATH?)"
        )
    return prof


def _report(prof: Profile, args: argparse.Namespace, out: TextIO) -> int:
    from gfxbpf.client.cli.output import dump_json
    from gfxbpf.client.profiles import writers

    if args.output:
        try:
            fmt = args.format or writers.format_of(args.output)
        except ValueError as e:
            raise UsageError(str(e)) from None
        writers.write_profile(prof, fmt, args.output)
    total = prof.total()
    if args.json:
        ranked = sorted(prof.stacks.items(), key=lambda t: -t[1])
        stacks = [{"stack": list(s), "device_ns": ns} for s, ns in ranked]
        summary = {"kind": "gpu", "unit": prof.unit, "total_ns": total}
        summary.update(duration_s=prof.duration_s, output=args.output, notes=prof.notes)
        dump_json({**summary, "stacks": stacks}, out)
        return EXIT_OK
    out.write(f"GPU time: {total / 1e9:.6f} s in {len(prof.stacks)} stacks over "
              f"{prof.duration_s} s\n")  # fmt: skip
    for stack, ns in sorted(prof.stacks.items(), key=lambda t: -t[1])[: args.top]:
        share = 100.0 * ns / total if total else 0.0
        out.write(f"{share:6.2f}%  {ns / 1e6:12.3f} ms  {printable(' ; '.join(stack[1:]))}\n")
    for note in prof.notes:
        out.write(f"note: {printable(note)}\n")
    if args.output:
        out.write(f"wrote {printable(args.output)}\n")
    return EXIT_OK
