"""The caller of a frame without CFI nor a valid frame pointer, found by a
scan of the copied stack (leaf code such as MKL's GEMM kernels, which keep
data in rbp and ship no .eh_frame).

A word of the stack above sp is taken as the frame's return address only if
all of these hold, so that a data value or a stale return address left by an
earlier call is not made a frame:
- it lies in an executable mapping, and an FDE of its file covers the call;
- the bytes just before it are a call: E8 rel32 into the code the frame is
  running (its target lies a little before pc, in the same file, and no FDE
  covers either) or into a PLT stub, or one of the FF /2 indirect forms (2
  to 7 bytes, a REX prefix allowed). A direct call to any other function is
  refused: that function's frame, not this one, would sit below the word
  (it is what stale return addresses of earlier calls look like);
- the CFI walk from it (CFA = slot + 8) takes CHECK_STEPS more steps to code
  (or to the thread's first frame).
A direct call into the frame's own code ("strong") is taken wherever it lies
in the window: it names the frame's function as the callee. A call through a
pointer or a PLT stub ("weak") could be a stale word, or the return address
of a frame further up whose callees were refused: it is taken only if it is
the first word of the window that looks like a return address at all.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from gfxbpf.client.profiles.unwind.compiled import CFA_NONE, CFA_SIGNAL, NO_RULE
from gfxbpf.client.profiles.unwind.result import Stop
from gfxbpf.client.profiles.unwind.steps import Stack, Step, cfi_step
from gfxbpf.client.profiles.unwind.tables import Located

__all__ = ["CHECK_STEPS", "SCAN_BYTES", "CodeBefore", "Resolve", "is_indirect_call", "scan_caller"]

# How far above sp the scan looks (64 slots), and how many CFI steps beyond
# a candidate must succeed.
SCAN_BYTES = 512
CHECK_STEPS = 2
# The longest call form checked (FF /2 with REX, SIB and disp32).
_CALL_BYTES = 7
# A direct call's target counts as "the frame's function" at most this far before pc.
_SAME_FUNCTION_SPAN = 1 << 16
_I32 = struct.Struct("<i").unpack_from
# How PLT stubs begin: jmp *GOT(%rip), bnd jmp, and .plt.sec's endbr64 first.
_PLT_HEADS = (
    b"\xff\x25",
    b"\xf2\xff\x25",
    b"\xf3\x0f\x1e\xfa\xff\x25",
    b"\xf3\x0f\x1e\xfa\xf2\xff\x25",
)
_MASK = (1 << 64) - 1

Resolve = Callable[[int], Located | None]
CodeBefore = Callable[[int, int], bytes | None]  # (address, n) -> the n bytes ending there


def scan_caller(
    pc: int, sp: int, bp: int | None, mem: Stack, resolve: Resolve, code_before: CodeBefore
) -> Step | None:
    """The caller (return address, CFA, rbp) of the frame at pc whose sp is
    sp, or None if no word of the window passes every check."""
    weak: Step | None = None
    first = True  # no word that looks like a return address seen yet
    for slot in range(sp, sp + SCAN_BYTES, 8):
        ra = mem.u64(slot)
        if ra is None:
            break
        kind = _call_kind(pc, ra, resolve, code_before)
        if kind is None:
            continue
        if kind == "strong":
            step = _checked(ra, slot, sp, bp, mem, resolve)
            if step is not None:
                return step
        elif kind == "weak" and first:
            weak = _checked(ra, slot, sp, bp, mem, resolve)
        first = False
    return weak


def _call_kind(pc: int, ra: int, resolve: Resolve, code_before: CodeBefore) -> str | None:
    """ "strong" (a direct call into the frame's own code), "weak" (a call
    through a pointer or a PLT stub), "refused" (a direct call to another
    function) or None (not a return address of code with CFI)."""
    where = resolve(ra)
    if where is None or where[0] is None or where[0].function(ra + where[1] - 1) is None:
        return None
    code = code_before(ra, _CALL_BYTES)
    if code is None or len(code) < _CALL_BYTES:
        return None
    if code[-5] == 0xE8:
        target = (ra + _I32(code, _CALL_BYTES - 4)[0]) & _MASK
        if _same_function(pc, target, resolve):
            return "strong"
        if _is_plt_stub(target, code_before):
            return "weak"
        if resolve(target) is not None:
            return "refused"
    if any(is_indirect_call(code[-n:]) for n in range(2, _CALL_BYTES + 1)):
        return "weak"
    return None


def _same_function(pc: int, target: int, resolve: Resolve) -> bool:
    """target lies a little before pc, in the same file, and neither is
    covered by an FDE: the call entered the code the frame is running."""
    at_pc, at_target = resolve(pc), resolve(target)
    if at_pc is None or at_target is None or at_pc[:2] != at_target[:2]:
        return False
    table, delta = at_pc[0], at_pc[1]
    if table is None or not 0 <= pc - target < _SAME_FUNCTION_SPAN:
        return False
    return table.function(pc + delta) is None and table.function(target + delta) is None


def _is_plt_stub(target: int, code_before: CodeBefore) -> bool:
    """target starts a PLT stub (jmp *GOT(%rip), after endbr64 / bnd in
    .plt.sec): the callee it reaches is not known here."""
    head = code_before(target + 7, 7)
    return head is not None and head.startswith(_PLT_HEADS)


def is_indirect_call(code: bytes) -> bool:
    """code is exactly one `call r/m64` (FF /2): optional REX, ModRM, SIB
    and displacement, nothing left over."""
    pos = 1 if code and 0x40 <= code[0] <= 0x4F else 0
    if len(code) < pos + 2 or code[pos] != 0xFF or (code[pos + 1] >> 3) & 7 != 2:
        return False
    modrm = code[pos + 1]
    mod, rm = modrm >> 6, modrm & 7
    length = pos + 2
    if mod != 3 and rm == 4:  # a SIB byte follows
        if len(code) < length + 1:
            return False
        length += 1
        if mod == 0 and code[length - 1] & 7 == 5:  # SIB base 101 with mod 00: disp32
            length += 4
    if mod == 0 and rm == 5:  # rip-relative disp32
        length += 4
    length += {1: 1, 2: 4}.get(mod, 0)
    return length == len(code)


def _checked(
    ra: int, slot: int, sp: int, bp: int | None, mem: Stack, resolve: Resolve
) -> Step | None:
    """(ra, slot + 8, rbp) if the walk from there goes on by CFI, trying the
    sampled rbp and then the words the frame saved below slot as the
    caller's rbp (code without CFI may have pushed it and reused the register)."""
    cfa = slot + 8
    for guess in _rbp_guesses(bp, sp, slot, mem):
        if _walks_on(ra, cfa, guess, mem, resolve):
            return ra, cfa, guess
    return None


def _rbp_guesses(bp: int | None, sp: int, slot: int, mem: Stack) -> list[int | None]:
    """The caller's rbp candidates: a stack address above the candidate's
    CFA (the sampled rbp, then the saved words), else unknown (None)."""
    out: list[int | None] = []
    for value in [bp] + [mem.u64(a) for a in range(sp, slot, 8)]:
        if value is not None and slot + 8 <= value < mem.top and not value & 7:
            if value not in out:
                out.append(value)
    return out[:4] + [None]


def _walks_on(pc: int, sp: int, bp: int | None, mem: Stack, resolve: Resolve) -> bool:
    """The CFI walk from the candidate frame takes CHECK_STEPS steps to code
    (a walk that reaches the thread's first frame, or the end of the copy
    after the first step, counts as one that goes on)."""
    for depth in range(CHECK_STEPS):
        where = resolve(pc)
        if where is None:
            return False
        table, delta, _ = where
        rule = table.rule(pc + delta - 1) if table is not None else NO_RULE
        if rule.cfa in (CFA_NONE, CFA_SIGNAL):
            return depth > 0  # code beyond the first step: no rule to check it by
        step = cfi_step(rule, pc, sp, bp, mem)
        if step is None:
            return True
        if isinstance(step, Stop):
            return depth > 0 and step == Stop.TRUNCATED
        pc, sp, bp = step
    return resolve(pc) is not None
