"""The offline unwinder: registers + a copy of the top of the user stack ->
the chain of return addresses, by each file's call-frame information.

Each step finds the rule at the pc (one bisect in the file's table), computes
the CFA (the caller's sp), reads the return address and the saved rbp from
the copied bytes, and checks the caller's pc is code before emitting it. Where
no CFI covers a pc, a frame-pointer step (CFA = rbp + 16) is taken only if rbp
points into the copy above sp and the address it yields is code; anything
else ends the walk with a reason (result.Stop).
"""

from __future__ import annotations

import struct

from gfxbpf.client.profiles.procmaps import ProcessMaps
from gfxbpf.client.profiles.unwind.result import MAX_FRAMES, Stop, UnwindResult, UserRegs
from gfxbpf.client.profiles.unwind.table import (
    CFA_NONE,
    CFA_PLT,
    CFA_RBP,
    CFA_RSP,
    CFA_SIGNAL,
    REG_SAME,
    REG_UNDEFINED,
    REG_UNKNOWN,
    Rule,
)
from gfxbpf.client.profiles.unwind.tables import UnwindTables

__all__ = ["unwind"]

_U64 = struct.Struct("<Q").unpack_from


class _Stack:
    """The copied bytes, addressed as the process saw them (bytes[0] at sp)."""

    __slots__ = ("base", "data", "end", "top")

    def __init__(self, sp: int, data: bytes, top: int) -> None:
        self.base, self.data, self.end = sp, data, sp + len(data)
        self.top = top  # the end of the stack's mapping: what a longer copy could hold

    def u64(self, addr: int) -> int | None:
        if self.base <= addr and addr + 8 <= self.end:
            return int(_U64(self.data, addr - self.base)[0])
        return None


def unwind(
    regs: UserRegs,
    stack: bytes,
    maps: ProcessMaps,
    tables: UnwindTables,
    max_frames: int = MAX_FRAMES,
) -> UnwindResult:
    """Unwind one sample. stack: the bytes copied from regs.sp upward (any
    length; 8 KiB is what the BPF program copies). Every returned pc is in an
    executable mapping of maps; the walk never follows a value that is not."""
    stack_map = maps.find(regs.sp)
    mem = _Stack(regs.sp, stack, stack_map.end if stack_map else regs.sp + len(stack))
    pc, sp = regs.ip, regs.sp
    bp: int | None = regs.bp  # None once a frame's rule loses it
    frames: list[int] = []
    lookup = tables.stepper(maps)
    guessed: Stop | None = None  # why the last step was a frame-pointer guess
    exact = True  # pc is where the thread was (the sample, or a signal's interrupted pc)
    while True:
        # A return address is looked up at the call (pc - 1): a call to a
        # function that never returns can be the last instruction of its FDE.
        where, rule = lookup(pc, exact)
        if where is None:  # not code: never a frame
            return UnwindResult(tuple(frames), guessed or Stop.NOT_CODE)
        frames.append(pc)
        if len(frames) >= max_frames:
            return UnwindResult(tuple(frames), Stop.DEPTH)
        why = where[2]
        exact = rule.cfa == CFA_SIGNAL
        step: tuple[int, int, int | None] | Stop | None
        if rule.cfa == CFA_NONE:
            guessed = why or Stop.NO_CFI
            step = _frame_pointer_step(sp, bp, mem, guessed)
        else:
            guessed = None
            step = _cfi_step(rule, pc, sp, bp, mem)
        if step is None:  # the outermost frame
            return UnwindResult(tuple(frames), None)
        if isinstance(step, Stop):
            return UnwindResult(tuple(frames), step)
        pc, sp, bp = step


def _cfi_step(
    rule: Rule, pc: int, sp: int, bp: int | None, mem: _Stack
) -> tuple[int, int, int | None] | Stop | None:
    """(caller pc, caller sp, caller rbp or None if unknown), None at the
    outermost frame, or why no caller can be found."""
    if rule.ra == REG_UNDEFINED:
        return None
    if rule.ra in (REG_SAME, REG_UNKNOWN):  # kept in a register: not followed
        return Stop.BAD_CFA
    if rule.cfa == CFA_SIGNAL:
        return _signal_step(rule, sp, mem)
    if rule.cfa == CFA_RSP:
        cfa = sp + rule.off
    elif rule.cfa == CFA_RBP:
        if bp is None:
            return Stop.BAD_CFA
        cfa = bp + rule.off
    elif rule.cfa == CFA_PLT:
        cfa = sp + rule.off + (8 if (pc & 15) >= rule.arg else 0)
    else:
        return Stop.BAD_CFA
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
    if cfa + rule.rbp < sp:
        # A save slot below sp: an epilogue already popped rbp (gcc emits no
        # DW_CFA_restore there), so the register holds the caller's value.
        return ra, cfa, bp
    saved = mem.u64(cfa + rule.rbp)
    if saved is None:
        return Stop.TRUNCATED
    return ra, cfa, saved


def _signal_step(rule: Rule, sp: int, mem: _Stack) -> tuple[int, int, int | None] | Stop:
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


def _frame_pointer_step(
    sp: int, bp: int | None, mem: _Stack, why: Stop
) -> tuple[int, int, int | None] | Stop | None:
    """The caller by the frame-pointer chain: [rbp] = caller's rbp, [rbp+8] =
    return address. Only if rbp is an aligned address in the copied stack at
    or above sp; the loop then checks the return address is code, and the
    saved rbp is checked the same way if the caller needs it (a caller with
    CFI may keep data in rbp). Else why (no CFI, JIT code, unreadable file)."""
    if bp is None or bp < sp or bp & 7:
        return why
    ra, saved = mem.u64(bp + 8), mem.u64(bp)
    if ra is None or saved is None:
        # rbp past the copy: a deep stack (truncated) or a data value (why).
        return Stop.TRUNCATED if bp + 16 <= mem.top else why
    if ra == 0:  # a zeroed slot, not a thread root: roots have CFI (_start, clone3)
        return why
    return ra, bp + 16, saved
