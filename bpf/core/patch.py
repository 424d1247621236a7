"""Write a resolved CO-RE relocation into its instruction, as libbpf 1.1 does.

Four forms are relocatable: an ALU/ALU64 op with an immediate (`rX = imm`,
`rX += imm`), a load or store whose offset is the field's (LDX/ST/STX, whose
size may follow the field's), and ld_imm64. A poisoned relocation turns the
instruction (both slots of an ld_imm64) into `call 0xbad2310`, a helper that
does not exist: the verifier removes it in dead code and names it otherwise.
"""

from __future__ import annotations

from gfxbpf.bpf.asm import SLOT
from gfxbpf.bpf.core.relo import CoreError
from gfxbpf.bpf.core.resolve import Resolution

INSN_SIZE = 8
POISON_IMM = 0xBAD2310  # "bad relo"; the verifier says "invalid func unknown#195896080"
CALL = 0x85  # BPF_JMP | BPF_CALL
LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW

CLASS_LD, CLASS_LDX, CLASS_ST, CLASS_STX, CLASS_ALU, CLASS_ALU64 = 0, 1, 2, 3, 4, 7
SRC_X = 0x08
_SIZE_BYTES = {0x18: 8, 0x00: 4, 0x08: 2, 0x10: 1}  # BPF_DW, BPF_W, BPF_H, BPF_B
_BYTES_SIZE = {v: k for k, v in _SIZE_BYTES.items()}
SHRT_MAX = 0x7FFF
_U64 = 0xFFFFFFFFFFFFFFFF


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - ((v >> 31) << 32)


def poison(insns: bytearray, idx: int) -> None:
    """Make insn idx (and the second slot of an ld_imm64) a call of helper 0xbad2310."""
    code = insns[idx * INSN_SIZE]
    if code == LD_IMM64 and (idx + 1) * INSN_SIZE < len(insns):
        SLOT.pack_into(insns, (idx + 1) * INSN_SIZE, CALL, 0, 0, POISON_IMM)
    SLOT.pack_into(insns, idx * INSN_SIZE, CALL, 0, 0, POISON_IMM)


def patch(insns: bytearray, idx: int, res: Resolution) -> str:
    """Apply `res` to instruction idx of `insns`; returns what changed, for logs.

    CoreError when the instruction does not hold what the relocation says it
    should (libbpf refuses such an object).
    """
    if not 0 <= idx < len(insns) // INSN_SIZE:
        raise CoreError(f"relocation on instruction {idx}, past the program's end")
    if res.poison:
        poison(insns, idx)
        return "poisoned"
    at = idx * INSN_SIZE
    code, regs, off, imm = SLOT.unpack_from(insns, at)
    cls = code & 0x07
    if cls in (CLASS_ALU, CLASS_ALU64):
        if code & SRC_X:
            raise CoreError(f"insn {idx}: relocated ALU instruction takes a register, not an imm")
        _expect(idx, "imm", imm, res)
        SLOT.pack_into(insns, at, code, regs, off, _s32(res.new_val))
        return f"imm {imm} -> {_s32(res.new_val)}"
    if cls in (CLASS_LDX, CLASS_ST, CLASS_STX):
        return _patch_mem(insns, idx, res)
    if cls == CLASS_LD:
        return _patch_ldimm64(insns, idx, res)
    raise CoreError(f"insn {idx}: opcode {code:#04x} cannot carry a CO-RE relocation")


def _expect(idx: int, what: str, have: int, res: Resolution) -> None:
    if res.validate and (have & _U64) != res.orig_val:
        raise CoreError(
            f"insn {idx}: {what} is {have}, but the relocation expects {res.orig_val} "
            "(object and its .BTF.ext disagree)"
        )


def _patch_mem(insns: bytearray, idx: int, res: Resolution) -> str:
    at = idx * INSN_SIZE
    code, regs, off, imm = SLOT.unpack_from(insns, at)
    _expect(idx, "offset", off, res)
    if res.new_val > SHRT_MAX:
        raise CoreError(f"insn {idx}: field offset {res.new_val} does not fit a load offset")
    if res.fail_memsz_adjust:
        # The target field has another size and is neither a pointer nor
        # unsigned: the read would be wrong, so the instruction is poisoned.
        poison(insns, idx)
        res.poison = True
        res.why = (
            f"the field is {res.new_sz} bytes in the target, {res.orig_sz} here, "
            "and only pointers and unsigned integers may change size"
        )
        return "poisoned"
    new_code = code
    if res.new_sz != res.orig_sz:
        size = _SIZE_BYTES.get(code & 0x18)
        if size != res.orig_sz:
            raise CoreError(f"insn {idx}: loads {size} bytes, the field is {res.orig_sz}")
        if res.new_sz not in _BYTES_SIZE:
            raise CoreError(f"insn {idx}: the target field's size {res.new_sz} is not loadable")
        new_code = (code & 0xE0) | _BYTES_SIZE[res.new_sz] | (code & 0x07)
    SLOT.pack_into(insns, at, new_code, regs, res.new_val, imm)
    return f"off {off} -> {res.new_val}" + (
        f", size {res.orig_sz} -> {res.new_sz}" if new_code != code else ""
    )


def _patch_ldimm64(insns: bytearray, idx: int, res: Resolution) -> str:
    at = idx * INSN_SIZE
    code, regs, off, imm = SLOT.unpack_from(insns, at)
    if at + 2 * INSN_SIZE > len(insns):
        raise CoreError(f"insn {idx}: ld_imm64 without its second slot")
    c2, r2, o2, imm2 = SLOT.unpack_from(insns, at + INSN_SIZE)
    if code != LD_IMM64 or regs >> 4 or off or c2 or r2 or o2:
        raise CoreError(f"insn {idx}: relocated ld_imm64 has an unexpected form")
    value = (imm & 0xFFFFFFFF) | ((imm2 & 0xFFFFFFFF) << 32)
    _expect(idx, "imm64", value, res)
    SLOT.pack_into(insns, at, code, regs, off, _s32(res.new_val))
    SLOT.pack_into(insns, at + INSN_SIZE, c2, r2, o2, _s32(res.new_val >> 32))
    return f"imm64 {value} -> {res.new_val}"
