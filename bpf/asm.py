"""BPF instruction decoding, analysis and a compact disassembler. No syscalls.

An instruction is 8 bytes, little-endian: u8 code, u8 regs (dst = low
nibble, src = high nibble), s16 off, s32 imm. ld_imm64 (code 0x18) takes two
slots; the second slot's imm holds the high 32 bits. Indices here are slot
indices, as the kernel and jump offsets count them.

The broker's static audit uses analyze(); `python -m gfxbpf.bpf inspect`
prints disasm(). Both only read bytes, so any input is safe to pass: bad
input raises ValueError, never anything worse.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from gfxbpf.bpf.consts import (
    BPF_PSEUDO_BTF_ID,
    BPF_PSEUDO_CALL,
    BPF_PSEUDO_FUNC,
    BPF_PSEUDO_KFUNC_CALL,
    BPF_PSEUDO_MAP_FD,
    BPF_PSEUDO_MAP_IDX,
    BPF_PSEUDO_MAP_IDX_VALUE,
    BPF_PSEUDO_MAP_VALUE,
    INSN_SIZE,
)
from gfxbpf.bpf.helpers import helper_name

# Instruction classes (code & 0x07).
BPF_LD = 0x00
BPF_LDX = 0x01
BPF_ST = 0x02
BPF_STX = 0x03
BPF_ALU = 0x04
BPF_JMP = 0x05
BPF_JMP32 = 0x06
BPF_ALU64 = 0x07

# Load/store size (code & 0x18).
BPF_W = 0x00
BPF_H = 0x08
BPF_B = 0x10
BPF_DW = 0x18

# Load/store mode (code & 0xe0).
BPF_IMM = 0x00
BPF_ABS = 0x20
BPF_IND = 0x40
BPF_MEM = 0x60
BPF_MEMSX = 0x80  # sign-extending load (cpu v4)
BPF_ATOMIC = 0xC0

# ALU/JMP operand source (code & 0x08).
BPF_K = 0x00
BPF_X = 0x08

# ALU operations (code & 0xf0).
BPF_ADD = 0x00
BPF_SUB = 0x10
BPF_MUL = 0x20
BPF_DIV = 0x30
BPF_OR = 0x40
BPF_AND = 0x50
BPF_LSH = 0x60
BPF_RSH = 0x70
BPF_NEG = 0x80
BPF_MOD = 0x90
BPF_XOR = 0xA0
BPF_MOV = 0xB0
BPF_ARSH = 0xC0
BPF_END = 0xD0
BPF_TO_LE = 0x00  # BPF_END with BPF_K
BPF_TO_BE = 0x08  # BPF_END with BPF_X

# Jump operations (code & 0xf0).
BPF_JA = 0x00
BPF_JEQ = 0x10
BPF_JGT = 0x20
BPF_JGE = 0x30
BPF_JSET = 0x40
BPF_JNE = 0x50
BPF_JSGT = 0x60
BPF_JSGE = 0x70
BPF_CALL = 0x80
BPF_EXIT = 0x90
BPF_JLT = 0xA0
BPF_JLE = 0xB0
BPF_JSLT = 0xC0
BPF_JSLE = 0xD0

# Atomic operations (imm of an STX|ATOMIC instruction).
BPF_FETCH = 0x01
BPF_XCHG = 0xE0 | BPF_FETCH
BPF_CMPXCHG = 0xF0 | BPF_FETCH
BPF_LOAD_ACQ = 0x100
BPF_STORE_REL = 0x110

CODE_LD_IMM64 = BPF_LD | BPF_DW | BPF_IMM  # 0x18
CODE_CALL = BPF_JMP | BPF_CALL | BPF_K  # 0x85
CODE_EXIT = BPF_JMP | BPF_EXIT  # 0x95

# The one codec of an instruction slot: (code, src<<4|dst, off, imm). The
# loader and the relocators patch slots in place with it; Insn decodes them.
SLOT = struct.Struct("<BBhi")


@dataclass(frozen=True, slots=True)
class Insn:
    """One 8-byte instruction slot. off and imm are signed, as the kernel reads them."""

    code: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0

    @property
    def cls(self) -> int:
        return self.code & 0x07

    @property
    def op(self) -> int:
        """ALU/JMP operation (code & 0xf0)."""
        return self.code & 0xF0

    @property
    def size(self) -> int:
        """Load/store size bits (code & 0x18)."""
        return self.code & 0x18

    @property
    def mode(self) -> int:
        """Load/store mode (code & 0xe0)."""
        return self.code & 0xE0

    def is_ld_imm64(self) -> bool:
        return self.code == CODE_LD_IMM64

    def is_call(self) -> bool:
        return self.code == CODE_CALL

    def is_helper_call(self) -> bool:
        return self.code == CODE_CALL and self.src == 0

    def is_pseudo_call(self) -> bool:
        """A bpf-to-bpf call: target = own index + imm + 1."""
        return self.code == CODE_CALL and self.src == BPF_PSEUDO_CALL

    def is_kfunc_call(self) -> bool:
        """A call to a kernel function: imm = its BTF id."""
        return self.code == CODE_CALL and self.src == BPF_PSEUDO_KFUNC_CALL

    def is_exit(self) -> bool:
        return self.code == CODE_EXIT

    def to_bytes(self) -> bytes:
        for name, value, lo, hi in (
            ("code", self.code, 0, 0xFF),
            ("dst", self.dst, 0, 15),
            ("src", self.src, 0, 15),
            ("off", self.off, -0x8000, 0x7FFF),
            # imm may be given signed or as its unsigned 32-bit pattern.
            ("imm", self.imm, -0x8000_0000, 0xFFFF_FFFF),
        ):
            if not lo <= value <= hi:
                raise ValueError(f"instruction {self}: {name}={value} is outside {lo}..{hi}")
        imm = self.imm - (1 << 32) if self.imm > 0x7FFF_FFFF else self.imm
        return SLOT.pack(self.code, (self.src << 4) | self.dst, self.off, imm)

    @classmethod
    def from_bytes(cls, data: bytes) -> Insn:
        if len(data) != INSN_SIZE:
            raise ValueError(f"an instruction is {INSN_SIZE} bytes, got {len(data)}")
        code, regs, off, imm = SLOT.unpack(data)
        return cls(code, regs & 0x0F, regs >> 4, off, imm)


# Module-level predicates, for callers that prefer functions.
def is_ld_imm64(insn: Insn) -> bool:
    return insn.is_ld_imm64()


def is_call(insn: Insn) -> bool:
    return insn.is_call()


def is_exit(insn: Insn) -> bool:
    return insn.is_exit()


def decode(data: bytes | bytearray | memoryview) -> list[Insn]:
    """Split raw program bytes into instruction slots (ld_imm64 stays two slots)."""
    data = bytes(data)
    if len(data) % INSN_SIZE:
        raise ValueError(
            f"BPF program is {len(data)} bytes, not a multiple of {INSN_SIZE} "
            f"({len(data) // INSN_SIZE} whole instructions and {len(data) % INSN_SIZE} "
            "stray bytes): the input is truncated or is not a program section"
        )
    return [
        Insn(code, regs & 0x0F, regs >> 4, off, imm)
        for code, regs, off, imm in SLOT.iter_unpack(data)
    ]


def encode(insns: list[Insn]) -> bytes:
    """The inverse of decode()."""
    return b"".join(i.to_bytes() for i in insns)


def ld_imm64(dst: int, value: int, src: int = 0) -> list[Insn]:
    """The two slots of `dst = value ll` (src: a BPF_PSEUDO_* kind, 0 = plain constant)."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    return [
        Insn(CODE_LD_IMM64, dst, src, 0, value & 0xFFFF_FFFF),
        Insn(0, 0, 0, 0, value >> 32),
    ]


def imm64(first: Insn, second: Insn) -> int:
    """The unsigned 64-bit value an ld_imm64 pair carries."""
    return ((second.imm & 0xFFFF_FFFF) << 32) | (first.imm & 0xFFFF_FFFF)


@dataclass
class ProgramFacts:
    """What a program calls and loads, by slot index.

    insn_count counts 8-byte slots (an ld_imm64 counts two), like the
    kernel's insn_cnt.
    """

    insn_count: int
    # (insn_index, helper_id, helper name)
    helper_calls: list[tuple[int, int, str]] = field(default_factory=list)
    # sorted unique helper names
    helpers: list[str] = field(default_factory=list)
    # (insn_index, btf_id)
    kfunc_calls: list[tuple[int, int]] = field(default_factory=list)
    # (insn_index, target_index); target = index + imm + 1
    subprog_calls: list[tuple[int, int]] = field(default_factory=list)
    # (insn_index, src_reg, imm64): src 1 = map fd, 2 = map value, 0 = constant
    ld_imm64: list[tuple[int, int, int]] = field(default_factory=list)


def _ld_imm64_pairs(insns: list[Insn], strict: bool) -> list[tuple[int, Insn, Insn | None]]:
    """Walk slots, pairing each ld_imm64 with its second slot.

    Returns (index, insn, second-slot-or-None) for every instruction. A lone
    or malformed ld_imm64 raises ValueError when strict; otherwise its second
    slot is None and the walk goes on one slot at a time.
    """
    out: list[tuple[int, Insn, Insn | None]] = []
    i = 0
    n = len(insns)
    while i < n:
        ins = insns[i]
        if ins.is_ld_imm64():
            nxt = insns[i + 1] if i + 1 < n else None
            bad = None
            if nxt is None:
                bad = "is the last slot and lacks its second half"
            elif nxt.code != 0 or nxt.dst or nxt.src or nxt.off:
                bad = f"has a second slot that is not a bare immediate ({nxt})"
            if bad is not None:
                if strict:
                    raise ValueError(
                        f"ld_imm64 at instruction {i} {bad}: the program is corrupt "
                        "(the kernel would refuse it too)"
                    )
                out.append((i, ins, None))
                i += 1
                continue
            out.append((i, ins, nxt))
            i += 2
            continue
        out.append((i, ins, None))
        i += 1
    return out


def analyze(data: bytes | bytearray | memoryview) -> ProgramFacts:
    """Facts the audit needs: helper, kfunc and subprogram calls, 64-bit loads.

    Raises ValueError for a truncated program or a broken ld_imm64 pair.
    """
    insns = decode(data)
    facts = ProgramFacts(insn_count=len(insns))
    for i, ins, second in _ld_imm64_pairs(insns, strict=True):
        if second is not None:
            facts.ld_imm64.append((i, ins.src, imm64(ins, second)))
        elif ins.is_helper_call():
            facts.helper_calls.append((i, ins.imm, helper_name(ins.imm)))
        elif ins.is_pseudo_call():
            facts.subprog_calls.append((i, i + ins.imm + 1))
        elif ins.is_kfunc_call():
            facts.kfunc_calls.append((i, ins.imm))
    facts.helpers = sorted({name for _, _, name in facts.helper_calls})
    return facts


# ---------------------------------------------------------------------------
# Disassembler (llvm-objdump / bpftool flavoured, for humans).

_ALU_OPS = {
    BPF_ADD: "+=",
    BPF_SUB: "-=",
    BPF_MUL: "*=",
    BPF_DIV: "/=",
    BPF_OR: "|=",
    BPF_AND: "&=",
    BPF_LSH: "<<=",
    BPF_RSH: ">>=",
    BPF_MOD: "%=",
    BPF_XOR: "^=",
    BPF_MOV: "=",
    BPF_ARSH: "s>>=",
}

_JMP_OPS = {
    BPF_JEQ: "==",
    BPF_JGT: ">",
    BPF_JGE: ">=",
    BPF_JSET: "&",
    BPF_JNE: "!=",
    BPF_JSGT: "s>",
    BPF_JSGE: "s>=",
    BPF_JLT: "<",
    BPF_JLE: "<=",
    BPF_JSLT: "s<",
    BPF_JSLE: "s<=",
}

_SIZE_NAMES = {BPF_W: "u32", BPF_H: "u16", BPF_B: "u8", BPF_DW: "u64"}
_SIGNED_SIZE_NAMES = {BPF_W: "s32", BPF_H: "s16", BPF_B: "s8"}

_ATOMIC_OPS = {
    BPF_ADD: ("+=", "add"),
    BPF_OR: ("|=", "or"),
    BPF_AND: ("&=", "and"),
    BPF_XOR: ("^=", "xor"),
}


def _unknown(ins: Insn) -> str:
    return (
        f"unknown opcode 0x{ins.code:02x} "
        f"(dst=r{ins.dst} src=r{ins.src} off={ins.off} imm={ins.imm})"
    )


def _mem(base: int, off: int) -> str:
    return f"r{base} {'-' if off < 0 else '+'} {abs(off)}"


def _jump_off(off: int) -> str:
    return f"{off:+d}"


def _hex(value: int) -> str:
    return f"-0x{-value:x}" if value < 0 else f"0x{value:x}"


def _disasm_alu(ins: Insn) -> str:
    is64 = ins.cls == BPF_ALU64
    r = "r" if is64 else "w"
    dst = f"{r}{ins.dst}"
    op = ins.op
    x = ins.code & BPF_X
    if op == BPF_END:
        bits = ins.imm
        if bits not in (16, 32, 64):
            return _unknown(ins)
        if is64:
            # cpu v4: unconditional byte swap, only the K form exists.
            return _unknown(ins) if x else f"r{ins.dst} = bswap{bits} r{ins.dst}"
        kind = "be" if x else "le"
        return f"r{ins.dst} = {kind}{bits} r{ins.dst}"
    if op == BPF_NEG:
        return f"{dst} = -{dst}" if not x and ins.off == 0 else _unknown(ins)
    sym = _ALU_OPS.get(op)
    if sym is None:
        return _unknown(ins)
    src = f"{r}{ins.src}" if x else str(ins.imm)
    if ins.off == 0:
        return f"{dst} {sym} {src}"
    # cpu v4 reuses off: signed div/mod (off 1) and sign-extending mov.
    if op in (BPF_DIV, BPF_MOD) and ins.off == 1:
        return f"{dst} s{sym} {src}"
    if op == BPF_MOV and x and ins.off in (8, 16) + ((32,) if is64 else ()):
        return f"{dst} = (s{ins.off}){r}{ins.src}"
    return _unknown(ins)


def _disasm_jmp(i: int, ins: Insn) -> str:
    op = ins.op
    x = ins.code & BPF_X
    is32 = ins.cls == BPF_JMP32
    if op == BPF_CALL and not is32:
        if x:
            return f"callx r{ins.dst}"
        if ins.src == 0:
            return f"call {ins.imm} <{helper_name(ins.imm)}>"
        if ins.src == BPF_PSEUDO_CALL:
            return f"call pc{_jump_off(ins.imm)} <insn {i + ins.imm + 1}>"
        if ins.src == BPF_PSEUDO_KFUNC_CALL:
            return f"call kfunc btf_id:{ins.imm}" + (f" btf_fd_idx:{ins.off}" if ins.off else "")
        return _unknown(ins)
    if op == BPF_EXIT and not is32 and not x:
        return "exit"
    if op == BPF_JA and not x:
        # JMP32|JA is cpu v4's gotol with a 32-bit offset in imm.
        return f"gotol {_jump_off(ins.imm)}" if is32 else f"goto {_jump_off(ins.off)}"
    sym = _JMP_OPS.get(op)
    if sym is None:
        return _unknown(ins)
    r = "w" if is32 else "r"
    src = f"{r}{ins.src}" if x else _hex(ins.imm)
    return f"if {r}{ins.dst} {sym} {src} goto {_jump_off(ins.off)}"


def _disasm_atomic(ins: Insn) -> str:
    size = ins.size
    if size not in (BPF_W, BPF_DW) and ins.imm not in (BPF_LOAD_ACQ, BPF_STORE_REL):
        return _unknown(ins)
    r = "r" if size == BPF_DW else "w"
    ty = _SIZE_NAMES[size]
    addr = f"({ty} *)({_mem(ins.dst, ins.off)})"
    imm = ins.imm
    if imm == BPF_LOAD_ACQ:
        return f"{r}{ins.src} = load_acquire({addr})"
    if imm == BPF_STORE_REL:
        return f"store_release({addr}, {r}{ins.src})"
    bits = 64 if size == BPF_DW else 32
    if imm == BPF_XCHG:
        return f"{r}{ins.src} = xchg_{bits}({_mem(ins.dst, ins.off)}, {r}{ins.src})"
    if imm == BPF_CMPXCHG:
        return f"{r}0 = cmpxchg_{bits}({_mem(ins.dst, ins.off)}, {r}0, {r}{ins.src})"
    base = imm & ~BPF_FETCH
    if base not in _ATOMIC_OPS:
        return _unknown(ins)
    sym, name = _ATOMIC_OPS[base]
    if imm & BPF_FETCH:
        return f"{r}{ins.src} = atomic_fetch_{name}({addr}, {r}{ins.src})"
    return f"lock *{addr} {sym} {r}{ins.src}"


def _disasm_ld_imm64(ins: Insn, value: int) -> str:
    dst = f"r{ins.dst}"
    lo = value & 0xFFFF_FFFF
    hi = value >> 32
    src = ins.src
    if src == 0:
        signed = value - (1 << 64) if value >> 63 else value
        return f"{dst} = {signed} ll"
    if src == BPF_PSEUDO_MAP_FD:
        return f"{dst} = map[fd:{lo}] ll"
    if src == BPF_PSEUDO_MAP_VALUE:
        return f"{dst} = map[fd:{lo}]+{hi} ll"
    if src == BPF_PSEUDO_MAP_IDX:
        return f"{dst} = map[idx:{lo}] ll"
    if src == BPF_PSEUDO_MAP_IDX_VALUE:
        return f"{dst} = map[idx:{lo}]+{hi} ll"
    if src == BPF_PSEUDO_BTF_ID:
        return f"{dst} = btf_id:{lo} ll"
    if src == BPF_PSEUDO_FUNC:
        return f"{dst} = func pc{_jump_off(ins.imm)} ll"
    return f"{dst} = {value:#x} ll (unknown pseudo src {src})"


def _disasm_one(i: int, ins: Insn) -> str:
    cls = ins.cls
    if cls in (BPF_ALU, BPF_ALU64):
        return _disasm_alu(ins)
    if cls in (BPF_JMP, BPF_JMP32):
        return _disasm_jmp(i, ins)
    size = ins.size
    mode = ins.mode
    ty = _SIZE_NAMES[size]
    if cls == BPF_LDX:
        if mode == BPF_MEM:
            return f"r{ins.dst} = *({ty} *)({_mem(ins.src, ins.off)})"
        if mode == BPF_MEMSX and size in _SIGNED_SIZE_NAMES:
            sty = _SIGNED_SIZE_NAMES[size]
            return f"r{ins.dst} = *({sty} *)({_mem(ins.src, ins.off)})"
        return _unknown(ins)
    if cls == BPF_ST:
        if mode == BPF_MEM:
            return f"*({ty} *)({_mem(ins.dst, ins.off)}) = {ins.imm}"
        return _unknown(ins)
    if cls == BPF_STX:
        if mode == BPF_MEM:
            return f"*({ty} *)({_mem(ins.dst, ins.off)}) = r{ins.src}"
        if mode == BPF_ATOMIC:
            return _disasm_atomic(ins)
        return _unknown(ins)
    # BPF_LD: legacy packet access (ld_imm64 is handled by the caller).
    if mode == BPF_ABS and size != BPF_DW:
        return f"r0 = *({ty} *)skb[{ins.imm}]"
    if mode == BPF_IND and size != BPF_DW:
        return f"r0 = *({ty} *)skb[r{ins.src} + {ins.imm}]"
    return _unknown(ins)


def disasm_indexed(data: bytes | bytearray | memoryview) -> list[tuple[int, str]]:
    """(slot index, text) per instruction; an ld_imm64 is one line covering two slots.

    Only a length that is not a multiple of 8 raises (ValueError); anything
    else that cannot be decoded is shown as an unknown opcode.
    """
    insns = decode(data)
    lines: list[tuple[int, str]] = []
    for i, ins, second in _ld_imm64_pairs(insns, strict=False):
        if second is not None:
            text = _disasm_ld_imm64(ins, imm64(ins, second))
        elif ins.is_ld_imm64():
            text = f"{_unknown(ins)} (ld_imm64 without its second slot)"
        else:
            text = _disasm_one(i, ins)
        lines.append((i, text))
    return lines


def disasm(data: bytes | bytearray | memoryview) -> list[str]:
    """One line of text per instruction, e.g. "r1 = *(u64 *)(r1 + 16)", "call 14 <...>"."""
    return [text for _, text in disasm_indexed(data)]
