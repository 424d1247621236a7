"""gfxclient profile: CPU samples (or calls of chosen functions) per user stack
of your own processes, as a top-N table and a flame graph file.

    gfxclient profile --pid 1234 --duration 10 -o cpu.svg
    gfxclient profile -o cpu.folded --format folded -- ./myprog arg
    gfxclient profile --stacks-at /usr/lib/x86_64-linux-gnu/libcuda.so.1:cuLaunchKernel \\
        --weight time -- python3 train.py
    gfxclient profile --off-cpu -o waits.svg -- python3 train.py
    gfxclient profile --wall --pid 1234 --duration 10 -o wall.svg

The broker samples (program `profile`) or probes (program `ustacks`); the
maps hold user addresses only, which this process names from the targets'
/proc/PID/maps, captured while they live (gfxbpf.client.profiles).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from gfxbpf.bpf.consts import SCOPES
from gfxbpf.catalog.stack_copies import DEEP_STACK_BYTES, MAX_STACK_BYTES
from gfxbpf.client import profiles as profile
from gfxbpf.client.cli import connecting, kinds
from gfxbpf.client.cli.arguments import check_output, format_of_output, process_id
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import ClientError, UsageError
from gfxbpf.client.printable import printable
from gfxbpf.client.profiles.engine.request import (
    CPU,
    DEFAULT_FREQUENCY,
    DEFAULT_MIN_BLOCK_MS,
    OFF_CPU,
    WALL,
    WALL_MIN_BLOCK_US,
    ProfileRequest,
)
from gfxbpf.client.profiles.writers import FORMATS

if TYPE_CHECKING:
    from gfxbpf.client.broker import Broker
    from gfxbpf.client.profiles import Profile
    from gfxbpf.client.profiles.engine.run import Run, Stopper
    from gfxbpf.client.profiles.engine.take import Taken

    Connect = Callable[[argparse.Namespace], Broker]

# The engine (profiles.engine.take), the symbolizer and the file writers are imported
# on first use: every gfxclient command imports this module for its parser (issue #15).

TOP_N = 15
# Default file names when --format is given without -o.
DEFAULT_FILES = {
    "folded": "profile.folded",
    "pprof": "profile.pb.gz",
    "speedscope": "profile.speedscope.json",
    "svg": "profile.svg",
}
EXAMPLES = """\
examples:
  gfxclient profile --pid 1234 --duration 10            top functions of process 1234
  gfxclient profile -o cpu.svg -- ./myprog --fast       run ./myprog, flame graph when it exits
  gfxclient profile --format folded -o cpu.folded --pid 1234 --pid 1240
  gfxclient profile --stacks-at /usr/lib/x86_64-linux-gnu/libcuda.so.1:cuLaunchKernel \\
      --weight time -- python3 train.py                 which code paths launch GPU work
  gfxclient profile --off-cpu -o waits.svg -- python3 train.py
                                                        where it waits, and on what
  gfxclient profile --wall --duration 10 --pid 1234 -o wall.svg
                                                        computing and waiting, per thread

A CPU profile shows only the time a program runs. --off-cpu shows the time its
threads spend off the CPU, per stack, in nanoseconds: the innermost frame
says why, from the system call the thread was in ([wait: futex] a lock or a
condition variable, [wait: clock_nanosleep] a sleep, [wait: poll] or
[wait: epoll_wait] waiting for I/O or events, [wait: read] a pipe, socket or
file, [wait: ioctl] often a GPU driver, e.g. a CUDA synchronize),
", uninterruptible" for disk I/O and some kernel locks, or [preempted]: it
could have run but another task had the CPU. Waits shorter than --min-block
(default 1 ms; 0.1 ms with --wall) are not recorded. --wall adds the CPU
samples, each counted as the sampling period (1/--frequency s), so a thread's
width in the flame graph is its wall-clock time, computing and waiting, with
one [thread TID] frame per thread. Off-CPU frames are blue in the SVG.

Without --pid or COMMAND, every process in the scope is sampled (scope self:
all of yours). COMMAND and --pid include their child processes, those running
and those started during the profile (threads too), followed in the kernel;
--no-children keeps to the process itself.
Stacks are unwound from stack copies by the programs' call-frame
information (.eh_frame) where the policy grants stackcopy (ustackcopy for
--stacks-at); otherwise they follow frame pointers (-fno-omit-frame-pointer).
Kernel time shows as one [kernel] frame; no kernel address leaves the broker.
CPython 3.9 to 3.14 processes (no flags, no ptrace rights needed) show their
Python functions as `function (file:line)` in place of the interpreter's
evaluation loop, with stackcopy, ustackcopy and offcpu; the summary lists the
interpreters found and notes a Python it cannot read.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pid",
        type=process_id,
        action="append",
        default=[],
        help="process to profile (repeatable)",
    )
    p.add_argument("--scope", choices=SCOPES, help="default: the policy's scope")
    p.add_argument("--duration", type=_seconds, metavar="S", help="stop after S seconds")
    p.add_argument(
        "--frequency",
        type=_hz,
        metavar="HZ",
        help=f"samples per second per CPU (default {DEFAULT_FREQUENCY}; the policy may cap it)",
    )
    p.add_argument(
        "--stacks-at",
        metavar="LIBRARY:FUNCTION",
        action="append",
        default=[],
        help="instead of sampling, count calls of FUNCTION in LIBRARY per calling stack "
        "(repeatable, one library); needs one --pid or a COMMAND",
    )
    p.add_argument(
        "--weight",
        choices=("calls", "time"),
        default="calls",
        help="with --stacks-at: weigh stacks by calls (default) or time spent in the call",
    )
    p.add_argument(
        "--stack-bytes",
        type=_stack_bytes,
        default=0,
        metavar="N",
        help=f"user stack bytes copied per sample for unwinding (1-{MAX_STACK_BYTES}, --gpu "
        f"1-{DEEP_STACK_BYTES}; default: the policy's max_stack_bytes, 8192 where it sets none; "
        "more only where max_stack_bytes allows it): less costs less, more reaches deeper",
    )
    _add_time_arguments(p)
    p.add_argument(
        "--no-children",
        action="store_true",
        help="only the process itself, not the processes it starts (default: its whole tree)",
    )
    p.add_argument(
        "--format", choices=FORMATS, help="file format (default: from the ending of -o's name)"
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the profile here")
    p.add_argument("--top", type=_count, default=TOP_N, metavar="N", help=f"default {TOP_N}")
    p.add_argument(
        "argv",  # not "command": that is the subcommand's name
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="run COMMAND and profile it until it exits",
    )


def _add_time_arguments(p: argparse.ArgumentParser) -> None:
    """--off-cpu, --wall and --min-block: time profiles (program offcpu)."""
    p.add_argument(
        "--off-cpu",
        action="store_true",
        help="time off the CPU (blocked, sleeping, preempted) per stack, in ns, instead of "
        "CPU samples; the leaf frame names the wait, e.g. [wait: futex]",
    )
    p.add_argument(
        "--wall",
        action="store_true",
        help="wall-clock time per thread: CPU samples (as time at the sampling period) "
        "and off-CPU time together, in ns",
    )
    p.add_argument(
        "--min-block",
        type=_millis,
        metavar="MS",
        help=f"with --off-cpu/--wall: ignore waits shorter than MS milliseconds "
        f"(default {DEFAULT_MIN_BLOCK_MS:g}, --wall {WALL_MIN_BLOCK_US / 1000:g}, or the "
        "policy's floor)",
    )


def _stack_bytes(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= DEEP_STACK_BYTES:
        most = f"1-{MAX_STACK_BYTES} bytes, --gpu 1-{DEEP_STACK_BYTES}"
        raise argparse.ArgumentTypeError(f"not a stack copy size ({most}): {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive count: {text!r}")
    return int(text)


def _hz(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a frequency in Hz (a positive integer): {text!r}")
    return int(text)


def _millis(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if not 0.001 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"must be 0.001 to 10000 milliseconds: {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


@dataclass
class Request(ProfileRequest):
    """The profile to take, and the file to write it to."""

    fmt: str | None = None
    output: str | None = None


def parse_request(args: argparse.Namespace) -> Request:
    """Check the flags' combinations (before connecting); UsageError says what to change."""
    command = list(args.argv or [])
    if command and command[0] == "--":
        command = command[1:]
    if args.argv and not command:
        raise UsageError("nothing after --: give the command to run, e.g. -- ./prog arg")
    if command and args.pid:
        raise UsageError("give --pid or a COMMAND to run, not both")
    req = Request(pids=list(dict.fromkeys(args.pid)), command=command, output=args.output)
    req.wakers = getattr(args, "wakers", False)  # --off-cpu --wakers (kinds/locks.py)
    req.scope, req.stack_bytes, req.job = args.scope, args.stack_bytes, args.job or ""
    req.weight, req.children = args.weight, not args.no_children
    req.frequency = args.frequency or DEFAULT_FREQUENCY
    req.fmt = args.format or format_of_output(args.output)
    if args.format and not args.output:
        req.output = DEFAULT_FILES[args.format]
    if req.output:
        check_output(req.output)
    _parse_mode(req, args)
    if args.stacks_at:
        _parse_stacks_at(req, args.stacks_at)
        if args.frequency:
            raise UsageError("--frequency is for sampling; --stacks-at counts every call")
        if len(req.pids) != 1 and not req.command:
            raise UsageError("--stacks-at needs one process: one --pid, or -- COMMAND")
    elif args.weight != "calls":
        raise UsageError("--weight is for --stacks-at (sampling weighs by samples)")
    kinds.memory.apply(req, args)
    return req


def _parse_mode(req: Request, args: argparse.Namespace) -> None:
    if args.off_cpu and args.wall:
        raise UsageError("give --off-cpu or --wall, not both (--wall includes the off-CPU time)")
    req.mode = OFF_CPU if args.off_cpu else WALL if args.wall else CPU
    if req.timed and args.stacks_at:
        raise UsageError(f"--{req.mode} samples threads; --stacks-at counts calls: not both")
    if req.mode == OFF_CPU and args.frequency:
        raise UsageError("--frequency is for CPU samples; --off-cpu records every wait")
    if args.min_block is not None:
        if not req.timed:
            raise UsageError("--min-block is for --off-cpu and --wall")
        req.min_block_us = max(1, round(args.min_block * 1000))
        req.min_block_asked = True
    elif req.mode == WALL:
        req.min_block_us = WALL_MIN_BLOCK_US
    if req.timed and args.scope not in (None, "self"):
        raise UsageError(f"--{req.mode} copies your processes' stacks: scope self only")


def _parse_stacks_at(req: Request, items: list[str]) -> None:
    for item in items:
        lib, sep, fn = item.rpartition(":")
        if not sep or not lib or not fn:
            raise UsageError(
                f"--stacks-at {item!r}: expected LIBRARY:FUNCTION, e.g. "
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1:cuLaunchKernel"
            )
        if req.library is not None and lib != req.library:
            raise UsageError("--stacks-at: all functions must be in one library per profile")
        req.library = lib
        if fn not in req.functions:
            req.functions.append(fn)


def command(args: argparse.Namespace, out: TextIO) -> int:
    """gfxclient profile; Ctrl-C ends the sampling, not the command."""
    with StopSignal() as stop:
        return run(args, out, connecting.connect, stop)


def run(args: argparse.Namespace, out: TextIO, connect: Connect, stop: Stopper) -> int:
    """gfxclient profile; returns the exit code."""
    from gfxbpf.client.profiles.engine.take import take_profile

    req = parse_request(args)
    progress = sys.stderr if sys.stderr.isatty() and not args.json else None
    collecting = gc.isenabled()
    try:
        # The collector stays off to the file written (take_profile turns it off).
        taken = take_profile(
            req, lambda: connect(args), stop, args.duration, progress, keep_collector_off=True
        )
        if taken.empty:
            _say_empty(req)
        _output(args, out, req, taken)
    finally:
        if collecting:
            gc.enable()
    return 0


def _output(args: argparse.Namespace, out: TextIO, req: Request, taken: Taken) -> None:
    """The file, then the summary (--json) or the report on out."""
    r, prof = taken.run, taken.profile
    if req.output:
        try:
            profile.write_profile(prof, req.fmt or "svg", req.output)
        except OSError as e:
            raise ClientError(f"cannot write {req.output}: {e.strerror or e}") from None
    if args.json:
        doc = _summary(req, r, prof, taken.lost, args.top)
        # From the end of sampling: maps read and detached; the file written.
        doc["read_s"] = round(taken.read_s, 4)
        doc["output_s"] = round(time.monotonic() - (r.ended or 0.0), 4)
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        out.write(_report(req, r, prof, args.top))


def _say_empty(req: Request) -> None:
    what = "no calls were counted" if req.probes else "no samples were taken"
    hint = (
        "the function was not called"
        if req.probes
        else "the target was idle (sleeping processes are not sampled) or exited at once"
    )
    if req.timed:
        what, hint = "no waits were recorded", "no thread left the CPU for --min-block or longer"
    what, hint = kinds.memory.empty(req) or (what, hint)
    print(f"gfxclient: {what} ({hint})", file=sys.stderr)


_SEEN_SHOWN = 10  # processes listed under the top functions


def _processes_lines(r: Run, what: str, show: Callable[[int], str]) -> list[str]:
    if not r.seen:
        return []
    lines = [f"processes ({len(r.seen)}):", f"  {'pid':>8}  {'command':<16} {what}"]
    for pid, comm, weight in r.seen[:_SEEN_SHOWN]:
        lines.append(f"  {pid:>8}  {printable(comm):<16} {show(weight)}")
    if len(r.seen) > _SEEN_SHOWN:
        rest = show(sum(w for _, _, w in r.seen[_SEEN_SHOWN:]))
        lines.append(f"  … {len(r.seen) - _SEEN_SHOWN} more with {rest} {what} (--json lists all)")
    return lines


def _time(ns: int) -> str:
    """Nanoseconds as people read them: 311.712 s, 12.500 ms."""
    return f"{ns / 1e9:.3f} s" if ns >= 1_000_000_000 else f"{ns / 1e6:.3f} ms"


def _report(req: Request, r: Run, prof: Profile, n: int) -> str:
    """The text report: one line per row, each field from others (a process,
    function or file name) escaped on its own, so the newlines stay real."""
    lines = [profile.format_top(prof, n).rstrip("\n")]
    what = {"nanoseconds": "ns in calls"}.get(prof.unit, prof.unit)
    show: Callable[[int], str] = str
    if req.timed:  # as the table above: time, not a count of ns
        what = "off the CPU" if req.mode == OFF_CPU else "of wall-clock time"
        show = _time
    lines.extend(_processes_lines(r, what, show))
    lines.append(
        f"{show(prof.total())} {what} in {len(prof.stacks)} stacks over {r.elapsed():.1f} s"
    )
    lines.extend(_python_lines(r.python_summary))
    lines.extend(f"note: {printable(note)}" for note in prof.notes)
    if req.output:
        lines.append(f"wrote {printable(req.output)} ({req.fmt})")
    else:
        lines.append("write a flame graph with -o FILE.svg (or --format folded|pprof|speedscope)")
    return "\n".join(lines) + "\n"


def _python_lines(section: dict[str, Any] | None) -> list[str]:
    if not section or not section["processes_walked"]:
        return []
    walked = section["processes_walked"]
    found = ", ".join(
        f"{printable(i['path'])} ({printable(str(i['version']))})" for i in section["interpreters"]
    )
    return [f"python: {len(walked)} process(es) walked; interpreters: {found}"]


def _summary(req: Request, r: Run, prof: Profile, lost: int, n: int) -> dict[str, Any]:
    waits = r.wait_reader
    return {
        # the catalog programs attached: stackcopy, ustackcopy, offcpu, or the
        # frame-pointer profile and ustacks where the policy grants no copies
        "program": r.att.program,
        "programs": [a.program for a in (r.att, r.waits_att) if a is not None],
        "mode": req.mode,
        "unit": prof.unit,
        "time": prof.time_kind,
        "frequency": None if req.probes or req.mode == OFF_CPU else req.frequency,
        "min_block_us": (req.min_block_us or round(DEFAULT_MIN_BLOCK_MS * 1000))
        if req.timed
        else None,
        "off_cpu_ns": dict(getattr(waits, "by_state", {})) if waits is not None else None,
        "waits_begun_before": getattr(waits, "before", 0) if waits is not None else None,
        "functions": [f"{req.library}:{f}" for f in req.functions] if req.probes else None,
        "pids": r.targets,
        "processes": r.processes,
        "processes_seen": [{"pid": p, "command": c, "weight": w} for p, c, w in r.seen],
        "command": req.command or None,
        "exit_status": r.child.status if r.child else None,
        "duration_s": round(r.elapsed(), 3),
        "total": prof.total(),
        "stacks": len(prof.stacks),
        "lost": lost,
        "output": req.output,
        "format": req.fmt if req.output else None,
        "top": [
            {"function": f, "self": s, "total": t} for f, s, t in profile.top_functions(prof, n)
        ],
        "python": r.python_summary,
        "notes": list(prof.notes),
    }
