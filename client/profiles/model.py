"""What the broker side hands over (RawStack) and what the writers take (Profile)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Profile.unit values.
UNITS = ("samples", "calls", "nanoseconds", "bytes")

# Frame names the symbolizer makes up (square brackets: not a function).
KERNEL_FRAME = "[kernel]"
UNKNOWN_FRAME = "[unknown]"
LOST_FRAME = "[user stack lost]"


@dataclass(frozen=True)
class RawStack:
    pid: int  # tgid of the sampled process
    user: tuple[int, ...]  # user-space addresses from the stack-trace map, innermost first
    kernel: bool  # sampled in the kernel: one "[kernel]" frame on top; never addresses
    weight: int  # samples, calls or nanoseconds (Profile.unit says which)
    comm: str = ""  # process name if known (root frame)
    user_error: str | None = None  # why there is no user stack ("lost": bpf_get_stackid failed)
    leaf: str | None = None  # extra innermost frame, e.g. "cuLaunchKernel" for stacks at a probe
    # Unwound from a stack copy (client/profiles/unwind) and stopped early: the
    # Stop value ("no-cfi", "truncated", ...); the symbolizer ends the stack
    # with one marker frame saying why. None: complete, or a kernel-walked stack.
    unwind_stop: str | None = None
    # Unwound from a stack copy by call-frame information: with no unwind_stop
    # it reached the thread's first frame (its CFI marks the return address
    # undefined), whether or not that frame has a name (a stripped libc's clone3).
    unwound: bool = False
    # Unwound from a stack copy with at least one return address found by a
    # stack scan past code without CFI (unwind/scan.py): counted in the summary.
    unwind_scanned: bool = False
    # Per-thread profiles (--wall): the thread id, shown as a frame under the root.
    thread: int | None = None
    # The sampled thread's id whatever the profile shows (0: not known, as in
    # the stack-table programs, which count per process): pprof's tid label,
    # speedscope's profile per thread. comm above is that thread's name.
    tid: int = 0
    # Python frames (client/profiles/python/mixed.py): runs innermost first,
    # each root first, put in place of the evaluation loop's native frames.
    python: tuple[tuple[str, ...], ...] = ()
    # (Python frame name, the line its function starts at: co_firstlineno), pprof's start_line.
    python_starts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Thread:
    """Who a stack was sampled in: pprof's sample labels, speedscope's profiles."""

    pid: int
    tid: int = 0  # 0: not known (RawStack.tid)
    process: str = ""  # the process's name (/proc/PID/comm)
    thread: str = ""  # the thread's name (its comm) when sampled


@dataclass(frozen=True)
class FrameInfo:
    """What a frame name stands for, for the formats that keep it apart
    (pprof's Function and Line, speedscope's frame file and line)."""

    function: str  # the function alone: "train_step", not "train_step (train.py:57)"
    system_name: str = ""  # the symbol as its file spells it (mangled C++); "" if not a symbol
    file: str = ""  # the source file (Python frames)
    line: int = 0  # the line in file (0: not known)
    start_line: int = 0  # the line the function starts at (0: not known)
    obj: str = ""  # the ELF file the code lies in (native frames)


@dataclass
class Profile:
    stacks: dict[tuple[str, ...], int]  # frame names root-first -> weight
    unit: str  # "samples" | "calls" | "nanoseconds" | "bytes"
    period_ns: int | None = None  # sampling period (1e9 / frequency) for "samples"
    duration_s: float | None = None
    notes: list[str] = field(default_factory=list)  # e.g. frame-pointer warnings for the user
    # For unit "nanoseconds": what the time is ("off_cpu", "wall", "gpu": device
    # time of kernels, "lock_wait"; None: time in calls), pprof's sample type.
    time_kind: str | None = None
    # For unit "bytes": "alloc_space" (allocated) or "inuse_space" (still held), pprof's.
    space_kind: str | None = None
    # The stacks again (the same frame names), apart per thread; empty where
    # the profile was made without threads (folded input, older callers).
    threads: dict[tuple[Thread, tuple[str, ...]], int] = field(default_factory=dict)
    # Frame name -> what it stands for; a name not here is a function alone.
    frames: dict[str, FrameInfo] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)  # ELF file -> build id (hex; "")

    def total(self) -> int:
        return sum(self.stacks.values())
