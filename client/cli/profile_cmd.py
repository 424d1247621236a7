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
import contextlib
import gc
import json
import os
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from gfxbpf.bpf.consts import SCOPES
from gfxbpf.catalog.stack_copies import MAX_STACK_BYTES
from gfxbpf.client import proctree
from gfxbpf.client import profiles as profile
from gfxbpf.client.broker import Broker
from gfxbpf.client.cli import session
from gfxbpf.client.cli.stopping import StopSignal
from gfxbpf.client.errors import BrokerError, ClientError, UsageError
from gfxbpf.client.handle import Attachment
from gfxbpf.client.printable import printable
from gfxbpf.client.profiles import read as profile_read
from gfxbpf.client.profiles.writers import FORMATS
from gfxbpf.proto import gfxbpf_pb2 as pb

if TYPE_CHECKING:
    from gfxbpf.client.profiles import Profile, RawStack, Symbolizer
    from gfxbpf.client.profiles.copies import CopyReader, ProbeCopyReader
    from gfxbpf.client.profiles.procmaps import ProcessMaps, SnapshotState
    from gfxbpf.client.profiles.python.targets import Interpreters
    from gfxbpf.client.profiles.unwind import UnwindTables

    Copies = CopyReader | ProbeCopyReader

# The symbolizer and the file writers are reached through the package (which
# imports them on first use): every gfxclient command imports this module to
# build its parser (issue #15).

DEFAULT_FREQUENCY = 99
DEFAULT_MIN_BLOCK_MS = 1.0  # the broker's default (broker/request/params.py)
# --wall's default: a thread preempted for less than 1 ms, many times, would
# lose that share of its wall-clock time (the broker's own floor is 0.1 ms).
WALL_MIN_BLOCK_US = 100
# Request.mode values: CPU samples (or calls at --stacks-at), off-CPU time, both as time.
CPU, OFF_CPU, WALL = "cpu", "off-cpu", "wall"
STACK_COPIES = "stack_copies"  # program stackcopy's ring buffer
REFRESH_S = 0.02  # least time between two snapshots of one process asked by the unwinder
# Stack copies are read this often: a new process's maps are read at its first
# record, so one that lives a few ms more than this is still caught.
COPY_READ_S = 0.01
COPY_TICK_S = 0.05  # ... and the targets' trees and maps polled this often
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
        "--pid", type=_pid, action="append", default=[], help="process to profile (repeatable)"
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
        help="user stack bytes copied per sample for unwinding (1-16384; default 8192, or "
        "the policy's max_stack_bytes when lower; above 8192 where the policy's "
        "max_stack_bytes allows it): less costs less, more reaches deeper",
    )
    _add_time_arguments(p)
    p.add_argument(
        "--no-children",
        action="store_true",
        help="only the process itself, not the processes it starts (default: its whole tree)",
    )
    p.add_argument("--format", choices=FORMATS, help="file format (default: from -o, else svg)")
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


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return int(text)


def _stack_bytes(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= MAX_STACK_BYTES:
        raise argparse.ArgumentTypeError(
            f"not a stack copy size (1-{MAX_STACK_BYTES} bytes): {text!r}"
        )
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


# ------------------------------------------------------------------ the request


@dataclass
class Request:
    pids: list[int]
    command: list[str]
    library: str | None = None
    functions: list[str] = field(default_factory=list)
    fmt: str | None = None
    output: str | None = None
    weight: str = "calls"  # --stacks-at: "calls" or "time"
    frequency: int = DEFAULT_FREQUENCY
    children: bool = True  # follow the targets' descendants (--no-children: False)
    mode: str = CPU  # CPU, OFF_CPU (--off-cpu) or WALL (--wall)
    min_block_us: int = 0  # --min-block; 0: the broker's default
    min_block_asked: bool = False  # given by --min-block (else --wall may retry higher)

    @property
    def timed(self) -> bool:
        """Weighed in nanoseconds of wall-clock time (off-CPU or wall)."""
        return self.mode != CPU

    @property
    def probes(self) -> bool:
        return self.library is not None


def _format_from(output: str | None) -> str | None:
    if output is None:
        return None
    name = output.lower()
    for suffix, fmt in (
        (".svg", "svg"),
        (".folded", "folded"),
        (".txt", "folded"),
        (".pb.gz", "pprof"),
        (".pprof", "pprof"),
        (".speedscope.json", "speedscope"),
        (".json", "speedscope"),
    ):
        if name.endswith(suffix):
            return fmt
    return None


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
    req.weight = args.weight
    req.children = not args.no_children
    req.frequency = args.frequency or DEFAULT_FREQUENCY
    req.fmt = args.format or _format_from(args.output) or ("svg" if args.output else None)
    if args.format and not args.output:
        req.output = DEFAULT_FILES[args.format]
    _parse_mode(req, args)
    if args.stacks_at:
        _parse_stacks_at(req, args.stacks_at)
        if args.frequency:
            raise UsageError("--frequency is for sampling; --stacks-at counts every call")
        if len(req.pids) != 1 and not req.command:
            raise UsageError("--stacks-at needs one process: one --pid, or -- COMMAND")
    elif args.weight != "calls":
        raise UsageError("--weight is for --stacks-at (sampling weighs by samples)")
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


# ------------------------------------------------------------------ the target


class Child:
    """COMMAND forked and held before exec until the broker has attached."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # the child: wait for the go, then become COMMAND
            os.close(go_w)
            os.close(err_r)
            try:
                if os.read(go_r, 1) == b"g":  # EOF: the parent gave up (attach failed)
                    os.execvp(argv[0], argv)
                os._exit(127)
            except BaseException as e:  # noqa: BLE001 - reported by the parent
                with contextlib.suppress(OSError):
                    os.write(err_w, str(getattr(e, "strerror", None) or e).encode()[:500])
            os._exit(127)
        os.close(go_r)
        os.close(err_w)
        self.pid = pid
        self._go = go_w
        self._err = err_r
        self.status: int | None = None

    def release(self) -> None:
        """Let it exec; returns once it has (or raises UsageError if it could not)."""
        os.write(self._go, b"g")
        os.close(self._go)
        self._go = -1
        chunks = []
        while chunk := os.read(self._err, 512):  # EOF: exec closed the CLOEXEC end
            chunks.append(chunk)
        os.close(self._err)
        self._err = -1
        if chunks:
            self.wait()
            why = b"".join(chunks).decode(errors="replace")
            raise UsageError(f"cannot run {self.argv[0]!r}: {why}")

    def poll(self) -> bool:
        """True once it has exited (reaped)."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is not None

    def wait(self) -> int:
        if self.status is None:
            _, status = os.waitpid(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(status)
        return self.status

    def abandon(self) -> None:
        """Attach failed: the child never runs COMMAND."""
        for fd in (self._go, self._err):
            if fd >= 0:
                os.close(fd)  # the child reads EOF and exits 127
        self._go = self._err = -1
        self.wait()


class Maps:
    """/proc/PID/maps of each process, captured while it lives, fed to the symbolizer."""

    def __init__(self, symbolizer: Symbolizer) -> None:
        self.symbolizer = symbolizer
        self.seen: set[int] = set()
        self.comms: dict[int, str] = {}  # command names (probes' keys carry none)
        # The first snapshot of each process: the symbolizer merges later ones
        # into it, so it is the whole picture the unwinder should see too.
        self.procs: dict[int, ProcessMaps] = {}
        self.refreshed: dict[int, float] = {}  # pid -> when process() last captured it
        self.states: dict[int, SnapshotState] = {}  # pid -> what its last snapshot was taken from

    def capture(self, pids: list[int] | set[int]) -> None:
        for pid in pids:
            state = profile.snapshot_state(pid)
            if state is None or state == self.states.get(pid):
                continue  # gone, or the snapshot would be the last one again
            maps = profile.capture(pid, text=state[0])
            if maps is not None and maps.mappings:  # a zombie has none
                self.states[pid] = state
                self.procs.setdefault(pid, maps)
                self.symbolizer.add_process(pid, maps)
                self.seen.add(pid)
                with contextlib.suppress(OSError):
                    with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                        self.comms[pid] = f.read().strip()

    def process(self, pid: int, refresh: bool = False) -> ProcessMaps | None:
        """The process's maps, captured now if never seen (scope-wide runs) or if
        refresh: a sample from code mapped since the last snapshot (a library the
        loader just mapped), at most every REFRESH_S per process."""
        now = time.monotonic()
        if pid not in self.procs or (refresh and now - self.refreshed.get(pid, 0) >= REFRESH_S):
            self.refreshed[pid] = now
            self.capture([pid])
        return self.procs.get(pid)


# ------------------------------------------------------------------ sampling


class Stopper(Protocol):
    """What cli.StopSignal offers: a flag set by Ctrl-C, and a wait that it ends."""

    stopped: bool

    def wait(self, timeout: float) -> bool: ...


@dataclass
class Run:
    """One profile being taken: its attachment, targets and progress."""

    req: Request
    att: Attachment
    maps: Maps
    child: Child | None
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    ticked: float = 0.0  # when tick() last ran
    samples: int = 0
    processes: list[int] = field(default_factory=list)  # tgids the profile holds
    seen: list[tuple[int, str, int]] = field(default_factory=list)  # (pid, comm, weight)
    family: set[int] = field(default_factory=set)  # the targets' descendants seen in /proc
    kernel_tree: bool = False  # the kernel follows the target's tree: keep every row
    # Stack id -> user addresses, read while sampling: an id keeps its stack for
    # the table's life (no BPF_F_REUSE_STACKID), so after it only new ids are read.
    stacks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # Programs stackcopy, ustackcopy, offcpu: records unwound as they are read (no stack table).
    copies: Copies | None = None
    # --wall: the offcpu attachment beside the sampling one, and its reader.
    waits_att: Attachment | None = None
    waits: CopyReader | None = None
    # The CPython executables sent for the kernel to walk (and those it cannot).
    pythons: Interpreters | None = None
    python_summary: dict[str, Any] | None = None
    py_counts: dict[str, int] = field(default_factory=dict)  # the program's py_counts

    @property
    def targets(self) -> list[int]:
        return [self.child.pid] if self.child else self.req.pids

    def kept(self) -> list[int]:
        """The processes whose rows to keep (empty: all the kernel counted)."""
        if self.kernel_tree or not self.targets:
            return []
        return self.targets + sorted(self.family)

    @property
    def counts_map(self) -> str:
        return "calls" if self.req.probes else "counts"

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def done(self, duration: float | None) -> bool:
        if duration is not None and self.elapsed() >= duration:
            return True
        if self.child is not None:
            return self.child.poll()
        # Explicit pids: stop when none is left running.
        return bool(self.req.pids) and not any(_running(p) for p in self.req.pids)

    def tick(self, read: bool, progress: bool) -> None:
        """Capture the targets' maps; every so often read what came in so far
        (through the broker, as over gRPC, only to show progress or find pids)."""
        if self.targets:
            if self.req.children:
                self.family |= proctree.descendants(self.targets)
            self.maps.capture(self.targets + sorted(self.family))
        if self.copies is not None:
            from gfxbpf.client.profiles.copies import CopyReader  # imported by _copy_reader

            if isinstance(self.copies, CopyReader):
                self.copies.wanted = set(self.kept())  # several --pid: their families too
            self.copies.drain()
            self.samples = self.copies.records
            if self.waits is not None:
                self.waits.wanted = set(self.kept())
                self.waits.drain()
                self.samples += self.waits.records
            return
        direct = self.att.map(self.counts_map).fd is not None
        if read and (direct or progress or not self.targets):
            entries = self.att.map(self.counts_map).raw_items()
            self.samples = _total(entries, self.req.probes)
            if not self.targets or self.req.children:  # name whatever was sampled
                pids = {_TGID.unpack_from(k)[0] for k, _ in entries}  # first in both keys
                self.maps.capture(pids - self.maps.seen)
            self.read_stacks(entries, warm=True)

    def read_stacks(self, entries: list[tuple[bytes, Any]], warm: bool = False) -> None:
        """The stacks these entries name that were not read yet; warm: name
        their frames now too (sampling only: probes' stacks are rearranged)."""
        ids = profile_read.stack_ids(entries, self.req.probes) - self.stacks.keys()
        if not ids:
            return
        stacks = self.att.map("stacks")
        # Through the fd, only the stacks the counts name (no walk of the table).
        found = stacks.lookup_many(struct.pack("<I", i) for i in sorted(ids))
        if found is None and warm:
            return  # read through the broker: the whole table, so once, at the end
        new = profile_read.stack_table(stacks.raw_items() if found is None else found)
        self.stacks.update(new)
        if warm and not self.req.probes:
            by_pid: dict[int, list[tuple[int, ...]]] = {}
            for key, _ in entries:
                tgid, sid = profile_read.SAMPLE_KEY.unpack(key)[:2]
                if sid in new:
                    by_pid.setdefault(tgid, []).append(new[sid])
            for pid, user in by_pid.items():
                self.maps.symbolizer.warm(pid, user)


_TGID = struct.Struct("<I")


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie waits for its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[:1]
    except OSError:
        return False
    return state not in ([b"Z"], [b"X"])


def _total(entries: list[tuple[bytes, Any]], probes: bool) -> int:
    if probes:
        return sum(profile_read.CALL_STATS.unpack(v)[0] for _, v in entries)
    return sum(profile_read.U64.unpack(v)[0] for _, v in entries)


def sample(run: Run, stop: Stopper, duration: float | None, progress: TextIO | None) -> None:
    """Until the targets exit, the duration ends or Ctrl-C; maps captured all along."""
    last_count = 0.0
    while not run.done(duration) and not stop.stopped:
        now = time.monotonic()
        count = now - last_count >= 1.0
        if count:
            last_count = now
        if run.copies is None or run.elapsed() < 0.1 or now - run.ticked >= COPY_TICK_S:
            run.ticked = now
            run.tick(count, progress is not None)
        if progress is not None and count:
            what = "calls" if run.req.probes else "samples"
            progress.write(f"\rprofiling: {run.elapsed():5.1f} s, {run.samples} {what}  ")
            progress.flush()
        if run.copies is not None:  # the ring holds ~250 ms of a CPU at 999 Hz
            # The first 100 ms a snapshot a millisecond: a process that lives a few
            # ms must be caught after its loader mapped the libraries, or its
            # copies cannot be unwound (its maps are gone once it exits).
            if run.elapsed() < 0.1:
                run.copies.drain(0.001)
            else:  # then in batches: a wake per record costs more than its unwind
                stop.wait(max(0.0, COPY_READ_S - (time.monotonic() - now)))
                run.copies.drain()
            if run.waits is not None:
                run.waits.drain()
            continue
        # Often at first: a short-lived process must be caught with its libraries.
        stop.wait(0.05 if run.elapsed() < 1.0 else 0.25)
    run.ended = time.monotonic()
    if progress is not None:
        progress.write("\n")
        progress.flush()


def collect(run: Run) -> tuple[list[RawStack], int]:
    """Raw stacks from the maps (targets only), and the count the tables lost."""
    att, req = run.att, run.req
    if run.copies is not None:
        return _collect_copies(run, run.copies)
    entries = att.map(run.counts_map).raw_items()
    run.read_stacks(entries)
    stacks = run.stacks
    if req.probes:
        raw = profile_read.call_stacks(entries, stacks, req.functions, req.weight)
    else:
        raw = profile_read.profile_stacks(entries, stacks, run.kept())
    return raw, profile_read.lost_count(att.map("lost").raw_items())


def _collect_copies(run: Run, copies: Copies) -> tuple[list[RawStack], int]:
    from gfxbpf.client.profiles.copies import CopyReader

    copies.stream.flush()  # what the ring holds now, past the reading thread
    while copies.drain():  # what came in since the last look
        pass
    lost = profile_read.lost_count(run.att.map("lost").raw_items())
    if "py_counts" in run.att.maps:
        run.py_counts = _py_counts(run.att.map("py_counts").raw_items())
    if run.waits is not None and run.waits_att is not None:
        run.waits.stream.flush()
        while run.waits.drain():
            pass
        lost += profile_read.lost_count(run.waits_att.map("lost").raw_items())
    if isinstance(copies, CopyReader):
        waited = run.waits.raw_stacks() if run.waits is not None else []
        return copies.raw_stacks() + waited, lost
    entries = run.att.map("calls").raw_items()
    req = run.req
    return copies.raw_stacks(entries, req.functions, req.weight)[0], lost


# py_counts indexes (gfx_python.h GFX_PYC_*) -> the summary's names
_PY_COUNTS = ("walked", "truncated", "no_thread_state", "unreadable", "codes_not_stored")


def _py_counts(entries: list[tuple[bytes, Any]]) -> dict[str, int]:
    out = {}
    for key, value in entries:
        i = _TGID.unpack_from(key)[0]
        if i < len(_PY_COUNTS) and isinstance(value, bytes) and len(value) == 8:
            out[_PY_COUNTS[i]] = profile_read.U64.unpack(value)[0]
    return out


# ------------------------------------------------------------------ the command


def _attach(
    broker: Broker,
    args: argparse.Namespace,
    req: Request,
    pid: int | None,
    pythons: Interpreters | None = None,
) -> Attachment:
    children = req.children and pid is not None  # several --pid: kept here, by /proc
    files = python_files(pythons)
    if req.mode == OFF_CPU:
        return _attach_offcpu(broker, req, pid, children, files)
    if req.mode == WALL:  # the samples here; _attach_waits adds the offcpu attachment
        copies = _try_copies(
            broker, args, "stackcopy", files, pid=pid, frequency=req.frequency, children=children
        )
        if copies is None:
            raise ClientError(
                "--wall needs program stackcopy (stack copies), which the policy does not "
                "grant you: ask the administrator, or use --off-cpu and a CPU profile apart"
            )
        return copies
    if req.probes:
        where: dict[str, Any] = {
            "library": req.library,
            "functions": req.functions,
            "children": children,
        }
        copies = _try_copies(broker, args, "ustackcopy", files, pid=pid, **where)
        return copies or broker.attach("ustacks", scope=args.scope, pid=pid, **where)
    sampling: dict[str, Any] = {"frequency": req.frequency, "children": children}
    copies = _try_copies(broker, args, "stackcopy", files, pid=pid, **sampling)
    return copies or broker.attach("profile", scope=args.scope, pid=pid, **sampling)


def _attach_waits(
    broker: Broker,
    req: Request,
    sampling: Attachment,
    pid: int | None,
    pythons: Interpreters | None = None,
) -> Attachment | None:
    """--wall: offcpu beside the sampling attachment (detached if it cannot attach)."""
    if req.mode != WALL:
        return None
    try:
        children = req.children and pid is not None
        return _attach_offcpu(broker, req, pid, children, python_files(pythons))
    except BaseException:
        sampling.detach()
        raise


def python_files(pythons: Interpreters | None) -> list[pb.PythonFile]:
    """The attach request's interpreters: the CPython executables and shared
    libpythons to walk."""
    return [
        pb.PythonFile(
            dev=f.dev,
            ino=f.ino,
            runtime_off=f.runtime_off or 0,
            major=f.version[0],
            minor=f.version[1],
            library=f.is_library,
        )
        for f in (pythons.files.values() if pythons else ())
    ]


def _attach_offcpu(
    broker: Broker, req: Request, pid: int | None, children: bool, files: list[pb.PythonFile]
) -> Attachment:
    kw: dict[str, Any] = {"pid": pid, "children": children, "min_block_us": req.min_block_us}
    try:
        try:
            return broker.attach("offcpu", scope="self", python_files=files, **kw)
        except BrokerError as e:
            if files and e.code == pb.ERROR_INVALID_ARGUMENT and "Python" in str(e):
                return broker.attach("offcpu", scope="self", **kw)  # walks no Python
            if req.min_block_asked or e.code != pb.ERROR_PERMISSION_DENIED or "below" not in str(e):
                raise
            # --wall's 0.1 ms is under this policy's floor: the broker's default then.
            req.min_block_us = kw["min_block_us"] = 0
            return broker.attach("offcpu", scope="self", python_files=files, **kw)
    except BrokerError as e:
        if e.code == pb.ERROR_NOT_FOUND:
            raise ClientError(
                f"--{req.mode} needs program offcpu, which this broker does not offer "
                f"(or the policy does not grant you): {e}"
            ) from None
        raise


def _try_copies(
    broker: Broker, args: argparse.Namespace, name: str, files: list[pb.PythonFile], **kw: Any
) -> Attachment | None:
    """The stack-copy program, for complete stacks; None where it is not granted
    (or an older broker lacks it): then frame-pointer stacks, as before. An
    older broker that walks no Python frames gets the request without files."""
    if args.scope not in (None, "self"):
        return None  # copies are process memory: scope self only
    stack_bytes = getattr(args, "stack_bytes", 0)
    try:
        kw["stack_bytes"] = stack_bytes
        try:
            return broker.attach(name, scope="self", python_files=files, **kw)
        except BrokerError as e:
            if not files or e.code != pb.ERROR_INVALID_ARGUMENT or "Python" not in str(e):
                raise
            return broker.attach(name, scope="self", **kw)
    except BrokerError as e:
        if stack_bytes or e.code not in (pb.ERROR_PERMISSION_DENIED, pb.ERROR_NOT_FOUND):
            raise  # --stack-bytes asks for copies: no quiet fallback to frame pointers
        return None


def _unwind_tables() -> UnwindTables:
    """One set of unwind tables per run, shared by the unwinder and the symbolizer."""
    from gfxbpf.client.profiles.unwind import UnwindTables

    return UnwindTables()


def _copy_reader(r: Run, symbolizer: Symbolizer, tables: UnwindTables) -> Copies:
    from gfxbpf.client.profiles.copies import CopyReader, ProbeCopyReader
    from gfxbpf.client.profiles.unwind import MAX_FRAMES

    symbolizer.stack_depth = MAX_FRAMES  # the unwinder's frame limit, not a table's depth
    stream = r.att.open_events(STACK_COPIES)
    codes = code_book(r.att)
    if r.req.probes:
        return ProbeCopyReader(stream, r.maps.process, tables, codes)
    req = r.req
    reader = CopyReader(
        stream,
        r.maps.process,
        tables,
        r.kept(),
        codes,
        sample_ns=1_000_000_000 // req.frequency if req.mode == WALL else 0,
        waits=req.mode == OFF_CPU,
        threads=req.mode == WALL,
    )
    if req.timed:  # this process waits for records most of the time: not a finding
        reader.skip.add(os.getpid())
    return reader


def _waits_reader(r: Run, att: Attachment, tables: UnwindTables) -> CopyReader:
    """--wall: the offcpu attachment's waits, per thread like the samples."""
    from gfxbpf.client.profiles.copies import CopyReader

    stream = att.open_events(STACK_COPIES)
    reader = CopyReader(
        stream, r.maps.process, tables, r.kept(), code_book(att), waits=True, threads=True
    )
    reader.skip.add(os.getpid())
    return reader


def code_book(att: Attachment) -> Any:
    """The Python code objects the program copied (None: it walks no Python)."""
    if "py_codes" not in att.maps:
        return None
    from gfxbpf.client.profiles.python.records import CodeBook

    codes = att.map("py_codes")
    return CodeBook(codes.lookup_many, codes.raw_items)


def _one_pid(req: Request, child: Child | None) -> int | None:
    """The pid the kernel filters on: COMMAND's, or a single --pid (several: the
    kernel filters by uid and this client keeps the chosen ones)."""
    if child is not None:
        return child.pid
    return req.pids[0] if len(req.pids) == 1 else None


def command(args: argparse.Namespace, out: TextIO) -> int:
    """gfxclient profile; Ctrl-C ends the sampling, not the command."""
    with StopSignal() as stop:
        return run(args, out, session.connect, stop)


def run(
    args: argparse.Namespace,
    out: TextIO,
    connect: Callable[[argparse.Namespace], Broker],
    stop: Stopper,
) -> int:
    """gfxclient profile; returns the exit code."""
    collecting = gc.isenabled()
    try:
        return _run(args, out, connect, stop)
    finally:
        if collecting:  # _run turns the collector off once sampling ends
            gc.enable()


def _run(
    args: argparse.Namespace,
    out: TextIO,
    connect: Callable[[argparse.Namespace], Broker],
    stop: Stopper,
) -> int:
    req = parse_request(args)
    tables = _unwind_tables()
    symbolizer = profile.Symbolizer(unwind_tables=tables)
    child = Child(req.command) if req.command else None
    pythons = _find_pythons(req, args)
    try:
        broker = connect(args)
        try:
            att = _attach(broker, args, req, _one_pid(req, child), pythons)
            waits_att = _attach_waits(broker, req, att, _one_pid(req, child), pythons)
        except BaseException:
            broker.close()
            raise
    except BaseException:
        if child is not None:
            child.abandon()
        raise
    with broker:
        r = _new_run(req, att, symbolizer, tables, child)
        r.pythons = pythons
        if waits_att is not None:
            r.waits_att, r.waits = waits_att, _waits_reader(r, waits_att, tables)
        try:
            if child is not None:
                child.release()
                r.started = time.monotonic()
            progress = sys.stderr if sys.stderr.isatty() and not args.json else None
            sample(r, stop, args.duration, progress)
            # From here to the file, tens of thousands of rows become objects that
            # all live to the end: the cyclic collector would only walk them (~1/3
            # of profile_stacks' time with 16,000 rows).
            gc.disable()
            raw, lost = collect(r)
            r.processes = sorted({s.pid for s in raw})
            r.seen = processes_seen(raw, r.maps.comms)
        finally:
            att.detach()
            if waits_att is not None:
                waits_att.detach()
    if not raw:
        _say_empty(r)
    read_s = time.monotonic() - (r.ended or 0.0)
    _output(args, out, r, _symbolize(symbolizer, r, raw, lost), (lost, read_s))
    return 0


def _output(
    args: argparse.Namespace, out: TextIO, r: Run, prof: Profile, read: tuple[int, float]
) -> None:
    """The file, then the summary (--json) or the report on out; read: the
    records lost and the seconds from the end of sampling to detached."""
    req = r.req
    lost, read_s = read
    if req.output:
        try:
            profile.write_profile(prof, req.fmt or "svg", req.output)
        except OSError as e:
            raise ClientError(f"cannot write {req.output}: {e.strerror or e}") from None
    if args.json:
        doc = _summary(r, prof, lost, args.top)
        # From the end of sampling: maps read and detached; the file written.
        doc["read_s"] = round(read_s, 4)
        doc["output_s"] = round(time.monotonic() - (r.ended or 0.0), 4)
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        out.write("\n".join(printable(ln) for ln in _report(r, prof, args.top).split("\n")))


def _find_pythons(req: Request, args: argparse.Namespace) -> Interpreters | None:
    """The CPython executables to walk (scope self only: the walk reads process memory)."""
    if args.scope not in (None, "self"):
        return None
    from gfxbpf.client.profiles.python.targets import find

    return find(req.pids, req.command)


def _new_run(
    req: Request, att: Attachment, symbolizer: Symbolizer, tables: UnwindTables, child: Child | None
) -> Run:
    """The run's state: stacks from copies (stackcopy) or from the stack table."""
    r = Run(req, att, Maps(symbolizer), child)
    r.kernel_tree = req.children and _one_pid(req, child) is not None
    if STACK_COPIES in att.maps:
        r.copies = _copy_reader(r, symbolizer, tables)
    else:
        symbolizer.stack_depth = att.map("stacks").desc.value_size // 8
    return r


def _say_empty(r: Run) -> None:
    what = "no calls were counted" if r.req.probes else "no samples were taken"
    hint = (
        "the function was not called"
        if r.req.probes
        else "the target was idle (sleeping processes are not sampled) or exited at once"
    )
    if r.req.timed:
        what = "no waits were recorded"
        hint = "no thread of the target left the CPU for --min-block or longer"
    print(f"gfxclient: {what} ({hint})", file=sys.stderr)


def _symbolize(symbolizer: Symbolizer, r: Run, raw: list[RawStack], lost: int) -> Profile:
    req = r.req
    if req.probes:
        unit, period = ("calls" if req.weight == "calls" else "nanoseconds"), None
    elif req.timed:
        unit, period = "nanoseconds", None
    else:
        unit, period = "samples", 1_000_000_000 // req.frequency
    # Processes sampled but never captured (everything in scope): try them now.
    r.maps.capture({s.pid for s in raw} - r.maps.seen)
    prof = symbolizer.symbolize(raw, unit, period_ns=period, duration_s=round(r.elapsed(), 3))
    if req.timed:
        prof.time_kind = "off_cpu" if req.mode == OFF_CPU else "wall"
    _python_notes(r, prof)
    if lost and r.copies is not None:
        prof.notes.append(
            f"{lost} stack copies were dropped: the ring buffer was full (this gfxclient "
            "fell behind; sample at a lower --frequency"
            + (", or raise --min-block)" if req.timed else ")")
        )
    elif lost:
        prof.notes.append(
            f"{lost} {'calls' if req.probes else 'samples'} could not be counted: the broker's "
            "table was full (profile fewer processes, or for a shorter time)"
        )
    return prof


def _python_notes(r: Run, prof: Profile) -> None:
    """The Python section of the summary (kept on the run) and its notes."""
    if r.pythons is None or r.copies is None:
        return
    from gfxbpf.client.profiles.python.targets import report

    py = r.copies.python
    procs = r.maps.procs
    profiled = {
        pid: (comm, [m.file_path for m in procs[pid].mappings] if pid in procs else [])
        for pid, comm, _ in r.seen
    }
    r.python_summary, notes = report(r.pythons, py.versions, profiled)
    r.python_summary["truncated"] = py.truncated
    r.python_summary["walker"] = r.py_counts
    bad = r.py_counts.get("unreadable", 0)
    if bad > r.py_counts.get("walked", 0) // 100:  # a thread starting or ending: a few
        prof.notes.append(
            f"{r.py_counts['unreadable']} Python walks stopped at unreadable interpreter memory "
            "(a thread starting or ending, or an interpreter this layout does not describe)"
        )
    prof.notes.extend(notes)


def processes_seen(
    raw: list[RawStack], comms: dict[int, str] | None = None
) -> list[tuple[int, str, int]]:
    """(pid, command, weight) of each process in the profile, heaviest first;
    comms names the processes whose rows carry no command (probes)."""
    by_pid: dict[int, list[Any]] = {}
    for s in raw:
        row = by_pid.setdefault(s.pid, [(comms or {}).get(s.pid, ""), 0])
        row[0] = s.comm or row[0]
        row[1] += s.weight
    return sorted(((p, c, w) for p, (c, w) in by_pid.items()), key=lambda t: (-t[2], t[0]))


_SEEN_SHOWN = 10  # processes listed under the top functions


def _processes_lines(r: Run, what: str) -> list[str]:
    if not r.seen:
        return []
    lines = [f"processes ({len(r.seen)}):", f"  {'pid':>8}  {'command':<16} {what}"]
    for pid, comm, weight in r.seen[:_SEEN_SHOWN]:
        lines.append(f"  {pid:>8}  {printable(comm):<16} {weight}")
    if len(r.seen) > _SEEN_SHOWN:
        rest = sum(w for _, _, w in r.seen[_SEEN_SHOWN:])
        lines.append(f"  … {len(r.seen) - _SEEN_SHOWN} more with {rest} {what} (--json lists all)")
    return lines


def _report(r: Run, prof: Profile, n: int) -> str:
    lines = [profile.format_top(prof, n).rstrip("\n")]
    what = {"nanoseconds": "ns in calls"}.get(prof.unit, prof.unit)
    if r.req.timed:
        what = "ns off the CPU" if r.req.mode == OFF_CPU else "ns of wall-clock time"
    lines.extend(_processes_lines(r, what))
    lines.append(f"{prof.total()} {what} in {len(prof.stacks)} stacks over {r.elapsed():.1f} s")
    lines.extend(_python_lines(r.python_summary))
    lines.extend(f"note: {note}" for note in prof.notes)
    if r.req.output:
        lines.append(f"wrote {r.req.output} ({r.req.fmt})")
    else:
        lines.append("write a flame graph with -o FILE.svg (or --format folded|pprof|speedscope)")
    return "\n".join(lines) + "\n"


def _python_lines(section: dict[str, Any] | None) -> list[str]:
    if not section or not section["processes_walked"]:
        return []
    walked = section["processes_walked"]
    found = ", ".join(f"{i['path']} ({i['version']})" for i in section["interpreters"])
    return [f"python: {len(walked)} process(es) walked; interpreters: {found}"]


def _summary(r: Run, prof: Profile, lost: int, n: int) -> dict[str, Any]:
    req = r.req
    waits = r.waits if r.waits is not None else r.copies if req.mode == OFF_CPU else None
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
        # ns off the CPU per state (sleeping, uninterruptible, preempted)
        "off_cpu_ns": dict(getattr(waits, "by_state", {})) if waits is not None else None,
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
