"""What the broker side hands over (RawStack) and what the writers take (Profile)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Profile.unit values.
UNITS = ("samples", "calls", "nanoseconds")

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
    # Python frames (client/profiles/python/mixed.py): runs innermost first,
    # each root first, put in place of the evaluation loop's native frames.
    python: tuple[tuple[str, ...], ...] = ()


@dataclass
class Profile:
    stacks: dict[tuple[str, ...], int]  # frame names root-first -> weight
    unit: str  # "samples" | "calls" | "nanoseconds"
    period_ns: int | None = None  # sampling period (1e9 / frequency) for "samples"
    duration_s: float | None = None
    notes: list[str] = field(default_factory=list)  # e.g. frame-pointer warnings for the user
    # For unit "nanoseconds": what the time is ("off_cpu", "wall"; None: time in calls),
    # pprof's sample type.
    time_kind: str | None = None

    def total(self) -> int:
        return sum(self.stacks.values())
