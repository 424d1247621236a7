"""Honest stacks: notice user stacks that a frame-pointer walk cut short.

The kernel walks user stacks by frame pointers. Code built without them (most
Debian libraries, and -O2 code by default) ends the walk early or sends it into
garbage, so callers go missing and the flame graph puts the time at the wrong
root. A complete stack reaches a thread's entry (_start, start_thread, ...);
one that does not is counted, by the object its outermost frame lies in, and
the user is told what to do.

Stacks unwound from a stack copy (client/profiles/unwind) that stop early
are counted by their reason instead (StackCheck.stops): they end in a marker
frame, and frame pointers are not what they lack.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from gfxbpf.client.profiles.unwind.result import StopCounts

# Why a sample unwound from a stack copy has no user stack (RawStack.user_error;
# client/profiles/copies.py): its process's maps were never read ...
NO_MAPS = "process gone before its maps were read"
# ... or the walk found no frame at all (the stop reason in brackets).
NOT_UNWOUND = "no user frame unwound"
# What each kind of reason means, for the note, in the order it is said.
_MEANING = {
    NO_MAPS: "gfxclient names addresses from a process's memory maps, and these processes "
    "exited before it could read them (processes that live for a moment)",
    NOT_UNWOUND: "the sampled address lay in no code of the process's memory maps as "
    "gfxclient last read them (a process that had just run exec, or unmapped the code)",
    # any other reason is the stack table's (profile, ustacks: bpf_get_stackid's
    # errors; read.py)
    "": "the kernel could not record it (its stack table was full, or the stack could not "
    "be read); profiling fewer processes or for less time helps with the first",
}


def _kind(reason: str) -> str:
    """The _MEANING key of a reason a sample has no user stack."""
    if reason == NO_MAPS:
        return NO_MAPS
    return NOT_UNWOUND if reason.startswith(NOT_UNWOUND) else ""


def lost_meaning(reasons: list[str]) -> str:
    """What the reasons a sample has no user stack mean, each kind once."""
    kinds = {_kind(r) for r in reasons}
    return "; ".join(text for kind, text in _MEANING.items() if kind in kinds)


__all__ = ["MAX_DEPTH", "THREAD_ROOTS", "Kind", "StackCheck", "classify"]

# Functions a complete user stack starts in (glibc's and musl's thread entries).
THREAD_ROOTS = frozenset(
    {
        "_start",
        "__libc_start_main",
        "__libc_start_call_main",
        "start_thread",
        "clone",
        "clone3",
        "__clone",
        "__clone3",
        "thread_start",
        "_dl_start_user",
        "__libc_start_main_impl",
    }
)

# Below this share of the user-stack weight, cut stacks are not worth a note.
_NOTE_SHARE = 0.01
# The kernel records at most this many user frames (kernel.perf_event_max_stack),
# and a stack table may keep fewer (its value size): a stack that long ends at
# the limit, not at a missing frame pointer.
MAX_DEPTH = 127


# (complete | deep | cut, the object of the outermost frame, every object a frame lay in)
Kind = tuple[str, str, frozenset[str]]


def classify(frames_root_first: list[tuple[str, str | None]], max_depth: int) -> Kind:
    """Whether a user stack reaches a thread's start, ends at the depth limit, or was cut."""
    objects = frozenset(o for _, o in frames_root_first if o)
    outer = (frames_root_first[0][1] if frames_root_first else None) or "[unknown]"
    if any(n in THREAD_ROOTS for n, _ in frames_root_first):
        return "complete", outer, objects
    if len(frames_root_first) >= max_depth:
        return "deep", outer, objects
    return "cut", outer, objects


@dataclass
class StackCheck:
    complete: int = 0
    cut: Counter[str] = field(default_factory=Counter)  # object of the outermost frame -> weight
    lost: Counter[str] = field(default_factory=Counter)  # RawStack.user_error -> weight
    objects: set[str] = field(default_factory=set)  # every file a frame lay in
    too_deep: int = 0  # weight of stacks that hit the depth limit
    max_depth: int = MAX_DEPTH  # frames the stack table keeps
    unmapped: int = 0  # weight of stacks of processes with no maps snapshot
    # Stacks unwound from a stack copy (client/profiles/unwind) that stopped
    # early, by reason: they carry a marker frame, not the frame-pointer advice.
    stops: StopCounts = field(default_factory=StopCounts)

    def add(self, frames_root_first: list[tuple[str, str | None]], weight: int) -> None:
        """One user stack: (name, file it lies in) per frame, root first."""
        self.add_kind(classify(frames_root_first, self.max_depth), weight)

    def add_kind(self, kind: Kind, weight: int) -> None:
        """A stack classify() has seen (a symbolizer caches it per stack)."""
        what, outer, objects = kind
        self.objects |= objects
        if what == "complete":
            self.complete += weight
        elif what == "deep":
            self.too_deep += weight
        else:
            self.cut[outer] += weight

    def add_lost(self, reason: str, weight: int) -> None:
        self.lost[reason] += weight

    def add_stopped(self, kind: Kind, stop: str, weight: int) -> None:
        """An unwound stack that ended early for reason stop (a Stop value)."""
        self.objects |= kind[2]
        self.stops.add(stop, weight)

    def notes(self) -> list[str]:
        out = []
        cut = sum(self.cut.values())
        lost = sum(self.lost.values())
        stopped = sum(self.stops.stopped.values())
        total = self.complete + cut + lost + self.too_deep + self.unmapped + stopped
        if total and self.unmapped:
            out.append(
                f"{self.unmapped * 100 / total:.1f}% of the weight is from processes whose "
                "memory maps were never read (they exited first): their frames are [unknown]"
            )
        if total and self.too_deep / total >= _NOTE_SHARE:
            out.append(
                f"{self.too_deep * 100 / total:.0f}% of the user stacks are {self.max_depth} "
                "frames or deeper and were cut at the stack table's depth: their outermost "
                "callers are missing (deep stacks that share their innermost "
                f"{self.max_depth} frames are merged)"
            )
        if total and stopped / total >= _NOTE_SHARE:
            out += self.stops.notes(total=total, min_share=_NOTE_SHARE)
        out += self.stops.scan_note(total)
        if total and cut / total >= _NOTE_SHARE:
            where = ", ".join(
                f"{os.path.basename(obj)} ({w * 100 / cut:.0f}%)"
                for obj, w in self.cut.most_common(3)
            )
            out.append(
                f"{cut * 100 / total:.0f}% of the user stacks stop before reaching the thread's "
                f"start, last in {where}: code built without frame pointers ends the kernel's "
                "stack walk, so callers are missing and those stacks hang off the root. "
                "Build your code with -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer, "
                "and use libraries and a Python built with frame pointers (e.g. Fedora 38+, "
                "Ubuntu 24.04+; Python 3.12+ with -X perf for Python frames)."
            )
        if total and lost:
            why = ", ".join(f"{r}: {w}" for r, w in self.lost.most_common())
            out.append(
                f"{lost * 100 / total:.1f}% of the weight has no user stack ({why}): "
                f"{lost_meaning(list(self.lost))}."
            )
        return out
