"""One file's compiled unwind table: sorted rows pc -> rule, and the
function ranges of its FDEs. Built once per file (build.py), kept in memory
and on disk (cache.py).

A row holds a 16- or 32-bit index into a small list of distinct rules (a
library of 100,000 functions has a few hundred), so a row costs 6 to 8 bytes
and a lookup is one bisect and two list indexings.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sized
from dataclasses import dataclass
from typing import NamedTuple, Protocol

__all__ = [
    "CFA_NONE",
    "CFA_PLT",
    "CFA_RBP",
    "CFA_RBP_DEREF",
    "CFA_RSP",
    "CFA_SIGNAL",
    "CFA_UNSUPPORTED",
    "REG_AT_RBP",
    "REG_SAME",
    "REG_UNDEFINED",
    "REG_UNKNOWN",
    "FileTable",
    "Rule",
    "Segments",
    "Table",
    "segment_delta",
    "segment_offset",
]

# How the CFA (the caller's sp, just above the return address) is found.
CFA_NONE = 0  # no CFI covers this pc
CFA_RSP = 1  # rsp + off
CFA_RBP = 2  # rbp + off
CFA_PLT = 3  # a PLT entry: rsp + off, + 8 once past its push (arg: the pc & 15 threshold)
CFA_UNSUPPORTED = 4  # another register or an expression this unwinder does not evaluate
# A signal frame (the sigreturn trampoline): the CFA is the word at rsp + off (the
# interrupted rsp); rbp and ra are then where rsp + rbp and rsp + ra point (the
# saved registers), and the caller's pc is the interrupted one, not a return address.
CFA_SIGNAL = 5
# A frame GCC realigned (DRAP: AVX-512 locals): the CFA is the word at rbp + off.
CFA_RBP_DEREF = 6

# Register rules besides "saved at CFA + n" (n is always a multiple of -8 on x86-64).
REG_SAME = 1  # the caller's value is this frame's (not saved)
REG_UNDEFINED = 3  # no caller value: for the return address, the outermost frame
REG_UNKNOWN = 5  # saved in another register or by an expression: not followed
REG_AT_RBP = 7  # saved at rbp + 0 (a realigned frame's rbp; CFA_RBP_DEREF)


class Rule(NamedTuple):
    """How to find the caller's frame at one pc."""

    cfa: int  # CFA_*
    off: int  # offset added to the CFA register
    rbp: int  # REG_SAME / REG_UNKNOWN / REG_UNDEFINED, or where rbp is saved (CFA + rbp)
    ra: int  # where the return address is saved (CFA + ra), or REG_UNDEFINED
    arg: int = 0  # CFA_PLT: the threshold of pc & 15 above which 8 more bytes are pushed


NO_RULE = Rule(CFA_NONE, 0, REG_SAME, REG_UNDEFINED)
Segments = tuple[tuple[int, int, int], ...]  # PT_LOAD (p_offset, p_vaddr, p_filesz)


def segment_delta(segments: Segments, file_start: int, file_end: int | None = None) -> int | None:
    """What to add to a file offset in [file_start, file_end) (a mapping's
    range in the file) to get its virtual address; None if no segment loads
    any of it. A mapping starts at its segment's offset rounded down to a
    page, where another segment may end: the segment sharing the most bytes
    with the range is the one mapped."""
    end = file_end if file_end is not None else file_start + 1
    best, delta = 0, None
    for off, vaddr, filesz in segments:
        shared = min(end, off + filesz) - max(file_start, off)
        if shared > best:
            best, delta = shared, vaddr - off
    return delta


def segment_offset(segments: Segments, vaddr: int) -> int | None:
    """The file offset of a virtual address (None: not loaded from the file)."""
    for off, seg_vaddr, filesz in segments:
        if seg_vaddr <= vaddr < seg_vaddr + filesz:
            return vaddr - seg_vaddr + off
    return None


class Table(Protocol):
    """What the walker and the symbolizer ask of a file's table (FileTable,
    or lazy.LazyTable while a large file's FileTable is being compiled)."""

    segments: Segments
    source: str

    @property
    def starts(self) -> Sized: ...
    def rule(self, vaddr: int) -> Rule: ...
    def function(self, vaddr: int) -> tuple[int, int] | None: ...
    def vaddr_delta(self, file_start: int, file_end: int | None = None) -> int | None: ...
    def file_offset(self, vaddr: int) -> int | None: ...
    def nbytes(self) -> int: ...


@dataclass
class FileTable:
    """The rows and function ranges of one ELF file, in its virtual addresses."""

    segments: tuple[tuple[int, int, int], ...]  # PT_LOAD (p_offset, p_vaddr, p_filesz)
    starts: array[int]  # row start addresses, sorted ("I" or "Q")
    index: array[int]  # per row, an index into rules ("H" or "I")
    rules: list[Rule]  # rules[0] is NO_RULE (gaps between FDEs)
    func_starts: array[int]  # FDE ranges, sorted by start
    func_ends: array[int]
    source: str = ".eh_frame"  # where the rows came from (".debug_frame", "debug file", "")

    def rule(self, vaddr: int) -> Rule:
        """The rule in force at vaddr (NO_RULE where no FDE covers it)."""
        i = bisect.bisect_right(self.starts, vaddr) - 1
        return self.rules[self.index[i]] if i >= 0 else self.rules[0]

    def function(self, vaddr: int) -> tuple[int, int] | None:
        """(start, end) of the FDE covering vaddr: a function, for stripped files."""
        i = bisect.bisect_right(self.func_starts, vaddr) - 1
        if i >= 0 and vaddr < self.func_ends[i]:
            return self.func_starts[i], self.func_ends[i]
        return None

    def vaddr_delta(self, file_start: int, file_end: int | None = None) -> int | None:
        return segment_delta(self.segments, file_start, file_end)

    def file_offset(self, vaddr: int) -> int | None:
        return segment_offset(self.segments, vaddr)

    def nbytes(self) -> int:
        """Memory of the arrays (what the cache bounds)."""
        arrays = (self.starts, self.index, self.func_starts, self.func_ends)
        return sum(a.itemsize * len(a) for a in arrays) + 80 * len(self.rules)
