"""The offline unwinder: registers + a copy of the top of the user stack ->
the chain of return addresses, by each file's call-frame information.

Each step finds the rule at the pc (one bisect in the file's table), computes
the CFA (the caller's sp), reads the return address and the saved rbp from
the copied bytes, and checks the caller's pc is code before emitting it. Where
no CFI covers a pc, a frame-pointer step (CFA = rbp + 16) is taken only if rbp
points into the copy above sp and the address it yields is code; failing
that, a scan of the copied stack for a checked return address (scan.py) is
tried, and the result counts the frames found so. Anything else ends the
walk with a reason (result.Stop).

A walk may be handed what earlier walks learned (Known, memo.py): at each
frame it asks whether the walk from that state on is remembered, and says
after each step whether the step read rbp and whether it passed rbp on.
"""

from __future__ import annotations

import functools
from typing import Protocol

from gfxbpf.client.profiles.procmaps import ProcessMaps
from gfxbpf.client.profiles.unwind.compiled import (
    CFA_NONE,
    CFA_RBP,
    CFA_RBP_DEREF,
    CFA_SIGNAL,
    REG_AT_RBP,
    Rule,
)
from gfxbpf.client.profiles.unwind.result import MAX_FRAMES, Stop, UnwindResult, UserRegs
from gfxbpf.client.profiles.unwind.scan import CodeBefore, Resolve, scan_caller
from gfxbpf.client.profiles.unwind.steps import Buffer, Stack, Step, cfi_step
from gfxbpf.client.profiles.unwind.tables import UnwindTables

__all__ = ["Known", "unwind"]

# Rules whose step reads rbp (CFA_NONE: the frame-pointer step and the scan).
_CFA_BY_RBP = (CFA_NONE, CFA_RBP, CFA_RBP_DEREF)


class Known(Protocol):
    """Walks remembered from a state on (memo.UnwindMemo's per-walk trace)."""

    def rest(
        self,
        pc: int,
        sp: int,
        bp: int | None,
        exact: bool,
        guessed: Stop | None,
        scanned: int,
        room: int,
    ) -> UnwindResult | None:
        """The walk from this state on (at most room frames), if remembered."""

    def stepped(self, read_bp: bool, kept_bp: bool, loaded_bp: bool) -> None:
        """The step from the last state read rbp; left the caller's rbp as it
        was; took it from the copy, by the step's last read."""


def unwind(
    regs: UserRegs,
    stack: Buffer,
    maps: ProcessMaps,
    tables: UnwindTables,
    max_frames: int = MAX_FRAMES,
    mem: Stack | None = None,
    exact: bool = True,
    known: Known | None = None,
) -> UnwindResult:
    """Unwind one sample. stack: the bytes copied from regs.sp upward (any
    length; 8 KiB is what the BPF program copies). Every returned pc is in an
    executable mapping of maps; the walk never follows a value that is not.
    mem: those bytes as a Stack already (stack_top() gives its top).
    exact False: regs.ip is a return address (the registers a function's
    caller resumes with), looked up at the call as any caller's. known: what
    earlier walks learned (memo.py)."""
    if mem is None:
        mem = Stack(regs.sp, stack, stack_top(regs, stack, maps))
    pc, sp = regs.ip, regs.sp
    bp: int | None = regs.bp  # None once a frame's rule loses it
    frames: list[int] = []
    lookup = tables.stepper(maps)
    resolve = tables.resolver(maps)  # the stack scan's check that an address is code
    scanned = 0  # frames found by a stack scan
    code_before = functools.partial(tables.code_before, maps)
    guessed: Stop | None = None  # why the last step was a frame-pointer guess
    # exact: pc is where the thread was (the sample, or a signal's interrupted pc)
    while True:
        if known is not None:
            rest = known.rest(pc, sp, bp, exact, guessed, scanned, max_frames - len(frames))
            if rest is not None:
                frames.extend(rest.frames)
                return UnwindResult(tuple(frames), rest.stop, scanned + rest.scanned, rest.where)
        # A return address is looked up at the call (pc - 1): a call to a
        # function that never returns can be the last instruction of its FDE.
        where, rule = lookup(pc, exact)
        if where is None:  # not code: never a frame
            return _ended(frames, guessed or Stop.NOT_CODE, scanned, maps)
        frames.append(pc)
        if len(frames) >= max_frames:
            return UnwindResult(tuple(frames), Stop.DEPTH, scanned)
        why = where[2]
        if why is Stop.BAD_TABLE:  # nothing a crafted file says is followed, not even rbp
            return _ended(frames, why, scanned, maps)
        exact = rule.cfa == CFA_SIGNAL
        step: Step | Stop | None
        if rule.cfa == CFA_NONE:
            step, guessed = _guess_step(pc, sp, bp, mem, why or Stop.NO_CFI, resolve, code_before)
            scanned += guessed is None
        else:
            guessed = None
            step = cfi_step(rule, pc, sp, bp, mem)
        if known is not None:
            _tell(known, rule, bp, step)
        if step is None:  # the outermost frame
            return UnwindResult(tuple(frames), None, scanned)
        if isinstance(step, Stop):
            return _ended(frames, step, scanned, maps)
        pc, sp, bp = step


def _tell(known: Known, rule: Rule, bp: int | None, step: Step | Stop | None) -> None:
    """What the step did with rbp. A step by a rule reads the caller's saved
    rbp last (cfi_step, the signal frame's); a scan's guesses are not told
    apart from its other reads."""
    kept = isinstance(step, tuple) and step[2] is bp
    loaded = rule.cfa != CFA_NONE and isinstance(step, tuple) and step[2] is not None and not kept
    known.stepped(rule.cfa in _CFA_BY_RBP or rule.rbp == REG_AT_RBP, kept, loaded)


def stack_top(regs: UserRegs, stack: Buffer, maps: ProcessMaps) -> int:
    """The end of the stack's mapping: what a longer copy could hold."""
    stack_map = maps.find(regs.sp)
    return stack_map.end if stack_map else regs.sp + len(stack)


def _ended(frames: list[int], stop: Stop, scanned: int, maps: ProcessMaps) -> UnwindResult:
    """The result of a walk that stopped early; a refused table's stop names
    the file of the last frame (the one whose table it is)."""
    where = ""
    if stop is Stop.BAD_TABLE and frames:
        m = maps.find(frames[-1])
        where = m.file_path if m is not None else ""
    return UnwindResult(tuple(frames), stop, scanned, where)


def _guess_step(
    pc: int, sp: int, bp: int | None, mem: Stack, why: Stop, resolve: Resolve, code: CodeBefore
) -> tuple[Step | Stop | None, Stop | None]:
    """The step from code without CFI: by the frame pointer, else by a stack
    scan; and why it is a guess (None: the scan found the caller)."""
    step = _frame_pointer_step(sp, bp, mem, why)
    if isinstance(step, Stop) or (step is not None and resolve(step[0]) is None):
        found = scan_caller(pc, sp, bp, mem, resolve, code)
        if found is not None:
            return found, None
    return step, why


def _frame_pointer_step(sp: int, bp: int | None, mem: Stack, why: Stop) -> Step | Stop | None:
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
