"""Linking one program of an object as libbpf does: the subprograms it calls
(and callbacks it names) appended, calls resolved, its func and line info
gathered (ObjectSpec.link_program)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gfxbpf.bpf import consts as C
from gfxbpf.bpf.asm import CODE_CALL, CODE_LD_IMM64, SLOT
from gfxbpf.bpf.btf.ext import BtfExt
from gfxbpf.bpf.specs import ObjectError, ProgramSpec, Relocation

MAX_INSNS = 1_000_000  # the kernel's own limit for a privileged program


class Linker:
    """One program's instructions being linked: subprograms appended, calls resolved."""

    def __init__(
        self,
        programs: Iterable[ProgramSpec],
        btf_ext: BtfExt | None,
        main: ProgramSpec,
        patched: Mapping[str, bytes | bytearray],
    ) -> None:
        self.name = main.name
        self.btf_ext = btf_ext
        self.subprogs = {p.insn_offset: p for p in programs if p.is_subprog}
        self.patched = patched
        self.insns = bytearray(patched.get(main.name, main.insns))
        self.placed: dict[str, int] = {}  # subprogram name -> start index in `insns`
        self.order: list[str] = []
        self.map_refs: list[tuple[int, str, str, int]] = []
        self.func_info: list[tuple[int, int]] = []
        self.line_info: list[tuple[int, int, int, int]] = []

    def place(self, prog: ProgramSpec, start: int) -> None:
        """Resolve the instructions of prog, which sit at `start` in the linked stream."""
        # Depth first, like libbpf: a subprogram is appended the first time
        # a call into it is seen, and processed before the caller goes on.
        self.ext_info(prog, start)
        relos = {r.insn_index: r for r in prog.relocations}
        for i in range(prog.insn_count):
            at = (start + i) * C.INSN_SIZE
            code, regs, off, imm = SLOT.unpack_from(self.insns, at)
            r = relos.get(i)
            if r is not None and r.kind in ("map", "data"):
                assert r.map_name is not None
                self.map_refs.append((start + i, r.map_name, r.kind, r.offset))
                continue
            if r is not None and r.kind in ("ksym", "kfunc"):
                # Resolved by the loader against the running kernel (externs/decls.py).
                self.map_refs.append((start + i, r.symbol, r.kind, 0))
                continue
            if r is not None and r.kind == "func":
                self.place_callback(prog, start + i, at, r, regs, imm)
                continue
            if code != CODE_CALL or regs >> 4 != C.BPF_PSEUDO_CALL:
                continue
            target = self.call_target(prog, i, imm, r)
            SLOT.pack_into(self.insns, at, code, regs, off, self.reach(target, start + i))

    def place_callback(
        self, prog: ProgramSpec, pos: int, at: int, r: Relocation, regs: int, imm: int
    ) -> None:
        """An ld_imm64 of a subprogram's address: BPF_PSEUDO_FUNC, imm relative
        to the next instruction, as for a call (the verifier's convention)."""
        if (r.offset + imm) % C.INSN_SIZE:
            raise ObjectError(f"program {prog.name!r}: misaligned callback at insn {pos}")
        target = self.subprog_at(prog, (r.offset + imm) // C.INSN_SIZE, f"callback at insn {pos}")
        regs = (regs & 0x0F) | (C.BPF_PSEUDO_FUNC << 4)
        SLOT.pack_into(self.insns, at, CODE_LD_IMM64, regs, 0, self.reach(target, pos))

    def call_target(self, prog: ProgramSpec, i: int, imm: int, r: Relocation | None) -> ProgramSpec:
        """The subprogram that the call at insn i of prog enters."""
        if r is not None:
            target_idx = r.offset // C.INSN_SIZE + imm + 1
        elif prog.is_subprog:
            target_idx = prog.insn_offset + i + imm + 1
        else:
            raise ObjectError(f"program {prog.name!r}: call at insn {i} has no relocation")
        return self.subprog_at(prog, target_idx, f"call at insn {i}")

    def subprog_at(self, prog: ProgramSpec, target_idx: int, what: str) -> ProgramSpec:
        """The subprogram starting at .text insn target_idx, which `what` of prog names."""
        target = self.subprogs.get(target_idx)
        if target is None:
            raise ObjectError(
                f"program {prog.name!r}: {what} into .text insn {target_idx}, "
                "which starts no function"
            )
        return target

    def reach(self, target: ProgramSpec, pos: int) -> int:
        """The imm with which the insn at pos of the linked stream reaches
        target (relative to the next insn; target appended on first use)."""
        if target.name not in self.placed:
            self.append(target)
        return self.placed[target.name] - pos - 1

    def append(self, sub: ProgramSpec) -> None:
        """Append a subprogram at the end of the stream and link it in turn."""
        self.placed[sub.name] = len(self.insns) // C.INSN_SIZE
        self.order.append(sub.name)
        self.insns.extend(self.patched.get(sub.name, sub.insns))
        if len(self.insns) // C.INSN_SIZE > MAX_INSNS:
            raise ObjectError(f"program {self.name!r} is too large once linked")
        self.place(sub, self.placed[sub.name])

    def ext_info(self, prog: ProgramSpec, start: int) -> None:
        """Carry prog's func_info and line_info records over to their linked positions."""
        if self.btf_ext is None:
            return
        lo = prog.insn_offset * C.INSN_SIZE
        hi = lo + len(prog.insns)
        sec = prog.section
        for off, tid in self.btf_ext.func_info.get(sec, ()):
            if lo <= off < hi:
                self.func_info.append((start + (off - lo) // C.INSN_SIZE, tid))
        for off, f, ln, col in self.btf_ext.line_info.get(sec, ()):
            if lo <= off < hi:
                self.line_info.append((start + (off - lo) // C.INSN_SIZE, f, ln, col))
