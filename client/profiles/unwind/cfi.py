"""A fast reader of DWARF call-frame information (.eh_frame, .debug_frame)
for x86-64: every FDE's address range and its rows (pc -> how to find the
CFA, the saved rbp and the return address).

pyelftools decodes these too, but builds an object per instruction: 6.5 s
per MB of .eh_frame here (libLLVM has 5 MB), and it refuses some opcodes that
glibc and libstdc++ use. This reader keeps only what an x86-64 unwinder needs
(the CFA rule, rbp and the return address; other registers' rules are
parsed and dropped) and decodes each distinct instruction string once: most
functions of a library share their prologue and epilogue shapes, so most
FDEs are a dictionary hit. Every read is bounds-checked; a corrupt entry ends
the walk of its section (CfiError) and keeps what came before.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CfiError", "CfiTooLarge", "Fde", "Section", "parse_cfi"]

RSP, RBP, RA = 7, 6, 16
_S32 = struct.Struct("<i").unpack_from
_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from
# The state a row records: (CFA register, CFA offset, rbp rule, ra rule, arg).
# CFA register -1: the standard PLT expression (arg: its threshold); -2: an
# expression not followed; -3: a signal frame (the CFA is the word at rsp +
# offset; rbp and the return address are then saved at rsp + their rule, the
# saved registers of the ucontext the kernel pushed); -4: a frame realigned by
# GCC's DRAP (the CFA is the word at rbp + offset: DW_OP_breg6 N; DW_OP_deref).
# A rule: an offset from the CFA (a multiple of 8), or one of the odd markers
# below (compiled.py REG_*); _AT_RBP: saved at rbp + 0 (the DRAP frame's rbp).
_SAME, _UNDEFINED, _UNKNOWN, _AT_RBP = 1, 3, 5, 7
_PLT, _EXPR, _SIGNAL, _RBP_DEREF = -1, -2, -3, -4
State = tuple[int, int, int, int, int]
# The PLT's CFA: rsp + N, + 8 once (rip & 15) >= K (DW_OP_breg7 N; DW_OP_breg16 0;
# DW_OP_lit15; DW_OP_and; DW_OP_litK; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus).
_PLT_HEAD, _PLT_TAIL = b"\x80\x00\x3f\x1a", b"\x2a\x33\x24\x22"


# Distinct instruction strings whose rows are remembered (libLLVM has a few thousand).
_MEMO_MAX = 1 << 16


class _Absolute(Exception):
    """An FDE uses DW_CFA_set_loc: its rows cannot be shared with other FDEs."""


class CfiTooLarge(Exception):
    """A section holds more FDEs than the caller's limit: refused as a whole
    (not a corrupt tail, whose head is kept)."""


class CfiError(ValueError):
    """A CIE or FDE that runs outside its section or uses an unknown encoding."""


@dataclass(frozen=True, slots=True)  # slots: a large table holds 100,000s
class Fde:
    start: int
    end: int
    # (first address - start, state), sorted, the first at 0. FDEs with the
    # same instructions share one list: do not change it.
    rows: list[tuple[int, State]]


@dataclass
class _Cie:
    code_align: int
    data_align: int
    ra_reg: int
    fde_enc: int  # DW_EH_PE_* of FDE addresses
    has_aug: bool  # 'z': FDEs carry an augmentation length
    initial: State  # after the CIE's initial instructions
    addr_size: int = 8


def _uleb(b: bytes, pos: int) -> tuple[int, int]:
    v = b[pos]
    if v < 0x80:
        return v, pos + 1
    result, shift = v & 0x7F, 7
    while True:
        pos += 1
        v = b[pos]
        result |= (v & 0x7F) << shift
        shift += 7
        if v < 0x80:
            return result, pos + 1


def _sleb(b: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        v = b[pos]
        pos += 1
        result |= (v & 0x7F) << shift
        shift += 7
        if v < 0x80:
            if v & 0x40:
                result -= 1 << shift
            return result, pos


_FIXED = {0x02: ("<H", 2), 0x03: ("<I", 4), 0x04: ("<Q", 8),
          0x0A: ("<h", 2), 0x0B: ("<i", 4), 0x0C: ("<q", 8)}  # fmt: skip


def read_encoded(b: bytes, pos: int, enc: int, base: int) -> tuple[int, int]:
    """A DW_EH_PE-encoded pointer at pos: (value, next pos). base: the
    address of b[0] (pc-relative values add base + pos)."""
    fmt = enc & 0x0F
    here = base + pos
    if fmt == 0x00:  # absptr: 8 bytes on x86-64
        value, pos = _U64(b, pos)[0], pos + 8
    elif fmt == 0x01:
        value, pos = _uleb(b, pos)
    elif fmt == 0x09:
        value, pos = _sleb(b, pos)
    elif fmt in _FIXED:
        code, size = _FIXED[fmt]
        value, pos = struct.unpack_from(code, b, pos)[0], pos + size
    else:
        raise CfiError(f"unknown pointer encoding {enc:#x}")
    if enc & 0x70 == 0x10:  # pcrel
        value += here
    elif enc & 0x70 not in (0x00, 0x30):  # datarel (0x30) has no base we know: taken as is
        raise CfiError(f"unsupported pointer application {enc:#x}")
    return value & 0xFFFF_FFFF_FFFF_FFFF, pos


def _expr_cfa(block: bytes) -> tuple[int, int, int]:
    """(CFA register, offset, arg) for a DW_CFA_def_cfa_expression block."""
    if len(block) >= 2 and block[0] == 0x76:  # DW_OP_breg6 (rbp) N; DW_OP_deref
        off, p = _sleb(block, 1)
        if block[p:] == b"\x06":  # a realigned frame: the DRAP register saved at rbp + N
            return _RBP_DEREF, off, 0
    if len(block) >= 2 and block[0] == 0x77:  # DW_OP_breg7 (rsp)
        off, p = _sleb(block, 1)
        rest = block[p:]
        if len(rest) == 9 and rest[:4] == _PLT_HEAD and rest[5:] == _PLT_TAIL:
            if 0x30 <= rest[4] <= 0x4F:  # DW_OP_lit0..31
                return _PLT, off, rest[4] - 0x30
        if rest == b"\x06" and off >= 0:  # DW_OP_deref: glibc's __restore_rt (sigreturn)
            return _SIGNAL, off, 0
    return _EXPR, 0, 0


def _expression(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    """DW_CFA_expression: followed in a signal frame, for a register saved at
    rsp + n (DW_OP_breg7 n), as glibc describes the ucontext's slots, and for
    rbp saved at rbp + 0 (DW_OP_breg6 0), as GCC describes a realigned frame."""
    reg, pos = _uleb(code, pos)
    size, pos = _uleb(code, pos)
    if pos + size > len(code):
        raise CfiError("an expression runs past its FDE")
    block, rule = code[pos : pos + size], _UNKNOWN
    if st[0] == _SIGNAL and block[:1] == b"\x77":
        off, end = _sleb(block, 1)
        if end == len(block) and off >= 0 and off % 8 == 0:
            rule = off
    elif reg == RBP and block == b"\x76\x00":
        rule = _AT_RBP
    _set(st, reg, rule, cie.ra_reg)
    return pos + size


def _set(st: list[int], reg: int, rule: int, ra_reg: int) -> None:
    """Record a register rule: only rbp's and the return address's are kept."""
    if reg == RBP:
        st[2] = rule
    elif reg == ra_reg:
        st[3] = rule


def _restore(st: list[int], reg: int, cie: _Cie) -> None:
    if reg == RBP:
        st[2] = cie.initial[2]
    elif reg == cie.ra_reg:
        st[3] = cie.initial[3]


# long: one loop over the instructions with the frequent opcodes inline: this
# is where a large library's parse time goes; the rare ones are in _other().
def execute(code: bytes, cie: _Cie, loc: int, base: int | None = None) -> list[tuple[int, State]]:
    """Run one FDE's instructions from the CIE's initial state: the rows
    (address, state), one per advance plus the last; later rows at the same
    address supersede earlier ones. base: the address of code[0], for
    DW_CFA_set_loc (absolute); None: loc is relative, and a DW_CFA_set_loc
    raises _Absolute."""
    st = list(cie.initial)
    caf, daf, ra_reg = cie.code_align, cie.data_align, cie.ra_reg
    rows: list[tuple[int, State]] = []
    remembered: list[list[int]] = []
    pos, n = 0, len(code)
    while pos < n:
        op = code[pos]
        pos += 1
        hi = op & 0xC0
        if hi == 0x40:  # DW_CFA_advance_loc
            rows.append((loc, (st[0], st[1], st[2], st[3], st[4])))
            loc += (op & 0x3F) * caf
        elif hi == 0x80:  # DW_CFA_offset
            value, pos = _uleb(code, pos)
            _set(st, op & 0x3F, value * daf, ra_reg)
        elif hi == 0xC0:  # DW_CFA_restore
            _restore(st, op & 0x3F, cie)
        elif op == 0x0E:  # DW_CFA_def_cfa_offset
            st[1], pos = _uleb(code, pos)
        elif op == 0x0A:  # DW_CFA_remember_state
            remembered.append(st.copy())
        elif op == 0x0B:  # DW_CFA_restore_state (the location stays)
            if not remembered:
                raise CfiError("DW_CFA_restore_state without a remembered state")
            st = remembered.pop()
        elif op in _ADVANCE or op == 0x01:
            rows.append((loc, (st[0], st[1], st[2], st[3], st[4])))
            if op == 0x01:  # DW_CFA_set_loc: an absolute address, FDE-encoded
                if base is None:
                    raise _Absolute
                loc, pos = read_encoded(code, pos, cie.fde_enc, base)
            else:
                size, unpack = _ADVANCE[op]
                loc += unpack(code, pos)[0] * caf
                pos += size
        elif op != 0x00:  # DW_CFA_nop
            pos = _other(op, code, pos, st, cie)
    rows.append((loc, (st[0], st[1], st[2], st[3], st[4])))
    return rows


_ADVANCE: dict[int, tuple[int, Callable[[bytes, int], tuple[int, ...]]]] = {
    0x02: (1, struct.Struct("<B").unpack_from),
    0x03: (2, _U16),
    0x04: (4, _U32),
}


def _other(op: int, code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    """The opcodes that are rare on x86-64; returns the next position."""
    handler = _HANDLERS.get(op)
    if handler is None:
        raise CfiError(f"unknown CFA instruction {op:#x}")
    return handler(code, pos, st, cie)


def _def_cfa(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    st[0], pos = _uleb(code, pos)
    st[1], pos = _uleb(code, pos)
    return pos


def _def_cfa_sf(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    st[0], pos = _uleb(code, pos)
    off, pos = _sleb(code, pos)
    st[1] = off * cie.data_align
    return pos


def _def_cfa_register(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    st[0], pos = _uleb(code, pos)
    return pos


def _def_cfa_offset_sf(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    off, pos = _sleb(code, pos)
    st[1] = off * cie.data_align
    return pos


def _def_cfa_expression(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    size, pos = _uleb(code, pos)
    if pos + size > len(code):
        raise CfiError("DW_CFA_def_cfa_expression runs past its FDE")
    st[0], st[1], st[4] = _expr_cfa(code[pos : pos + size])
    return pos + size


def _offset_extended(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    reg, pos = _uleb(code, pos)
    value, pos = _uleb(code, pos)
    _set(st, reg, value * cie.data_align, cie.ra_reg)
    return pos


def _offset_extended_sf(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    reg, pos = _uleb(code, pos)
    value, pos = _sleb(code, pos)
    _set(st, reg, value * cie.data_align, cie.ra_reg)
    return pos


def _negative_offset(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    reg, pos = _uleb(code, pos)
    value, pos = _uleb(code, pos)
    _set(st, reg, -value * cie.data_align, cie.ra_reg)
    return pos


def _restore_extended(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    reg, pos = _uleb(code, pos)
    _restore(st, reg, cie)
    return pos


def _rule_only(rule: int) -> Callable[[bytes, int, list[int], _Cie], int]:
    """DW_CFA_undefined / same_value (one register operand)."""

    def handler(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
        reg, pos = _uleb(code, pos)
        _set(st, reg, rule, cie.ra_reg)
        return pos

    return handler


def _unknown_after(operand: str) -> Callable[[bytes, int, list[int], _Cie], int]:
    """Rules this unwinder does not follow (a register saved in another one,
    by an expression, or as a value): the register, then "uleb", "sleb" or
    "block" is skipped, and the register's rule becomes unknown."""

    def handler(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
        reg, pos = _uleb(code, pos)
        if operand == "sleb":
            _, pos = _sleb(code, pos)
        else:
            size, pos = _uleb(code, pos)
            pos += size if operand == "block" else 0
        if pos > len(code):
            raise CfiError("an expression runs past its FDE")
        _set(st, reg, _UNKNOWN, cie.ra_reg)
        return pos

    return handler


def _args_size(code: bytes, pos: int, st: list[int], cie: _Cie) -> int:
    return _uleb(code, pos)[1]  # DW_CFA_GNU_args_size: not needed to unwind


_HANDLERS: dict[int, Callable[[bytes, int, list[int], _Cie], int]] = {
    0x05: _offset_extended,
    0x06: _restore_extended,
    0x07: _rule_only(_UNDEFINED),
    0x08: _rule_only(_SAME),
    0x09: _unknown_after("uleb"),  # DW_CFA_register
    0x0C: _def_cfa,
    0x0D: _def_cfa_register,
    0x0F: _def_cfa_expression,
    0x10: _expression,  # DW_CFA_expression
    0x11: _offset_extended_sf,
    0x12: _def_cfa_sf,
    0x13: _def_cfa_offset_sf,
    0x14: _unknown_after("uleb"),  # DW_CFA_val_offset
    0x15: _unknown_after("sleb"),  # DW_CFA_val_offset_sf
    0x16: _unknown_after("block"),  # DW_CFA_val_expression
    0x2E: _args_size,
    0x2F: _negative_offset,  # DW_CFA_GNU_negative_offset_extended
}


class Section:
    """One .eh_frame or .debug_frame: its CIEs (parsed when first named) and
    the memo of instruction strings already run."""

    def __init__(self, data: bytes, addr: int, eh: bool, max_fdes: int = 1 << 62) -> None:
        self.data, self.addr, self.eh, self.max_fdes = data, addr, eh, max_fdes
        self.cies: dict[int, _Cie] = {}
        # (CIE offset, instructions) -> rows relative to the FDE's start
        self.memo: dict[tuple[int, bytes], list[tuple[int, State]]] = {}
        self.fdes: list[Fde] = []

    def walk(self) -> None:
        data, n, pos = self.data, len(self.data), 0
        while pos + 4 <= n:
            length, head, wide = _U32(data, pos)[0], 4, False
            if length == 0xFFFF_FFFF:  # 64-bit DWARF
                length, head, wide = _U64(data, pos + 4)[0], 12, True
            if length == 0:
                if self.eh:
                    return  # the terminator
                pos += head
                continue
            start, end = pos + head, pos + head + length
            if end > n or length < (8 if wide else 4):
                raise CfiError(f"an entry at {pos:#x} runs past its section")
            ident = _U64(data, start)[0] if wide else _U32(data, start)[0]
            body = start + (8 if wide else 4)
            if len(self.fdes) >= self.max_fdes:
                raise CfiTooLarge(f"more than {self.max_fdes} FDEs")
            if self.eh and ident != 0:
                self._fde(body, end, self._cie(start - ident))
            elif not self.eh and ident not in (0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF):
                self._fde(body, end, self._cie(ident))
            pos = end

    def fde_at(self, at: int) -> Fde | None:
        """The FDE whose entry starts at offset at (as .eh_frame_hdr's search
        table names it); None for a discarded one. Raises CfiError."""
        data = self.data
        if not 0 <= at <= len(data) - 8:
            raise CfiError(f"the search table points outside .eh_frame ({at:#x})")
        length = _U32(data, at)[0]
        start, end = at + 4, at + 4 + length
        if length in (0, 0xFFFF_FFFF) or end > len(data):
            raise CfiError(f"the search table points at no FDE ({at:#x})")
        ident = _U32(data, start)[0]
        if ident == 0:
            raise CfiError(f"the search table points at a CIE ({at:#x})")
        before = len(self.fdes)
        self._fde(start + 4, end, self._cie(start - ident))
        return self.fdes.pop() if len(self.fdes) > before else None

    def _cie(self, at: int) -> _Cie:
        cie = self.cies.get(at)
        if cie is None:
            cie = self.cies[at] = _parse_cie(self.data, at, self.eh)
        return cie

    def _fde(self, pos: int, end: int, cie: _Cie) -> None:
        data = self.data
        if cie.fde_enc == 0x1B:  # pcrel sdata4: what gcc and clang emit
            begin = (_S32(data, pos)[0] + self.addr + pos) & 0xFFFF_FFFF_FFFF_FFFF
            size, pos = _U32(data, pos + 4)[0], pos + 8
        else:
            begin, pos = read_encoded(data, pos, cie.fde_enc, self.addr)
            size, pos = read_encoded(data, pos, cie.fde_enc & 0x0F, 0)
        if cie.has_aug:
            skip, pos = _uleb(data, pos)
            pos += skip
        if pos > end:
            raise CfiError(f"the FDE before {end:#x} runs past its entry")
        if begin == 0 or size == 0:
            return  # the FDE of a discarded section
        code = data[pos:end]
        key = (id(cie), code)
        rows = self.memo.get(key)
        if rows is None:
            try:
                rows = execute(code, cie, 0)
                if len(self.memo) < _MEMO_MAX:  # a crafted table shares nothing
                    self.memo[key] = rows
            except _Absolute:
                absolute = execute(code, cie, begin, self.addr + pos)
                rows = [(a - begin, s) for a, s in absolute]
        self.fdes.append(Fde(begin, begin + size, rows))


def _parse_cie(data: bytes, at: int, eh: bool) -> _Cie:
    """The CIE at offset at: its alignment factors, return-address register,
    FDE pointer encoding and the state after its initial instructions."""
    if at < 0 or at + 4 > len(data):
        raise CfiError(f"an FDE names a CIE at {at:#x}, outside the section")
    length, head = _U32(data, at)[0], 4
    if length == 0xFFFF_FFFF:
        length, head = _U64(data, at + 4)[0], 12
    end = at + head + length
    pos = at + head + (8 if head == 12 else 4)
    if end > len(data):
        raise CfiError(f"the CIE at {at:#x} runs past its section")
    version = data[pos]
    aug_end = data.index(b"\0", pos + 1, end)
    aug = data[pos + 1 : aug_end].decode("ascii", "replace")
    pos = aug_end + 1
    addr_size = 8
    if version >= 4:  # address and segment sizes (.debug_frame of DWARF 4+)
        addr_size, pos = data[pos], pos + 2
    code_align, pos = _uleb(data, pos)
    data_align, pos = _sleb(data, pos)
    if version == 1:
        ra_reg, pos = data[pos], pos + 1
    else:
        ra_reg, pos = _uleb(data, pos)
    fde_enc, pos = _augmentation(data, pos, aug, eh)
    cie = _Cie(code_align, data_align, ra_reg, fde_enc, aug.startswith("z"),
               (RSP, 8, _SAME, _UNDEFINED, 0), addr_size)  # fmt: skip
    if end < pos:
        raise CfiError(f"the CIE at {at:#x} runs past its entry")
    rows = execute(data[pos:end], cie, 0, 0)
    cie.initial = rows[-1][1]
    return cie


def _augmentation(data: bytes, pos: int, aug: str, eh: bool) -> tuple[int, int]:
    """(FDE pointer encoding, position of the initial instructions)."""
    enc = 0x00  # absptr, what .debug_frame always uses
    if not aug.startswith("z"):
        if aug not in ("", "S"):
            raise CfiError(f"unknown CIE augmentation {aug!r}")
        return enc, pos
    size, pos = _uleb(data, pos)
    after = pos + size
    for ch in aug[1:]:
        if ch == "R":
            enc, pos = data[pos], pos + 1
        elif ch == "P":  # personality: its encoding, then a pointer to skip
            penc = data[pos]
            _, pos = read_encoded(data, pos + 1, penc & 0x7F, 0)
        elif ch == "L":
            pos += 1
        elif ch not in "SB":
            break  # unknown letters: the length says where the data ends
    return enc, after


def parse_cfi(
    data: bytes, addr: int, eh: bool, max_fdes: int = 1 << 62
) -> tuple[list[Fde], str | None]:
    """The FDEs of one section whose first byte is at address addr (eh: an
    .eh_frame, else a .debug_frame), and why the walk stopped early if it did
    (what came before is kept). Raises CfiTooLarge past max_fdes FDEs."""
    section = Section(data, addr, eh, max_fdes)
    try:
        section.walk()
    except (CfiError, IndexError, ValueError, struct.error) as e:
        return section.fdes, str(e) or "corrupt call-frame information"
    return section.fdes, None
