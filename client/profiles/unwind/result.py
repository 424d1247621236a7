"""What an unwind takes and gives: the sampled registers, the frames found,
and why the walk stopped early (if it did), with the marker frame and the
summary lines a profile shows for each reason.

Kept free of ELF and parsing code so the BPF side's reader (profiles/copies.py)
and the writers can import it without paying for the table builder.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from gfxbpf.catalog.stack_copies import MAX_STACK_BYTES

__all__ = [
    "MAX_FRAMES",
    "CopySize",
    "Stop",
    "StopCounts",
    "UnwindResult",
    "UserRegs",
    "marker_frame",
    "stop_text",
]

# Frames one unwind returns at most: a guard against a walk that loops, not a
# limit a real stack meets. At 127 (the kernel's perf_event_max_stack) `import
# torch`'s nested imports stopped there in 12% of a short training script's
# samples with copied bytes left; the 24 KiB copy holds about 140 of CPython's
# frames, and 512 frames of 48 bytes.
MAX_FRAMES = 512


@dataclass(frozen=True, slots=True)
class UserRegs:
    """The user registers at the sample (or at a probe's function entry):
    instruction pointer, stack pointer (where the stack copy starts) and rbp."""

    ip: int
    sp: int
    bp: int


class Stop(enum.StrEnum):
    """Why an unwind ended before the thread's first frame (a stack that reaches
    it, e.g. _start or clone3 whose CFI marks the return address undefined, has
    no reason: UnwindResult.stop is None)."""

    NO_CFI = (
        "no-cfi"  # code of a file with no CFI for that pc; frame pointers gave nothing plausible
    )
    JIT = "jit"  # anonymous executable memory (a JIT): no CFI to follow
    NOT_CODE = "not-code"  # a return address outside every executable mapping (a broken chain)
    NO_FILE = "no-file"  # the mapped file could not be read (gone, replaced, not the caller's)
    # The mapped file's call-frame table was refused as a whole (crafted or
    # corrupt: build.BadTable); its marker frame names the file.
    BAD_TABLE = "bad-table"
    TRUNCATED = "truncated"  # the next frame lies beyond the copied stack bytes
    BAD_CFA = (
        "bad-cfa"  # the frame address does not move up the stack, or its rule is not one we follow
    )
    DEPTH = "depth"  # MAX_FRAMES (or the caller's max_frames) reached
    # Stacks at a probe (ustackcopy): calls counted in one row came from
    # several paths; the stack holds the frames they share.
    MERGED = "merged"


# One marker frame per reason, the outermost frame of a stack that stopped early.
_MARKERS = {
    Stop.NO_CFI: "[unwind stopped: no CFI]",
    Stop.JIT: "[unwind stopped: JIT code]",
    Stop.NOT_CODE: "[unwind stopped: not code]",
    Stop.NO_FILE: "[unwind stopped: file unreadable]",
    Stop.BAD_TABLE: "[unwind stopped: bad table in {}]",
    Stop.TRUNCATED: "[unwind stopped: stack copy too short]",
    Stop.BAD_CFA: "[unwind stopped: bad frame]",
    Stop.DEPTH: "[unwind stopped: too deep]",
    Stop.MERGED: "[several call paths]",
}
# What the profile's notes say about each reason.
_EXPLAIN = {
    Stop.NO_CFI: "code without call-frame information nor a valid frame pointer",
    Stop.JIT: "JIT-compiled code (anonymous memory has no unwind tables)",
    Stop.NOT_CODE: "a return address that is not in any executable mapping",
    Stop.NO_FILE: "a mapped file that could not be read or was replaced",
    Stop.BAD_TABLE: "a mapped file whose call-frame table was refused (crafted, corrupt or "
    "too large)",
    Stop.TRUNCATED: "a stack deeper than the copied stack bytes",
    Stop.BAD_CFA: "a frame whose call-frame rule could not be followed",
    Stop.DEPTH: "the frame limit",
    Stop.MERGED: "calls from several paths that share their innermost caller",
}


# What the user can do about a cut copy ({most}: the most the program copies;
# {copied}: what it copied; {program}: the catalog program): ask for more, where
# --stack-bytes asked for less ...
_ASK_MORE = (
    "; --stack-bytes {most} copies more where the policy's max_stack_bytes for {program} allows it"
)
# ... ask the administrator, where the copies were the policy's own size (no
# --stack-bytes: the broker copies what the policy allows, 8192 where it says
# nothing; `approve offcpu` writes no more, since it copies at every wait) ...
_ASK_ADMIN = (
    "; the copies were the {copied} bytes the policy lets {program} copy (its "
    "max_stack_bytes, or 8192 where it sets none): an administrator can allow up to {most} "
    "with `gfxbpf-admin approve {program} --max-stack-bytes {most}`"
)
# ... and nothing to do, where the copies were already that large.
_AT_MOST = (
    "; the copies were already the {most} bytes gfxbpf takes at most, so the frames deeper "
    "in the stack are not shown (Python frames are: the kernel walks them)"
)


@dataclass(frozen=True, slots=True)
class CopySize:
    """The size of the stack copies a profile was unwound from, for the
    advice on stacks cut at its end."""

    copied: int = 0  # bytes of the largest copy unwound (0: not known)
    most: int = MAX_STACK_BYTES  # the most the program copies (catalog/stack_copies.py)
    program: str = "the program"  # the catalog program that copied them
    asked: int = 0  # --stack-bytes (0: none; the broker copied the policy's size)

    def advice(self) -> str:
        """What a note on stacks cut at the copy's end adds."""
        if self.copied >= self.most:
            text = _AT_MOST
        elif self.asked or not self.copied:
            text = _ASK_MORE
        else:
            text = _ASK_ADMIN
        return text.format(most=self.most, copied=self.copied, program=self.program)


def marker_frame(stop: Stop | str) -> str:
    """The frame name that ends (outermost) a stack unwound only partly;
    square brackets, like every frame the symbolizer makes up. stop is a Stop,
    or the text of one with its file ("bad-table:/path", stop_text())."""
    reason, _, where = str(stop).partition(":")
    return _MARKERS[Stop(reason)].format(where or "a file")


def stop_text(stop: Stop, where: str = "") -> str:
    """A stop reason as the profile's records carry it: the Stop's value, and
    for BAD_TABLE the file it stopped in ("bad-table:/usr/lib/x.so")."""
    return f"{stop.value}:{where}" if stop is Stop.BAD_TABLE and where else stop.value


@dataclass(frozen=True, slots=True)
class UnwindResult:
    """frames: the pcs, innermost first; frames[0] is the sampled ip and the
    others are return addresses (name them at pc - 1, as the symbolizer does).
    Every pc lies in an executable mapping. stop: None if the walk reached the
    thread's first frame, else why it ended. scanned: how many return
    addresses a stack scan found (0: every frame by CFI or frame pointer)."""

    frames: tuple[int, ...]
    stop: Stop | None
    # Frames whose return address was found by a stack scan past code without
    # CFI (scan.py), not read where a rule or a frame pointer put it.
    scanned: int = 0
    # Stop.BAD_TABLE: the file whose table was refused.
    where: str = ""

    @property
    def complete(self) -> bool:
        return self.stop is None


@dataclass
class StopCounts:
    """Stacks (by weight) per stop reason, for the profile summary."""

    complete: int = 0
    stopped: Counter[Stop] = field(default_factory=Counter)
    scanned: int = 0  # weight of stacks (complete or not) with a frame found by a stack scan
    copy: CopySize = field(default_factory=CopySize)  # the advice on cut copies

    def add(self, stop: Stop | str | None, weight: int = 1) -> None:
        if stop is None:
            self.complete += weight
        else:
            self.stopped[Stop(str(stop).partition(":")[0])] += weight

    def update(self, results: Iterable[tuple[UnwindResult, int]]) -> None:
        for r, weight in results:
            self.add(r.stop, weight)

    def scan_note(self, total: int) -> list[str]:
        """The line saying how many stacks a stack scan carried past code
        without CFI (their frames above it rest on a checked guess)."""
        if not total or self.scanned * 1000 < total:
            return []  # none, or under 0.1%: a line that would read "0.0%"
        return [
            f"{self.scanned * 100 / total:.1f}% of the user stacks were recovered by a stack scan "
            "past code without call-frame information (a return address found in the stack "
            "copy and checked by the call before it and the CFI after it)"
        ]

    def total(self) -> int:
        return self.complete + sum(self.stopped.values())

    def notes(self, total: int | None = None, min_share: float = 0.01) -> list[str]:
        """One line per reason holding at least min_share of the weight (of
        total if given: the profile's whole user-stack weight)."""
        total = total if total is not None else self.total()
        out = []
        for stop, w in self.stopped.most_common():
            if total and w / total >= min_share:
                out.append(
                    f"{w * 100 / total:.1f}% of the user stacks stop early at {_EXPLAIN[stop]}: "
                    f"they end in a {marker_frame(stop)} frame"
                    + (self.copy.advice() if stop is Stop.TRUNCATED else "")
                )
        return out
