"""The walker on synthetic processes: a fake library whose CFI is compiled
from hand-written FDEs, a stack laid out word by word, and the registers.
Every way a walk can end, and that no frame is ever made of a data value."""

from __future__ import annotations

import struct

import pytest

from gfxbpf.client.profiles.procmaps import Mapping, ProcessMaps
from gfxbpf.client.profiles.unwind import (
    MAX_FRAMES,
    CopySize,
    Stop,
    StopCounts,
    UnwindResult,
    UnwindTables,
    UserRegs,
    build,
    cfi,
    marker_frame,
    unwind,
)
from gfxbpf.client.profiles.unwind.tables import Located
from tests.unit.test_unwind_cfi import ADDR, DRAP_FDE, PLT_EXPR, SIGNAL_FDE, eh_frame, uleb

LIB = 0x40_0000  # the fake library's code mapping; vaddr = pc - LIB
RODATA = 0x41_0000  # its read-only data (same file, not executable)
JIT = 0x50_0000  # anonymous executable memory
HEAP = 0x60_0000
STACK = 0x7FF0_0000_0000  # the stack mapping: [STACK, STACK + 64 KiB)
SP = STACK + 0x8000

LEAF, MID, FP, ROOT, NOCFI, PLT, ODD, EPI = 0x100, 0x200, 0x300, 0x400, 0x500, 0x600, 0x700, 0x800
SIG = 0x900  # a sigreturn trampoline (its FDE starts a byte before it, as glibc's)
DRAP = 0xA00  # a realigned frame: CFA = [rbp - 40], rbp saved at [rbp]
FDES = [
    (LEAF, 0x40, b""),  # no push: CFA = rsp + 8 throughout
    (MID, 0x80, b"\x41\x0e\x10\x83\x02\x44\x0e\x20"),  # push rbx; sub rsp, 16
    (FP, 0x80, b"\x41\x0e\x10\x86\x02\x43\x0d\x06"),  # push rbp; mov rbp, rsp
    (ROOT, 0x40, b"\x07\x10"),  # _start: no return address
    (PLT, 0x40, b"\x0f" + uleb(len(PLT_EXPR)) + PLT_EXPR),
    (ODD, 0x40, b"\x0c\x03\x08"),  # CFA by rbx: not followed
    (EPI, 0x40, b"\x41\x0e\x10\x86\x02\x44\x0e\x08"),  # push rbp; ...; pop rbp (no restore)
    (SIG, 0x10, SIGNAL_FDE),
    (DRAP, 0x40, DRAP_FDE),
]
# NOCFI (0x500..0x600) has code but no FDE.


class FakeTables(UnwindTables):
    """The fake library's table for its mapping; everything else as usual."""

    def __init__(self) -> None:
        super().__init__(cache_dir="/nonexistent")
        fdes, error = cfi.parse_cfi(eh_frame(FDES), ADDR, True)
        assert error is None
        self.table = build.compile_fdes(((0, 0, 0x10000),), fdes, "test")

    def locate(self, maps: ProcessMaps, m: Mapping) -> Located:
        if m.path == "/fake/lib.so":
            return self.table, -LIB, None
        return super().locate(maps, m)


def maps() -> ProcessMaps:
    def m(start: int, size: int, perms: str, path: str = "", inode: int = 0) -> Mapping:
        return Mapping(start, start + size, perms, 0, "00:00", inode, path)

    return ProcessMaps(pid=4242, mappings=[
        m(LIB, 0x1000, "r-xp", "/fake/lib.so", 7), m(RODATA, 0x1000, "r--p", "/fake/lib.so", 7),
        m(JIT, 0x1000, "rwxp"), m(HEAP, 0x1000, "rw-p", "[heap]"),
        m(STACK, 0x10000, "rw-p", "[stack]"),
    ])  # fmt: skip


def stack(words: dict[int, int], size: int = 0x400) -> bytes:
    """size bytes from SP, with the qword at SP + offset set for each entry."""
    data = bytearray(size)
    for off, value in words.items():
        struct.pack_into("<Q", data, off, value)
    return bytes(data)


def walk(ip: int, words: dict[int, int], bp: int = 0, size: int = 0x400, **kw: int) -> UnwindResult:
    return unwind(UserRegs(ip, SP, bp), stack(words, size), maps(), FakeTables(), **kw)


def test_a_chain_by_cfi_to_the_thread_root() -> None:
    # leaf (CFA sp+8) <- mid at +0x10 (CFA sp+32, rbx saved) <- fp at +0x20
    # (CFA rbp+16, rbp at CFA-16) <- root (return address undefined).
    ra_mid, ra_fp, ra_root = LIB + MID + 0x10, LIB + FP + 0x20, LIB + ROOT + 0x10
    fp_rbp = SP + 0x40  # where fp's frame keeps the caller's rbp
    words = {0: ra_mid, 8 + 24: ra_fp, fp_rbp: 0x1234, fp_rbp + 8: ra_root}
    words = {k if k < 0x400 else k - SP: v for k, v in words.items()}
    got = walk(LIB + LEAF + 4, words, bp=fp_rbp)
    assert got == UnwindResult((LIB + LEAF + 4, ra_mid, ra_fp, ra_root), None)
    assert got.complete


def test_a_data_value_is_never_a_frame() -> None:
    # By CFI: the return-address slot holds a heap pointer, then a pointer
    # into the library's read-only data (a file mapping, but not code).
    for value in (HEAP + 0x10, RODATA + 0x10, 0x4141_4141_4141_4141):
        got = walk(LIB + LEAF, {0: value})
        assert got == UnwindResult((LIB + LEAF,), Stop.NOT_CODE)
    # By frame pointer, where no CFI covers the pc: rbp points at a "frame"
    # whose return address is data. The guess is dropped, and says so.
    got = walk(LIB + NOCFI, {0x20: SP + 0x100, 0x28: HEAP + 8}, bp=SP + 0x20)
    assert got == UnwindResult((LIB + NOCFI,), Stop.NO_CFI)
    # rbp holding a heap pointer or garbage: nothing is read through it.
    for bp in (HEAP + 0x10, 0x1234, SP + 3, SP - 0x100):
        assert walk(LIB + NOCFI, {}, bp=bp) == UnwindResult((LIB + NOCFI,), Stop.NO_CFI)
    # A saved rbp that does not go up the stack ends the chain at the next guess.
    got = walk(LIB + NOCFI, {0x20: SP + 0x10, 0x28: LIB + NOCFI + 9}, bp=SP + 0x20)
    assert got == UnwindResult((LIB + NOCFI, LIB + NOCFI + 9), Stop.NO_CFI)


def test_a_signal_handler_unwinds_through_the_signal_frame() -> None:
    # The handler (leaf) returns into the trampoline; at its sp + 8 the kernel's
    # ucontext holds the interrupted rsp, rip and rbp. The interrupted pc is
    # where the thread was, not a return address: it is looked up as is (at
    # FP's first byte; one byte before is no function at all).
    uc, interrupted_sp = 8, SP + 0x200
    words = {0: LIB + SIG + 1, uc + 160: interrupted_sp, uc + 168: LIB + FP, uc + 120: 0x77}
    words[0x200] = LIB + ROOT + 0x10  # FP's return address at its entry: [rsp]
    got = walk(LIB + LEAF + 4, words)
    assert got == UnwindResult((LIB + LEAF + 4, LIB + SIG + 1, LIB + FP, LIB + ROOT + 0x10), None)
    # The ucontext beyond the copy: truncated, not guessed.
    got = walk(LIB + LEAF + 4, {0: LIB + SIG + 1}, size=0x80)
    assert got == UnwindResult((LIB + LEAF + 4, LIB + SIG + 1), Stop.TRUNCATED)
    # A saved rsp below the trampoline's: no frame is made of it.
    got = walk(LIB + LEAF + 4, {0: LIB + SIG + 1, uc + 160: SP, uc + 168: LIB + FP})
    assert got == UnwindResult((LIB + LEAF + 4, LIB + SIG + 1), Stop.BAD_CFA)


def test_frame_pointers_where_there_is_no_cfi() -> None:
    got = walk(LIB + NOCFI, {0x20: 0, 0x28: LIB + ROOT + 0x10}, bp=SP + 0x20)
    assert got == UnwindResult((LIB + NOCFI, LIB + ROOT + 0x10), None)


def test_jit_code_is_a_frame_and_frame_pointers_lead_out_of_it() -> None:
    assert walk(JIT + 0x10, {}) == UnwindResult((JIT + 0x10,), Stop.JIT)
    got = walk(JIT + 0x10, {0x20: 0, 0x28: LIB + ROOT + 0x10}, bp=SP + 0x20)
    assert got == UnwindResult((JIT + 0x10, LIB + ROOT + 0x10), None)


def test_an_ip_outside_code() -> None:
    assert walk(HEAP + 0x10, {}) == UnwindResult((), Stop.NOT_CODE)
    assert walk(0x10, {}) == UnwindResult((), Stop.NOT_CODE)


def test_a_short_copy_is_truncated() -> None:
    # mid after its sub: the return address is at SP + 24, past an 16-byte copy.
    assert walk(LIB + MID + 6, {}, size=16) == UnwindResult((LIB + MID + 6,), Stop.TRUNCATED)
    # A frame-pointer chain that runs past the copy, inside the stack mapping.
    got = walk(LIB + NOCFI, {}, bp=SP + 0x800, size=0x400)
    assert got == UnwindResult((LIB + NOCFI,), Stop.TRUNCATED)


def test_rules_that_are_not_followed() -> None:
    assert walk(LIB + ODD + 1, {0: LIB + ROOT}).stop is Stop.BAD_CFA  # CFA by rbx
    # fp after mov rbp, rsp with rbp below sp: the CFA would not be above sp.
    assert walk(LIB + FP + 8, {}, bp=SP - 0x100) == UnwindResult((LIB + FP + 8,), Stop.BAD_CFA)


def test_a_realigned_frame_finds_its_caller_through_the_saved_cfa() -> None:
    # rbp = SP + 0x40 (the realigned frame); [rbp - 40] holds the CFA, SP + 0x100,
    # whose return address is at CFA - 8; [rbp] the caller's rbp.
    rbp, cfa = SP + 0x40, SP + 0x100
    words = {0x40 - 40: cfa, 0x100 - 8: LIB + FP + 0x20, 0x40: SP + 0x200}
    words |= {0x200: 0, 0x208: LIB + ROOT + 0x10}  # FP's frame: saved rbp, return address
    got = walk(LIB + DRAP + 4, words, bp=rbp)
    assert got == UnwindResult((LIB + DRAP + 4, LIB + FP + 0x20, LIB + ROOT + 0x10), None)
    # rbp below sp or unaligned: no frame is made of it; the saved CFA past the copy.
    assert walk(LIB + DRAP + 4, words, bp=SP - 0x40).stop is Stop.BAD_CFA
    assert walk(LIB + DRAP + 4, words, bp=rbp + 3).stop is Stop.BAD_CFA
    assert walk(LIB + DRAP + 4, words, bp=SP + 0x440).stop is Stop.TRUNCATED
    # A saved CFA that is not above sp ends the walk.
    assert walk(LIB + DRAP + 4, {0x40 - 40: SP - 8}, bp=rbp).stop is Stop.BAD_CFA


def test_depth_bound() -> None:
    # leaf calling itself: every word a return address into it.
    words = {8 * i: LIB + LEAF + 0x10 for i in range(100)}
    got = walk(LIB + LEAF, words, max_frames=10)
    assert got.stop is Stop.DEPTH and len(got.frames) == 10


def test_a_deep_stack_ends_at_its_copy_not_at_the_frame_limit() -> None:
    """200 frames of 8 bytes, then the copy ends: the walk stops there
    (truncated), not at a frame count. At 127 frames `import torch`'s nested
    imports stopped at the limit with copied bytes left."""
    from gfxbpf.catalog.stack_copies import MAX_STACK_BYTES

    words = {8 * i: LIB + LEAF + 0x10 for i in range(200)}
    got = walk(LIB + LEAF, words, size=8 * 200)
    assert got.stop is Stop.TRUNCATED and len(got.frames) == 201
    assert MAX_FRAMES * 48 >= MAX_STACK_BYTES  # frames of 48 bytes fill a copy first


def test_plt_entries() -> None:
    # Before the push (pc & 15 < 11) the CFA is rsp + 8, after it rsp + 16.
    assert walk(LIB + PLT + 0x10, {0: LIB + ROOT + 1}).frames[1] == LIB + ROOT + 1
    assert walk(LIB + PLT + 0x1B, {8: LIB + ROOT + 2}).frames[1] == LIB + ROOT + 2


def test_return_address_at_the_end_of_a_function() -> None:
    # A call to a function that does not return, as mid's last instruction:
    # its return address is the next function's first byte (here: no CFI),
    # and it is looked up one byte before.
    words = {0: LIB + MID + 0x80, 8 + 24: LIB + ROOT + 1}
    got = walk(LIB + LEAF, words)
    assert got == UnwindResult((LIB + LEAF, LIB + MID + 0x80, LIB + ROOT + 1), None)


def test_an_epilogue_that_popped_rbp_keeps_rbp() -> None:
    # After pop rbp the rows still say "rbp at CFA-16" (gcc emits no restore);
    # that slot is below sp by then, so rbp already is the caller's: the
    # caller (no CFI) then walks on by that rbp.
    assert FakeTables().table.rule(EPI + 5).rbp == -16
    got = walk(LIB + EPI + 5, {0: LIB + NOCFI + 1, 0x300: 0, 0x308: LIB + ROOT + 1}, bp=SP + 0x300)
    assert got == UnwindResult((LIB + EPI + 5, LIB + NOCFI + 1, LIB + ROOT + 1), None)


def test_a_zero_return_address_ends_the_stack() -> None:
    assert walk(LIB + LEAF, {0: 0}) == UnwindResult((LIB + LEAF,), None)
    # A frame-pointer guess that finds a zero is no evidence of a root: rbp
    # may point into a zeroed buffer.
    got = walk(LIB + NOCFI, {0x20: 0, 0x28: 0}, bp=SP + 0x20)
    assert got == UnwindResult((LIB + NOCFI,), Stop.NO_CFI)


def test_marker_frames_and_counts() -> None:
    markers = {marker_frame(s) for s in Stop}
    assert len(markers) == len(Stop)
    assert all(m.startswith("[") and m.endswith("]") and ";" not in m for m in markers)
    counts = StopCounts()
    counts.update([(UnwindResult((1,), None), 90), (UnwindResult((1,), Stop.NO_CFI), 9)])
    counts.add("truncated", 1)
    assert counts.total() == 100 and counts.complete == 90
    notes = counts.notes()
    assert (
        len(notes) == 2 and notes[0].startswith("9.0% ") and "[unwind stopped: no CFI]" in notes[0]
    )
    assert counts.notes(min_share=0.05) == notes[:1]


@pytest.mark.parametrize("bad", [Stop.NO_CFI, "no-cfi"])
def test_marker_frame_takes_values_too(bad: Stop | str) -> None:
    assert marker_frame(bad) == "[unwind stopped: no CFI]"


def test_a_mapping_starts_at_its_segments_page() -> None:
    # Text at file offset 0x1040 (vaddr 0x3040) is mapped from offset 0x1000;
    # data before it in the same page belongs to another segment.
    fdes, _ = cfi.parse_cfi(eh_frame(FDES), ADDR, True)
    t = build.compile_fdes(((0, 0, 0x1020), (0x1040, 0x3040, 0x200)), fdes, "test")
    assert t.vaddr_delta(0x1000, 0x2000) == 0x2000  # the text segment's mapping
    assert t.vaddr_delta(0, 0x1000) == 0  # the first segment's
    assert t.vaddr_delta(0x5000, 0x6000) is None


def test_cut_copies_already_the_largest_get_no_advice_to_copy_more() -> None:
    """--stack-bytes helps only where the copies were smaller than the most a
    record holds: on an H200, 24 KiB launch copies still stopped in cuBLASLt
    (70 KiB deep) and the note said to ask for 24 KiB."""
    from gfxbpf.catalog.stack_copies import MAX_STACK_BYTES

    counts = StopCounts()
    counts.add(Stop.TRUNCATED, 10)
    for copied, asked, advice in (
        (8192, 8192, f"; --stack-bytes {MAX_STACK_BYTES} copies more where the policy's "),
        (MAX_STACK_BYTES, 0, f"; the copies were already the {MAX_STACK_BYTES} bytes gfxbpf"),
    ):
        counts.copy = CopySize(copied, MAX_STACK_BYTES, "offcpu", asked)
        notes = counts.notes()
        assert len(notes) == 1 and advice in notes[0], notes
        assert ("--stack-bytes" in notes[0]) == (copied < MAX_STACK_BYTES), notes


def test_copies_of_the_policys_size_advise_the_administrators_command() -> None:
    """With no --stack-bytes the broker copies what the policy allows (8192 for
    offcpu, as `approve` writes it): the note told the user that --stack-bytes
    24576 copies more, which the broker then refused."""
    from gfxbpf.catalog.stack_copies import MAX_STACK_BYTES

    counts = StopCounts()
    counts.add(Stop.TRUNCATED, 10)
    counts.copy = CopySize(8192, MAX_STACK_BYTES, "offcpu", asked=0)
    (note,) = counts.notes()
    assert "the copies were the 8192 bytes the policy lets offcpu copy" in note, note
    assert f"gfxbpf-admin approve offcpu --max-stack-bytes {MAX_STACK_BYTES}" in note, note
    assert "--stack-bytes " not in note, note


def test_the_scan_note_is_left_out_under_a_tenth_of_a_percent() -> None:
    """A PyTorch --memory profile noted "0.0% of the user stacks were
    recovered by a stack scan"."""
    counts = StopCounts()
    counts.scanned = 3
    assert counts.scan_note(10_000) == []
    assert counts.scan_note(3000)[0].startswith("0.1% of the user stacks were recovered")
