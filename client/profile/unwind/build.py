"""One ELF file -> its FileTable: the CFI section found (.eh_frame, else
.debug_frame, else the separate debug file's .debug_frame), parsed by cfi.py
and compiled into sorted rows with shared rules."""

from __future__ import annotations

import os
import struct
from array import array

from gfxbpf.bpf.elf import SHT_NOBITS, ElfError, open_elf
from gfxbpf.client.profile.elfinfo import ElfInfo, debug_file, read_info
from gfxbpf.client.profile.unwind import cfi
from gfxbpf.client.profile.unwind.table import (
    CFA_PLT,
    CFA_RBP,
    CFA_RSP,
    CFA_UNSUPPORTED,
    NO_RULE,
    FileTable,
    Rule,
)

__all__ = ["compile_fdes", "compile_file", "file_facts"]

_KINDS = {cfi.RSP: CFA_RSP, cfi.RBP: CFA_RBP, -1: CFA_PLT}


def file_facts(path: str) -> ElfInfo | None:
    """build-id, debuglink and segments (None: unreadable or not ELF)."""
    return read_info(path)


def compile_file(
    path: str, info: ElfInfo, debug_root: str, origin: str | None = None
) -> FileTable | None:
    """The file's table; one with no rows if it has no CFI at all (frame
    pointers are then the only way through it); None if it cannot be read.
    origin: the file's own path when path is /proc/self/fd/N (its separate
    debug file is looked for next to the origin)."""
    found = _cfi_section(path, ".eh_frame") or _cfi_section(path, ".debug_frame")
    source = ""
    if found is None:
        debug = debug_file(origin or path, info, debug_root)
        found = _cfi_section(debug, ".debug_frame") if debug else None
        source = "debug file " if found else ""
    if found is None:
        return compile_fdes(info.segments, [], "")
    name, data, addr = found
    fdes, _ = cfi.parse_cfi(data, addr, name == ".eh_frame")  # a corrupt tail: keep the head
    return compile_fdes(info.segments, fdes, source + name)


def _cfi_section(path: str, name: str) -> tuple[str, bytes, int] | None:
    """(name, contents, address) of a CFI section with contents, or None."""
    try:
        fd, elf = open_elf(path)
    except (OSError, ValueError, struct.error):
        return None
    try:
        sec = elf.section(name)
        if sec is None or sec.type == SHT_NOBITS or sec.size < 8:
            return None
        return name, elf.data(sec), sec.addr
    except (OSError, ElfError):
        return None
    finally:
        os.close(fd)


def compile_fdes(
    segments: tuple[tuple[int, int, int], ...], fdes: list[cfi.Fde], source: str
) -> FileTable:
    """Sorted rows from the FDEs: a gap row (NO_RULE) where no FDE covers the
    addresses, consecutive equal rules merged, an FDE that overlaps the one
    before it winning from its start on."""
    fdes = sorted(fdes, key=lambda f: f.start)
    ids: dict[cfi.State, int] = {}
    rules = [NO_RULE]
    starts: list[int] = []
    index: list[int] = []
    covered = 0  # the end of the last FDE
    for f in fdes:
        while starts and starts[-1] >= f.start:  # overlap: the later FDE wins
            starts.pop()
            index.pop()
        if starts and covered < f.start:
            starts.append(covered)
            index.append(0)
        for loc, state in f.rows:
            if loc >= f.end:
                break
            rid = ids.get(state)
            if rid is None:
                rid = ids[state] = len(rules)
                rules.append(_rule(state))
            if starts and starts[-1] >= loc:
                index[-1] = rid  # a later row at the same address
            elif not index or index[-1] != rid:
                starts.append(loc)
                index.append(rid)
        covered = f.end
    if starts:
        starts.append(covered)
        index.append(0)
    return _table(segments, starts, index, rules, fdes, source)


def _rule(state: cfi.State) -> Rule:
    reg, off, rbp, ra, arg = state
    kind = _KINDS.get(reg, CFA_UNSUPPORTED)
    if kind == CFA_UNSUPPORTED:
        off = 0
    return Rule(kind, off, rbp, ra, arg if kind == CFA_PLT else 0)


def _table(
    segments: tuple[tuple[int, int, int], ...],
    starts: list[int],
    index: list[int],
    rules: list[Rule],
    fdes: list[cfi.Fde],
    source: str,
) -> FileTable:
    wide = "Q" if starts and starts[-1] > 0xFFFF_FFFF else "I"
    fstarts = array(wide, (f.start for f in fdes))
    fends = array(wide, (f.end for f in fdes))
    return FileTable(
        segments=segments,
        starts=array(wide, starts),
        index=array("H" if len(rules) <= 0xFFFF else "I", index),
        rules=rules,
        func_starts=fstarts,
        func_ends=fends,
        source=source,
    )
