"""The CFI reader on synthetic .eh_frame/.debug_frame bytes, one test per
CFA instruction x86-64 code uses, and on real files against readelf -wF."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess

import pytest

from gfxbpf.client.profiles.unwind import build, cfi
from gfxbpf.client.profiles.unwind.compiled import (
    CFA_NONE,
    CFA_PLT,
    CFA_RBP,
    CFA_RBP_DEREF,
    CFA_RSP,
    CFA_SIGNAL,
    CFA_UNSUPPORTED,
    REG_AT_RBP,
    REG_SAME,
    REG_UNDEFINED,
    REG_UNKNOWN,
    FileTable,
    Rule,
)
from tests.conftest import skip_or_fail

ADDR = 0x2000  # where the synthetic .eh_frame is loaded
START = 0x10000  # the first FDE's function
# The CIE gcc emits: CFA = rsp + 8, return address at CFA - 8.
CIE_INIT = b"\x0c\x07\x08\x90\x01"


def uleb(v: int) -> bytes:
    out = bytearray()
    while True:
        byte, v = v & 0x7F, v >> 7
        out.append(byte | (0x80 if v else 0))
        if not v:
            return bytes(out)


def sleb(v: int) -> bytes:
    out = bytearray()
    while True:
        byte, v = v & 0x7F, v >> 7
        done = (v == 0 and not byte & 0x40) or (v == -1 and byte & 0x40)
        out.append(byte | (0 if done else 0x80))
        if done:
            return bytes(out)


def eh_frame(fdes: list[tuple[int, int, bytes]], aug: bytes = b"zR", aug_data: bytes = b"\x1b",
             init: bytes = CIE_INIT) -> bytes:  # fmt: skip
    """A CIE and the FDEs (start, size, instructions), pc-relative sdata4."""
    body = b"\0\0\0\0\x01" + aug + b"\0" + uleb(1) + sleb(-8) + b"\x10"
    body += uleb(len(aug_data)) + aug_data + init
    out = bytearray(struct.pack("<I", len(body)) + body)
    for start, size, code in fdes:
        pos = len(out)
        rel = start - (ADDR + pos + 8)
        fde = struct.pack("<Iii", pos + 4, rel, size) + uleb(0) + code
        out += struct.pack("<I", len(fde)) + fde
    return bytes(out + b"\0\0\0\0")


def table(section: bytes, eh: bool = True) -> FileTable:
    fdes, error = cfi.parse_cfi(section, ADDR, eh)
    assert error is None
    return build.compile_fdes(((0, 0, 1 << 32),), fdes, "test")


def rule_after(code: bytes, at: int = 0x40) -> Rule:
    """The rule at START + 1 after the instructions code (no advances in it),
    which are followed by an advance to START + at."""
    t = table(eh_frame([(START, 0x100, b"\x41" + code + b"\x02" + bytes([at - 1]))]))
    assert t.rule(START) == Rule(CFA_RSP, 8, REG_SAME, -8)  # the CIE's state first
    return t.rule(START + 1)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (b"\x0e\x10", Rule(CFA_RSP, 16, REG_SAME, -8)),  # def_cfa_offset
        (b"\x13" + sleb(-4), Rule(CFA_RSP, 32, REG_SAME, -8)),  # def_cfa_offset_sf
        (b"\x0c\x06\x10", Rule(CFA_RBP, 16, REG_SAME, -8)),  # def_cfa
        (b"\x12\x06" + sleb(-2), Rule(CFA_RBP, 16, REG_SAME, -8)),  # def_cfa_sf
        (b"\x0d\x06", Rule(CFA_RBP, 8, REG_SAME, -8)),  # def_cfa_register keeps the offset
        (b"\x0c\x03\x08", Rule(CFA_UNSUPPORTED, 0, REG_SAME, -8)),  # CFA by rbx
        (b"\x86\x02", Rule(CFA_RSP, 8, -16, -8)),  # offset
        (b"\x05\x06\x03", Rule(CFA_RSP, 8, -24, -8)),  # offset_extended
        (b"\x11\x06" + sleb(3), Rule(CFA_RSP, 8, -24, -8)),  # offset_extended_sf
        (b"\x2f\x06\x02", Rule(CFA_RSP, 8, 16, -8)),  # GNU_negative_offset_extended
        (b"\x86\x02\xc6", Rule(CFA_RSP, 8, REG_SAME, -8)),  # restore
        (b"\x86\x02\x06\x06", Rule(CFA_RSP, 8, REG_SAME, -8)),  # restore_extended
        (b"\x86\x02\x08\x06", Rule(CFA_RSP, 8, REG_SAME, -8)),  # same_value
        (b"\x07\x10", Rule(CFA_RSP, 8, REG_SAME, REG_UNDEFINED)),  # undefined ra
        (b"\x09\x06\x03", Rule(CFA_RSP, 8, REG_UNKNOWN, -8)),  # register
        (b"\x10\x06\x02\x76\x00", Rule(CFA_RSP, 8, REG_AT_RBP, -8)),  # rbp at [rbp] (DRAP)
        (b"\x10\x06\x02\x76\x08", Rule(CFA_RSP, 8, REG_UNKNOWN, -8)),  # another expression
        (b"\x14\x06\x02", Rule(CFA_RSP, 8, REG_UNKNOWN, -8)),  # val_offset
        (b"\x15\x06" + sleb(-2), Rule(CFA_RSP, 8, REG_UNKNOWN, -8)),  # val_offset_sf
        (b"\x16\x10\x01\x9c", Rule(CFA_RSP, 8, REG_SAME, REG_UNKNOWN)),  # val_expression
        (b"\x2e\x10\x00", Rule(CFA_RSP, 8, REG_SAME, -8)),  # GNU_args_size, nop
        (b"\x0a\x0e\x20\x86\x02\x0b", Rule(CFA_RSP, 8, REG_SAME, -8)),  # remember, restore
        (b"\x8c\x03", Rule(CFA_RSP, 8, REG_SAME, -8)),  # r12 saved: not a rule we keep
    ],
)
def test_each_cfa_instruction(code: bytes, expected: Rule) -> None:
    assert rule_after(code) == expected


PLT_EXPR = bytes([0x77, 0x08, 0x80, 0x00, 0x3F, 0x1A, 0x3B, 0x2A, 0x33, 0x24, 0x22])


def test_the_plt_expression_is_recognised_and_others_are_not() -> None:
    assert rule_after(b"\x0f" + uleb(len(PLT_EXPR)) + PLT_EXPR) == Rule(
        CFA_PLT, 8, REG_SAME, -8, 11
    )
    deref = bytes([0x77, 0x08, 0x06])  # breg7 8; deref: a signal frame's rule
    assert rule_after(b"\x0f\x03" + deref) == Rule(CFA_SIGNAL, 8, REG_SAME, -8)
    # breg6 (rbp) 8; deref: a realigned frame's CFA (test_a_realigned_frame_is_followed).
    assert rule_after(b"\x0f\x03" + bytes([0x76, 0x08, 0x06])).cfa == CFA_RBP_DEREF
    # A register rule after the expression: the offset stays the expression's.
    assert rule_after(b"\x0f" + uleb(len(PLT_EXPR)) + PLT_EXPR + b"\x86\x02").rbp == -16


@pytest.mark.parametrize(
    ("advance", "delta"),
    [
        (b"\x45", 5),
        (b"\x02\xf0", 0xF0),
        (b"\x03\x00\x01", 0x100),
        (b"\x04\x00\x00\x01\x00", 0x10000),
    ],  # fmt: skip
)
def test_advances(advance: bytes, delta: int) -> None:
    t = table(eh_frame([(START, 0x20000, b"\x0e\x10" + advance + b"\x0e\x18")]))
    assert t.rule(START + delta - 1).off == 16
    assert t.rule(START + delta).off == 24
    assert t.rule(START + 0x1FFFF).off == 24


def test_restore_state_keeps_the_location() -> None:
    # push rbx; remember; (leave on one path) pop: CFA 8; restore: the other path at CFA 16.
    code = b"\x41\x0e\x10\x83\x02\x0a\x42\x0e\x08\xc3\x41\x0b"
    t = table(eh_frame([(START, 0x10, code)]))
    assert [t.rule(START + i).off for i in range(5)] == [8, 16, 16, 8, 16]
    assert t.rule(START + 4).rbp == REG_SAME


def test_gaps_overlaps_and_function_ranges() -> None:
    same = b"\x41\x0e\x10"
    t = table(eh_frame([(START, 0x10, same), (START + 0x20, 0x10, same),
                        (START + 0x28, 0x10, b"")]))  # fmt: skip
    assert t.rule(START - 1).cfa == CFA_NONE
    assert t.rule(START + 1).off == 16  # the shared instruction string, at each FDE's address
    assert t.rule(START + 0x10).cfa == CFA_NONE  # between the FDEs
    assert t.rule(START + 0x21).off == 16
    assert t.rule(START + 0x29).off == 8  # the later FDE wins from its start on
    assert t.rule(START + 0x38).cfa == CFA_NONE
    assert t.function(START + 5) == (START, START + 0x10)
    assert t.function(START + 0x18) is None


def test_a_corrupt_entry_keeps_what_came_before() -> None:
    good = eh_frame([(START, 0x10, b"\x41\x0e\x10")])[:-4]
    broken = good + struct.pack("<I", 0x1000) + b"\0" * 8  # a length past the section
    fdes, error = cfi.parse_cfi(broken, ADDR, True)
    assert [(f.start, f.end) for f in fdes] == [(START, START + 0x10)]
    assert error is not None and "past" in error
    unknown = eh_frame([(START, 0x10, b"\x0e\x10"), (START + 0x10, 0x10, b"\x3f")])
    fdes, error = cfi.parse_cfi(unknown, ADDR, True)
    assert len(fdes) == 1 and error is not None and "0x3f" in error


def test_personality_and_lsda_augmentations() -> None:
    # zPLR: personality (pcrel sdata4) + LSDA encoding + FDE encoding; FDEs carry an LSDA.
    aug_data = b"\x9b" + struct.pack("<i", 0x1234) + b"\x1b\x1b"
    section = bytearray(eh_frame([(START, 0x10, b"\x41\x0e\x10")], b"zPLR", aug_data))
    fdes, error = cfi.parse_cfi(bytes(section), ADDR, True)
    assert error is None and fdes[0].start == START


def _debug_frame(version: int, wide: bool) -> bytes:
    """A .debug_frame: absolute addresses, CIE id all ones, DW_CFA_set_loc."""
    head = b"" if version < 4 else b"\x08\x00"  # address size, segment size
    ra = b"\x10" if version == 1 else uleb(16)
    cie = bytes([version]) + b"\0" + head + uleb(1) + sleb(-8) + ra + CIE_INIT
    ident = b"\xff" * (8 if wide else 4)
    code = b"\x41\x0e\x10\x01" + struct.pack("<Q", START + 8) + b"\x0e\x18"
    fde_body = struct.pack("<QQ", START, 0x10) + code

    def entry(at_ident: bytes, body: bytes) -> bytes:
        n = len(at_ident) + len(body)
        return (b"\xff\xff\xff\xff" + struct.pack("<Q", n) if wide else struct.pack("<I", n)) + (
            at_ident + body
        )

    first = entry(ident, cie)
    return first + entry(struct.pack("<Q" if wide else "<I", 0), fde_body)


@pytest.mark.parametrize(("version", "wide"), [(1, False), (3, False), (4, True)])
def test_debug_frame(version: int, wide: bool) -> None:
    t = table(_debug_frame(version, wide), eh=False)
    assert [t.rule(START + i).off for i in (0, 1, 7, 8, 15)] == [8, 16, 16, 24, 24]
    assert t.rule(START + 16).cfa == CFA_NONE


# --------------------------------------------------------------- real files

_READELF_CFA = re.compile(r"(rsp|rbp)\+(\d+)")


def _readelf_rows(path: str) -> list[tuple[int, dict[str, str], tuple[int, int]]]:
    out = subprocess.run(["readelf", "-wF", path], capture_output=True, text=True).stdout
    rows, cols, fde = [], None, None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE .* pc=([0-9a-f]+)\.\.([0-9a-f]+)", line)
        if m or " CIE" in line:
            fde, cols = ((int(m[1], 16), int(m[2], 16)) if m else None), None
        elif line.strip().startswith("LOC"):
            cols = line.split()
        elif fde and cols and len(line.split()) == len(cols):
            parts = line.split()
            loc = int(parts[0], 16)
            if fde[0] <= loc < fde[1]:  # readelf also prints a row at the FDE's end
                if rows and rows[-1][0] == loc:
                    rows.pop()  # two rows at one address (an advance of 0): the later holds
                rows.append((loc, dict(zip(cols, parts, strict=True)), fde))
    return rows


# glibc's __restore_rt (x86-64): the CFA is the interrupted rsp saved in the
# ucontext at rsp + 160; rbp at rsp + 120, rip at rsp + 168 (and the other
# registers, not kept). The FDE's CIE has augmentation "zRS".
def _breg7(off: int) -> bytes:
    return b"\x77" + sleb(off)  # DW_OP_breg7 (rsp + off)


def _slot(reg: int, off: int) -> bytes:
    return b"\x10" + uleb(reg) + uleb(len(_breg7(off))) + _breg7(off)  # DW_CFA_expression


SIGNAL_FDE = (
    b"\x0f" + uleb(len(_breg7(160)) + 1) + _breg7(160) + b"\x06"  # def_cfa_expression; deref
    + _slot(6, 120) + _slot(3, 128) + _slot(16, 168)  # rbx (3): not a register the walk keeps
)  # fmt: skip


# GCC's realigned frame (DRAP, e.g. AVX-512 locals in libtorch_cpu): the CFA is
# the word at rbp - 40 (DW_OP_breg6 -40; DW_OP_deref), rbp saved at [rbp].
DRAP_FDE = b"\x10\x06\x02\x76\x00" + b"\x0f\x03\x76" + sleb(-40) + b"\x06"


def test_a_realigned_frame_is_followed() -> None:
    assert rule_after(DRAP_FDE) == Rule(CFA_RBP_DEREF, -40, REG_AT_RBP, -8)
    # Other dereferenced expressions stay unsupported.
    assert rule_after(b"\x0f\x04\x76" + sleb(-40) + b"\x06\x06").cfa == CFA_UNSUPPORTED
    assert rule_after(b"\x0f\x03\x73" + sleb(-40) + b"\x06").cfa == CFA_UNSUPPORTED  # by rbx


def test_a_signal_frame_keeps_the_interrupted_registers_slots() -> None:
    assert rule_after(SIGNAL_FDE) == Rule(CFA_SIGNAL, 160, 120, 168)
    # The same expressions outside a signal frame are not followed.
    assert rule_after(_slot(6, 120)).rbp == REG_UNKNOWN
    # A slot that is no multiple of 8, or below rsp: unknown.
    cfa = SIGNAL_FDE[: 2 + SIGNAL_FDE[1]]
    assert rule_after(cfa + _slot(16, 5)).ra == REG_UNKNOWN
    assert rule_after(cfa + _slot(16, -8)).ra == REG_UNKNOWN


def test_glibc_sigreturn_trampoline_is_a_signal_frame() -> None:
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    info = build.file_facts(libc)
    if info is None:
        pytest.skip(f"{libc} is not on this machine")
    t = build.compile_file(libc, info, "/nonexistent")
    assert t is not None
    assert [r for r in t.rules if r.cfa == CFA_SIGNAL] == [Rule(CFA_SIGNAL, 160, 120, 168)]


def _agrees(got: Rule, want: dict[str, str]) -> bool:
    if got.cfa == CFA_SIGNAL:  # readelf prints the ucontext's slots as expressions
        return want["CFA"] == "exp" and want.get("rbp") == "exp" and want.get("ra") == "exp"
    m = _READELF_CFA.fullmatch(want["CFA"])
    if m:
        cfa_ok = (got.cfa, got.off) == ((CFA_RSP if m[1] == "rsp" else CFA_RBP), int(m[2]))
    else:
        cfa_ok = got.cfa in (CFA_PLT, CFA_UNSUPPORTED, CFA_RBP_DEREF)
    rbp = want.get("rbp", "u")
    rbp_ok = got.rbp in (REG_SAME, REG_UNDEFINED) if rbp in ("u", "s") else (
        got.rbp == int(rbp[1:]) if re.fullmatch(r"c[+-]?\d+", rbp)
        else got.rbp in (REG_UNKNOWN, REG_AT_RBP)
    )  # fmt: skip
    ra = want.get("ra", "u")
    ra_ok = got.ra == (REG_UNDEFINED if ra == "u" else int(ra[1:]) if ra[0] == "c" else REG_UNKNOWN)
    return cfa_ok and rbp_ok and ra_ok


@pytest.mark.parametrize("path", ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3"])
def test_every_row_agrees_with_readelf(path: str) -> None:
    if shutil.which("readelf") is None:
        skip_or_fail("readelf is missing (apt-get install binutils)")
    info = build.file_facts(path)
    if info is None:
        pytest.skip(f"{path} is not on this machine")
    t = build.compile_file(path, info, "/nonexistent")
    assert t is not None and t.source == ".eh_frame"
    rows = _readelf_rows(path)
    assert len(rows) > 10_000
    bad = [(hex(loc), want, t.rule(loc)) for loc, want, _ in rows if not _agrees(t.rule(loc), want)]
    assert not bad, f"{len(bad)} of {len(rows)} rows differ, e.g. {bad[:3]}"
