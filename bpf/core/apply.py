"""Apply CO-RE relocations: the local BTF, the .BTF.ext records and the
programs' instructions in; patched instructions per program out. No object
and no kernel: bpf/corerelo.py hands an ObjectSpec's parts in, and
bpf/kernel/vmlinux.py reads the running kernel's BTF into a Target.

libbpf's order, which matters because candidates are pruned as they go:
records in .BTF.ext order, section by section; a record whose instruction
lies in no function (an eliminated weak subprogram) is skipped, and so is one
in a program that is not autoloaded (`?` sections). Candidates are searched
once per local type id and then narrowed to the ones that matched.
Subprograms are patched in place before linking, so each program that
appends one gets the same patched code.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gfxbpf.bpf.btf.ext import CoreRelo
from gfxbpf.bpf.btf.kinds import BtfError
from gfxbpf.bpf.btf.table import TypeTable
from gfxbpf.bpf.core.patch import patch
from gfxbpf.bpf.core.relo import CoreError, CoreKind, Spec, kind_name, parse_spec
from gfxbpf.bpf.core.resolve import Candidate, Resolution, resolve
from gfxbpf.bpf.core.target import Target

INSN_SIZE = 8

# A section's CO-RE records, as .BTF.ext lists them (BtfExt.core_relos).
Relos = Mapping[str, Sequence[CoreRelo]]


class Code(Protocol):
    """A program or subprogram: its instructions and where they sit in their section."""

    @property
    def name(self) -> str: ...
    @property
    def section(self) -> str: ...
    @property
    def insns(self) -> bytes: ...
    @property
    def insn_offset(self) -> int: ...
    @property
    def insn_count(self) -> int: ...
    @property
    def autoload(self) -> bool: ...
    @property
    def is_subprog(self) -> bool: ...


@dataclass
class CoreRecord:
    """One relocation as applied (or the reason it could not be)."""

    program: str
    section: str
    insn: int  # instruction index within the program
    kind: int
    type_id: int  # local type id
    access: str
    local: str  # the local access, C-like
    result: Resolution | None = None
    change: str = ""
    error: str | None = None

    @property
    def kind_name(self) -> str:
        return kind_name(self.kind)


@dataclass
class CoreResult:
    insns: dict[str, bytearray] = field(default_factory=dict)  # patched code by program
    records: list[CoreRecord] = field(default_factory=list)


def has_core_relos(
    core_relos: Relos, programs: Sequence[Code], only: Collection[str] | None = None
) -> bool:
    """Whether the programs (those in only, and any subprogram) have CO-RE relocations."""
    if only is None:
        return any(core_relos.values())
    for sec, relos in core_relos.items():
        progs = [p for p in programs if p.section == sec]
        for r in relos:
            prog = _program_at(progs, r.insn_off // INSN_SIZE)
            if prog is not None and (prog.is_subprog or prog.name in only):
                return True
    return False


def relocate(
    btf: TypeTable,
    core_relos: Relos,
    programs: Sequence[Code],
    target: Target,
    strict: bool = True,
    also: Collection[str] = (),
    only: Collection[str] | None = None,
) -> CoreResult:
    """Resolve and patch every CO-RE relocation of `programs` against `target`.

    btf: the local BTF the records name types and strings in.

    strict: raise CoreError at the first relocation that fails (loading);
    otherwise record the error and go on (inspection). also: programs to
    relocate even though they are not autoloaded (a caller that names a
    `?` program loads it, as libbpf does after bpf_program__set_autoload).
    only: relocate just these programs (a loader that loads a subset).
    """
    out = CoreResult()
    cache: dict[int, list[Candidate]] = {}
    for sec, relos in core_relos.items():
        progs = [p for p in programs if p.section == sec]
        for n, r in enumerate(relos):
            if r.insn_off % INSN_SIZE:
                raise CoreError(f"section {sec!r}: CO-RE record #{n} is not on an instruction")
            prog = _program_at(progs, r.insn_off // INSN_SIZE)
            if prog is None or not (prog.autoload or prog.name in also):
                continue
            if only is not None and not prog.is_subprog and prog.name not in only:
                continue  # subprograms: whoever calls them is linked with them
            idx = r.insn_off // INSN_SIZE - prog.insn_offset
            access = _string(btf, r.access_str_off)
            rec = CoreRecord(prog.name, sec, idx, r.kind, r.type_id, access, access)
            out.records.append(rec)
            insns = out.insns.setdefault(prog.name, bytearray(prog.insns))
            try:
                local = parse_spec(btf, r.type_id, access, r.kind)
                rec.local = local.describe()
                rec.result = _resolve(local, target, cache)
                rec.change = patch(insns, idx, rec.result)
            except (CoreError, BtfError) as e:  # BtfError: a corrupt local type chain
                rec.error = str(e)
                if strict:
                    raise CoreError(
                        f"program {prog.name!r}: CO-RE relocation #{n} of section {sec!r} "
                        f"({rec.kind_name} of {rec.local}, access {access!r}) at insn {idx}: {e}"
                    ) from None
    return out


def _program_at(progs: list[Code], insn: int) -> Code | None:
    for p in progs:
        if p.insn_offset <= insn < p.insn_offset + p.insn_count:
            return p
    return None


def _string(btf: TypeTable, off: int) -> str:
    try:
        return btf.string_at(off)
    except ValueError as e:
        raise CoreError(f"access string at offset {off}: {e}") from None


def _resolve(local: Spec, target: Target, cache: dict[int, list[Candidate]]) -> Resolution:
    if local.kind == CoreKind.TYPE_ID_LOCAL:
        return resolve(local, [])[0]
    t = local.btf.types[local.root_type_id]
    if not t.name:
        raise CoreError(f"{kind_name(local.kind)} relocation on an anonymous type")
    cands = cache.get(local.root_type_id)
    if cands is None:
        cands = target.candidates(t)
    res, kept = resolve(local, cands)
    cache[local.root_type_id] = kept
    return res
