"""`gfxclient profile --locks`: time your threads wait on user-space locks,
per lock (program `locks`), and `--off-cpu --wakers`' flag.

    gfxclient profile --locks -o locks.svg -- ./myprog
    gfxclient profile --locks --pid 1234 --duration 10

Each lock is a futex word (a pthread mutex, condition variable, semaphore,
barrier, or a runtime's own lock), named by the symbol of its variable where
the process's files name it, else by its mapping and offset. Under each lock
the flame graph shows [waiters] (the stacks that waited, weighed by their
waiting time) and [holders, at release] (the stacks that released the lock
to them, weighed by the waiting time each release ended).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import TYPE_CHECKING, Any, TextIO

from gfxbpf.client.cli import connecting, gpu_profile, profile_cmd
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import ClientError, UsageError
from gfxbpf.client.printable import printable
from gfxbpf.client.profiles.engine.request import LOCKS

if TYPE_CHECKING:
    from gfxbpf.client.cli.profile_cmd import Connect, Request
    from gfxbpf.client.profiles.engine.run import Stopper
    from gfxbpf.client.profiles.engine.take import Taken
    from gfxbpf.client.profiles.locks.reader import LockReader

# Flags of the other kinds of profile that --locks does not take.
_OTHER_KINDS = ("stacks_at", "off_cpu", "wall", "min_block", "frequency", "gpu", "wakers")
_FRAMES_SHOWN = 4  # of a stack in the text report, innermost


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--locks",
        action="store_true",
        help="time waiting on user-space locks (futexes: mutexes, condition variables), per "
        "lock named by its variable's symbol, with the waiters' stacks and the stacks of "
        "the threads that released it (program locks)",
    )
    p.add_argument(
        "--wakers",
        action="store_true",
        help="with --off-cpu: each wait joined with the stack of the thread that woke it "
        "(program offwake); a waker not yours is one frame naming its kind",
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """gfxclient profile: --locks here; --wakers checked here, run by profile_cmd."""
    if args.wakers and not args.off_cpu:
        raise UsageError("--wakers goes with --off-cpu: gfxclient profile --off-cpu --wakers")
    if not args.locks:
        return gpu_profile.command(args, out)
    with StopSignal() as stop:
        return run(args, out, connecting.connect, stop)


def run(args: argparse.Namespace, out: TextIO, connect: Connect, stop: Stopper) -> int:
    """profile --locks; returns the exit code."""
    from gfxbpf.client.profiles.engine.take import take_profile

    given = [f"--{k.replace('_', '-')}" for k in _OTHER_KINDS if getattr(args, k, None)]
    if given:
        raise UsageError(f"--locks does not go with {', '.join(given)}")
    if args.scope not in (None, "self"):
        raise UsageError("--locks copies your processes' stacks: scope self only")
    req = profile_cmd.parse_request(args)
    req.mode = LOCKS
    collecting = gc.isenabled()
    try:
        taken = take_profile(
            req, lambda: connect(args), stop, args.duration, None, keep_collector_off=True
        )
        _output(args, out, req, taken)
    finally:
        if collecting:
            gc.enable()
    return 0


def _output(args: argparse.Namespace, out: TextIO, req: Request, taken: Taken) -> None:
    from gfxbpf.client.profiles import writers
    from gfxbpf.client.profiles.locks.shape import lock_rows

    reader: LockReader = taken.run.copies  # type: ignore[assignment]
    if req.output:
        try:
            writers.write_profile(taken.profile, req.fmt or "svg", req.output)
        except OSError as e:
            raise ClientError(f"cannot write {req.output}: {e.strerror or e}") from None
    if args.json:
        json.dump(_summary(req, taken, lock_rows(reader)), out, indent=2)
        out.write("\n")
    else:
        out.write(_report(req, taken, reader, args.top))


def _summary(req: Request, taken: Taken, locks: list[dict[str, Any]]) -> dict[str, Any]:
    r, prof = taken.run, taken.profile
    return {
        "program": r.att.program,
        "mode": req.mode,
        "unit": prof.unit,
        "time": prof.time_kind,
        "pids": r.targets,
        "processes": r.processes,
        "command": req.command or None,
        "exit_status": r.child.status if r.child else None,
        "duration_s": round(r.elapsed(), 3),
        "wait_ns": sum(row["wait_ns"] for row in locks),
        "locks": locks,
        "stacks": len(prof.stacks),
        "lost": taken.lost,
        "output": req.output,
        "format": req.fmt if req.output else None,
        "notes": list(prof.notes),
        "read_s": round(taken.read_s, 4),
        "output_s": round(time.monotonic() - (r.ended or 0.0), 4),
    }


def _report(req: Request, taken: Taken, reader: LockReader, n: int) -> str:
    from gfxbpf.client.profiles.locks.shape import HOLDERS_FRAME, WAITERS_FRAME, lock_table

    prof, lines = taken.profile, []
    table = lock_table(reader)
    total = sum(s.wait_ns for s in table)
    lines.append(f"{_ms(total)} waiting on {len(table)} locks over {taken.run.elapsed():.1f} s")
    for s in table[:n]:
        lines.append(
            f"  {printable(s.lock)} (pid {s.pid}): {s.waits} waits, {_ms(s.wait_ns)}; "
            f"{s.wakes} releases woke {s.woken} threads"
        )
        lock = f"[lock {s.lock}]"
        for side, what in ((WAITERS_FRAME, "waiting in"), (HOLDERS_FRAME, "released by")):
            top = _heaviest(prof.stacks, lock, side)
            if top:
                lines.append(f"      {what}: {printable(top)}")
    lines.extend(f"note: {printable(note)}" for note in prof.notes)
    if req.output:
        lines.append(f"wrote {printable(req.output)} ({req.fmt})")
    else:
        lines.append("write a flame graph with -o FILE.svg (or --format folded|pprof|speedscope)")
    return "\n".join(lines) + "\n"


def _heaviest(stacks: dict[tuple[str, ...], int], lock: str, side: str) -> str:
    """The innermost frames of the heaviest stack of one side of a lock."""
    rows = [(n, s) for s, n in stacks.items() if len(s) > 3 and s[1] == lock and s[2] == side]
    if not rows:
        return ""
    frames = max(rows)[1][3:-1]
    return " <- ".join(reversed(frames[-_FRAMES_SHOWN:]))


def _ms(ns: int) -> str:
    return f"{ns / 1e9:.3f} s" if ns >= 1_000_000_000 else f"{ns / 1e6:.3f} ms"
