"""`gfxclient profile --gpu --pid PID`: a flame graph of GPU time, weighted by the
nanoseconds each kernel ran on the GPU, with the stack that launched it below
the kernel's name (the leaf); copies and memsets the same, their kind the leaf
([memcpy htod], [memset]).

The profiling engine takes it (mode GPU, client/profiles/engine/): program
`cudakernels` on the process's CUPTI injection library gives rows of (Python
chain, kernel) with device time (client/profiles/gpu/kernels.py). The
launch's stack copies (a few per chain, taken at the library's launch probe)
are unwound as `profile --stacks-at` unwinds ustackcopy's
(client/profiles/copies.py, by_chain), with their Python frames in place of
the interpreter's; the symbolizer names them as in every profile.
The stack runs from the process through Python and the CUDA libraries to the
CUPTI callback that fired the probe, then the kernel.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from gfxbpf.client.cli import arguments, profile_cmd
from gfxbpf.client.cli.connecting import connect
from gfxbpf.client.cli.cuda_python import NO_PYTHON
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import EXIT_OK, ClientError, UsageError
from gfxbpf.client.printable import printable
from gfxbpf.client.profiles.model import Profile

if TYPE_CHECKING:
    from gfxbpf.client.broker import Broker

# Flags of the other kinds of profile that --gpu does not take.
_OTHER_KINDS = ("stacks_at", "off_cpu", "wall", "min_block", "frequency", "memory", "memory_live")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu",
        action="store_true",
        help="GPU time per kernel (and copy, memset), in ns from the GPU's clock, under the "
        "Python code that launched it (one --pid, run with gfxbpf's CUPTI injection library: "
        "CUDA_INJECTION64_PATH; program cudakernels)",
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """gfxclient profile: --gpu here, every other kind in profile_cmd."""
    if not args.gpu:
        return profile_cmd.command(args, out)
    _check(args)
    with StopSignal() as stop:
        prof = take(lambda: connect(args), stop, args.pid[0], args.duration, args.stack_bytes)
    return _report(prof, args, out)


def take(
    connect: Callable[[], Broker],
    stop: StopSignal,
    pid: int,
    duration: float | None,
    stack_bytes: int = 0,
) -> Profile:
    """The profiling engine's GPU profile of pid: until it exits, duration
    ends or a stop, each (launch stack, kernel) weighed by its device ns.
    stack_bytes: the launch copies' size (0: the policy's max_stack_bytes)."""
    from gfxbpf.client.profiles.engine.request import GPU, ProfileRequest
    from gfxbpf.client.profiles.engine.take import take_profile

    req = ProfileRequest(
        pids=[pid], command=[], mode=GPU, weight="time", children=False, stack_bytes=stack_bytes
    )
    return take_profile(req, connect, stop, duration).profile


# Files of installed code, not the user's: packages, the standard library,
# frozen modules. The line shown is the innermost Python line outside them.
_INSTALLED = re.compile(r"/(site|dist)-packages/|/lib/python3\.\d+t?/|^<frozen ")


def launch_rows(prof: Profile) -> list[tuple[int, str, str, str]]:
    """(device ns, thread, launching Python line, kernel), heaviest first: the
    stacks summed over the native paths between the line and the kernel, which
    the text report leaves to the flame graph. The line is the innermost one
    of the user's own code (PyTorch's forward in torch/nn/modules/linear.py
    says only that some Linear launched; the model's line says which), else
    the innermost.
    Under autograd's backward thread it is the main thread's (typically
    loss.backward()'s; records.MAIN_FRAME); with no Python frame, NO_PYTHON."""
    rows: dict[tuple[str, str, str], int] = {}
    info = prof.frames
    for stack, ns in prof.stacks.items():
        python = [f for f in stack[1:-1] if f in info and info[f].file]
        own = [f for f in python if not _INSTALLED.search(info[f].file)]
        line = (own or python or [NO_PYTHON])[-1]
        key = (stack[0], line, stack[-1])
        rows[key] = rows.get(key, 0) + ns
    return sorted(((ns, *k) for k, ns in rows.items()), key=lambda r: (-r[0], r[1:]))


def _check(args: argparse.Namespace) -> None:
    if len(args.pid) != 1 or args.argv:
        raise UsageError("profile --gpu takes one --pid PID (a process of yours), no COMMAND")
    given = [f"--{k.replace('_', '-')}" for k in _OTHER_KINDS if getattr(args, k, None)]
    if given:
        raise UsageError(f"profile --gpu does not go with {', '.join(given)}")
    if args.output:  # before the profile, as for every other kind
        if not args.format:
            arguments.format_of_output(args.output)
        arguments.check_output(args.output)


def _report(prof: Profile, args: argparse.Namespace, out: TextIO) -> int:
    from gfxbpf.client.cli.output import dump_json
    from gfxbpf.client.profiles import writers

    if args.output:
        fmt = args.format or writers.format_of(args.output)  # checked by _check
        try:
            writers.write_profile(prof, fmt, args.output)
        except OSError as e:
            raise ClientError(f"cannot write {args.output}: {e.strerror or e}") from None
    total = prof.total()
    if args.json:
        ranked = sorted(prof.stacks.items(), key=lambda t: -t[1])
        stacks = [{"stack": list(s), "device_ns": ns} for s, ns in ranked]
        summary = {"kind": "gpu", "unit": prof.unit, "total_ns": total}
        summary.update(duration_s=prof.duration_s, output=args.output, notes=prof.notes)
        keys = ("device_ns", "thread", "line", "kernel")
        launches = [dict(zip(keys, row, strict=True)) for row in launch_rows(prof)]
        dump_json({**summary, "launches": launches, "stacks": stacks}, out)
        return EXIT_OK
    out.write(f"GPU time: {total / 1e9:.6f} s in {len(prof.stacks)} stacks over "
              f"{prof.duration_s} s\n")  # fmt: skip
    rows = [
        (ns, printable(thread), printable(line), printable(kernel))
        for ns, thread, line, kernel in launch_rows(prof)[: args.top]
    ]
    if rows:
        wt = max(len("THREAD"), *(len(r[1]) for r in rows))
        wl = max(len("LAUNCHED FROM"), *(len(r[2]) for r in rows))
        out.write(
            f"{'SHARE':>7}  {'DEVICE ms':>10}  {'THREAD':<{wt}}  {'LAUNCHED FROM':<{wl}}  KERNEL\n"
        )
        for ns, thread, line, kernel in rows:
            share = 100.0 * ns / total if total else 0.0
            out.write(f"{share:6.2f}%  {ns / 1e6:10.3f}  {thread:<{wt}}  {line:<{wl}}  {kernel}\n")
        if not args.output:
            out.write("whole launch stacks: --json, or -o FILE for a flame graph\n")
    for note in prof.notes:
        out.write(f"note: {printable(note)}\n")
    if args.output:
        out.write(f"wrote {printable(args.output)}\n")
    return EXIT_OK
