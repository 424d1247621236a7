"""One step of the walk by a rule of the call-frame information, over the
copied stack bytes: shared by the walk (walk.py) and the check of a scanned
return address (scan.py)."""

from __future__ import annotations

import struct

from gfxbpf.client.profiles.unwind.compiled import (
    CFA_PLT,
    CFA_RBP,
    CFA_RBP_DEREF,
    CFA_RSP,
    CFA_SIGNAL,
    REG_AT_RBP,
    REG_SAME,
    REG_UNDEFINED,
    REG_UNKNOWN,
    Rule,
)
from gfxbpf.client.profiles.unwind.result import Stop

__all__ = ["Buffer", "ReadStack", "Stack", "Step", "cfi_step"]

_U64 = struct.Struct("<Q").unpack_from
# Copied stack bytes: a record's, sliced without copying.
Buffer = bytes | memoryview
# The caller's (pc, sp, rbp or None if unknown).
Step = tuple[int, int, int | None]


class Stack:
    """The copied bytes, addressed as the process saw them (bytes[0] at sp)."""

    __slots__ = ("base", "data", "end", "top")

    def __init__(self, sp: int, data: Buffer, top: int) -> None:
        self.base, self.data, self.end = sp, data, sp + len(data)
        self.top = top  # the end of the stack's mapping: what a longer copy could hold

    def u64(self, addr: int) -> int | None:
        if self.base <= addr and addr + 8 <= self.end:
            return int(_U64(self.data, addr - self.base)[0])
        return None


class ReadStack(Stack):
    """A Stack that notes the offset of every word read from the copy, and
    counts the reads that fell outside it, so a walk's result can be reused
    for a copy that holds the same words there (and, if a read missed, ends
    where this one ends)."""

    __slots__ = ("missed", "offsets")

    def __init__(self, sp: int, data: Buffer, top: int) -> None:
        super().__init__(sp, data, top)
        self.offsets: list[int] = []
        self.missed = 0

    def u64(self, addr: int) -> int | None:
        if self.base <= addr and addr + 8 <= self.end:
            self.offsets.append(addr - self.base)
            return int(_U64(self.data, addr - self.base)[0])
        self.missed += 1
        return None


def cfi_step(rule: Rule, pc: int, sp: int, bp: int | None, mem: Stack) -> Step | Stop | None:
    """(caller pc, caller sp, caller rbp or None if unknown), None at the
    outermost frame, or why no caller can be found."""
    if rule.ra == REG_UNDEFINED:
        return None
    if rule.ra in (REG_SAME, REG_UNKNOWN):  # kept in a register: not followed
        return Stop.BAD_CFA
    if rule.cfa == CFA_SIGNAL:
        return _signal_step(rule, sp, mem)
    cfa = _cfa(rule, pc, sp, bp, mem)
    if isinstance(cfa, Stop):
        return cfa
    if cfa <= sp:  # the stack grows down: a caller's frame is above
        return Stop.BAD_CFA
    ra = mem.u64(cfa + rule.ra)
    if ra is None:
        return Stop.TRUNCATED
    if ra == 0:  # a zeroed return address ends the chain (thread roots without CFI)
        return None
    if rule.rbp == REG_SAME:
        return ra, cfa, bp
    if rule.rbp in (REG_UNKNOWN, REG_UNDEFINED):
        return ra, cfa, None
    if rule.rbp == REG_AT_RBP:  # checked by _realigned_cfa: bp is in the copy
        return ra, cfa, mem.u64(bp) if bp is not None else None
    if cfa + rule.rbp < sp:
        # A save slot below sp: an epilogue already popped rbp (gcc emits no
        # DW_CFA_restore there), so the register holds the caller's value.
        return ra, cfa, bp
    saved = mem.u64(cfa + rule.rbp)
    if saved is None:
        return Stop.TRUNCATED
    return ra, cfa, saved


def _cfa(rule: Rule, pc: int, sp: int, bp: int | None, mem: Stack) -> int | Stop:
    """The CFA (the caller's sp) by the rule's kind, or why it cannot be found."""
    if rule.cfa == CFA_RSP:
        return sp + rule.off
    if rule.cfa == CFA_RBP:
        return Stop.BAD_CFA if bp is None else bp + rule.off
    if rule.cfa == CFA_PLT:
        return sp + rule.off + (8 if (pc & 15) >= rule.arg else 0)
    if rule.cfa == CFA_RBP_DEREF:
        return _realigned_cfa(rule, sp, bp, mem)
    return Stop.BAD_CFA


def _realigned_cfa(rule: Rule, sp: int, bp: int | None, mem: Stack) -> int | Stop:
    """The CFA of a frame GCC realigned: the word at rbp + off, where the
    prologue saved the register (DRAP) that held the CFA. rbp must point into
    the stack above sp (its frame), as must the CFA it yields."""
    if bp is None or bp < sp or bp & 7:
        return Stop.BAD_CFA
    cfa = mem.u64(bp + rule.off)
    if cfa is None:
        return Stop.TRUNCATED if bp + rule.off + 8 <= mem.top else Stop.BAD_CFA
    return cfa


def _signal_step(rule: Rule, sp: int, mem: Stack) -> Step | Stop:
    """Through a signal frame (pc in the sigreturn trampoline, sp at the
    ucontext the kernel pushed): the interrupted rsp, rip and rbp, read
    where the rule says they were saved (sp + offset)."""
    cfa, pc = mem.u64(sp + rule.off), mem.u64(sp + rule.ra)
    if cfa is None or pc is None:
        return Stop.TRUNCATED
    if cfa <= sp:  # the interrupted code's stack lies above the signal frame
        return Stop.BAD_CFA
    if rule.rbp in (REG_SAME, REG_UNKNOWN, REG_UNDEFINED):
        return pc, cfa, None
    return pc, cfa, mem.u64(sp + rule.rbp)
