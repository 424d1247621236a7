"""One ELF file -> its FileTable: the CFI section found (.eh_frame, else
.debug_frame, else the separate debug file's .debug_frame), parsed by cfi.py
and compiled into sorted rows with shared rules."""

from __future__ import annotations

import bisect
import os
import struct
from array import array

from gfxbpf.client.profiles.elfinfo import ElfInfo, debug_file, read_info
from gfxbpf.client.profiles.unwind import cfi
from gfxbpf.client.profiles.unwind.table import (
    CFA_PLT,
    CFA_RBP,
    CFA_RSP,
    CFA_SIGNAL,
    CFA_UNSUPPORTED,
    NO_RULE,
    FileTable,
    Rule,
)
from gfxbpf.elf.reader import SHT_NOBITS, ElfError, open_elf

__all__ = ["compile_fdes", "compile_file", "file_facts", "rule_of"]

_KINDS = {cfi.RSP: CFA_RSP, cfi.RBP: CFA_RBP, -1: CFA_PLT, -3: CFA_SIGNAL}


def file_facts(path: str) -> ElfInfo | None:
    """build-id, debuglink and segments (None: unreadable or not ELF)."""
    return read_info(path)


def compile_file(
    path: str, info: ElfInfo, debug_root: str, origin: str | None = None
) -> FileTable | None:
    """The file's table; one with no rows if it has no CFI at all (frame
    pointers are then the only way through it). .eh_frame first; its gaps
    filled from .debug_frame: the file's own, or for a stripped file (no
    .symtab) that of its separate debug file. A program built without unwind
    tables still links the C runtime's few .eh_frame FDEs (_start), and has
    the rest only in .debug_frame when built with -g. origin: the file's own
    path when path is /proc/self/fd/N (its debug file is looked for there)."""
    sources: list[str] = []
    fdes = _parsed(_cfi_section(path, ".eh_frame"), sources, "")
    found = _cfi_section(path, ".debug_frame")
    prefix = ""
    if found is None and not info.has_symtab:
        debug = debug_file(origin or path, info, debug_root)
        found = _cfi_section(debug, ".debug_frame") if debug else None
        prefix = "debug file "
    extra = _parsed(found, sources, prefix)
    return compile_fdes(info.segments, fdes + _gaps_only(fdes, extra), " + ".join(sources))


def _parsed(found: tuple[str, bytes, int] | None, sources: list[str], prefix: str) -> list[cfi.Fde]:
    """The FDEs of a section (a corrupt tail is dropped, the head kept)."""
    if found is None:
        return []
    name, data, addr = found
    fdes, _ = cfi.parse_cfi(data, addr, name == ".eh_frame")
    if fdes:
        sources.append(prefix + name)
    return fdes


def _gaps_only(have: list[cfi.Fde], more: list[cfi.Fde]) -> list[cfi.Fde]:
    """The FDEs of more that overlap none of have (.eh_frame is what runs)."""
    if not have or not more:
        return more
    ranges = sorted((f.start, f.end) for f in have)
    starts = [r[0] for r in ranges]
    out = []
    for f in more:
        i = bisect.bisect_right(starts, f.start) - 1
        before = i >= 0 and ranges[i][1] > f.start  # one starting at or before f runs into it
        after = i + 1 < len(ranges) and ranges[i + 1][0] < f.end  # the next begins inside f
        if not (before or after):
            out.append(f)
    return out


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
    rules = [NO_RULE]
    ids: dict[cfi.State, int] = {}
    # FDEs sharing instructions share their rows: turn each list into rule ids once.
    by_list: dict[int, list[tuple[int, int]]] = {}
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
        rows = by_list.get(id(f.rows))
        if rows is None:
            rows = by_list[id(f.rows)] = [(a, _rule_id(s, ids, rules)) for a, s in f.rows]
        start, size = f.start, f.end - f.start
        for rel, rid in rows:
            if rel >= size:
                break
            if starts and starts[-1] >= start + rel:
                index[-1] = rid  # a later row at the same address
            elif not index or index[-1] != rid:
                starts.append(start + rel)
                index.append(rid)
        covered = f.end
    if starts:
        starts.append(covered)
        index.append(0)
    return _table(segments, starts, index, rules, fdes, source)


def _rule_id(state: cfi.State, ids: dict[cfi.State, int], rules: list[Rule]) -> int:
    rid = ids.get(state)
    if rid is None:
        rid = ids[state] = len(rules)
        rules.append(rule_of(state))
    return rid


def rule_of(state: cfi.State) -> Rule:
    """The Rule a row's state means."""
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
