"""One ELF file -> its FileTable: the CFI section found (.eh_frame, else
.debug_frame, else the separate debug file's .debug_frame), parsed by cfi.py
and compiled into sorted rows with shared rules.

The file may be another user's, built to hurt (issue 35): such a file's
table (one compiled with a Budget) larger than MAX_CFI_BYTES, or than what is
left of the Budget, or with more than MAX_FDES entries, is refused as a whole
(BadTable), and so is any file's with an FDE reaching past what the file
loads. The caller's own files and root's are not capped: libtorch_cpu.so's
.eh_frame is 18 MB with about 335,000 FDEs, and refusing it cut every
PyTorch stack in a real GPU host's profile, and the unwinder stops in that file with a
marker frame; a separate debug file is read through the descriptor that was
checked (elfinfo.open_debug_file), never reopened by path."""

from __future__ import annotations

import bisect
import os
import struct
from array import array

from gfxbpf.client.profiles.elfinfo import ElfInfo, open_debug_file, read_info
from gfxbpf.client.profiles.fileid import open_regular_path
from gfxbpf.client.profiles.unwind import cfi
from gfxbpf.client.profiles.unwind.compiled import (
    CFA_PLT,
    CFA_RBP,
    CFA_RBP_DEREF,
    CFA_RSP,
    CFA_SIGNAL,
    CFA_UNSUPPORTED,
    NO_RULE,
    FileTable,
    Rule,
)
from gfxbpf.elf.reader import SHT_NOBITS, ElfError, open_elf

__all__ = [
    "MAX_CFI_BYTES",
    "MAX_FDES",
    "BadTable",
    "Budget",
    "compile_fdes",
    "compile_file",
    "file_facts",
    "rule_of",
]

_KINDS = {cfi.RSP: CFA_RSP, cfi.RBP: CFA_RBP, -1: CFA_PLT, -3: CFA_SIGNAL, -4: CFA_RBP_DEREF}
# libLLVM's .eh_frame is 5 MB with 98,000 FDEs (3.6 s, 200 MB to compile):
# three times that is more than any real file needs.
MAX_CFI_BYTES = 16 << 20
MAX_FDES = 300_000
_U64_MAX = (1 << 64) - 1


class BadTable(Exception):
    """The file's call-frame information is refused as a whole (the message says why)."""


class Budget:
    """Bytes of call-frame information one caller may still parse, across files."""

    def __init__(self, left: int) -> None:
        self.left = left

    def take(self, n: int, what: str) -> None:
        if n > self.left:
            raise BadTable(f"{what} holds {n} bytes, more than the {self.left} left to parse")
        self.left -= n


def file_facts(path: str) -> ElfInfo | None:
    """build-id, debuglink and segments (None: unreadable or not ELF)."""
    return read_info(path)


def compile_file(
    path: str,
    info: ElfInfo,
    debug_root: str,
    origin: str | None = None,
    budget: Budget | None = None,
) -> FileTable | None:
    """The file's table; one with no rows if it has no CFI at all (frame
    pointers are then the only way through it). .eh_frame first; its gaps
    filled from .debug_frame: the file's own, or for a stripped file (no
    .symtab) that of its separate debug file. A program built without unwind
    tables still links the C runtime's few .eh_frame FDEs (_start), and has
    the rest only in .debug_frame when built with -g. origin: the file's own
    path when path is /proc/self/fd/N (its debug file is looked for there).
    Raises BadTable for a table refused as a whole (budget: what the caller
    may still parse; each section's bytes are taken from it)."""
    sources: list[str] = []
    cap = MAX_FDES if budget is not None else None
    fdes = _parsed(_cfi_section(path, ".eh_frame", budget), sources, "", cap)
    found = _cfi_section(path, ".debug_frame", budget)
    prefix = ""
    if found is None and not info.has_symtab:
        debug = open_debug_file(origin or path, info, debug_root)
        if debug is not None:
            try:
                found = _cfi_section(open_regular_path(debug.fd), ".debug_frame", budget)
            finally:
                os.close(debug.fd)
        prefix = "debug file "
    extra = _parsed(found, sources, prefix, cap)
    fdes = _in_range(fdes + _gaps_only(fdes, extra), info.segments, cap)
    return compile_fdes(info.segments, fdes, " + ".join(sources))


def _in_range(
    fdes: list[cfi.Fde], segments: tuple[tuple[int, int, int], ...], cap: int | None
) -> list[cfi.Fde]:
    """The FDEs that start in what the file loads (others are of discarded
    code: a linker's tombstones). One that starts there and runs past it (a
    4 GiB range in a small file) makes the whole table a lie: BadTable, as
    more than cap FDEs do."""
    if cap is not None and len(fdes) > cap:
        raise BadTable(f"{len(fdes)} FDEs, more than {cap}")
    top = max((vaddr + filesz for _, vaddr, filesz in segments), default=_U64_MAX)
    kept = [f for f in fdes if f.start < top]
    for f in kept:
        if f.end > top:
            raise BadTable(
                f"an FDE covers {f.start:#x}-{f.end:#x}, past the end of the file's code"
            )
    return kept


def _parsed(
    found: tuple[str, bytes, int] | None, sources: list[str], prefix: str, cap: int | None
) -> list[cfi.Fde]:
    """The FDEs of a section (a corrupt tail is dropped, the head kept);
    BadTable past cap FDEs."""
    if found is None:
        return []
    name, data, addr = found
    try:
        fdes, _ = cfi.parse_cfi(data, addr, name == ".eh_frame", cap or 1 << 62)
    except cfi.CfiTooLarge as e:
        raise BadTable(f"{name}: {e}") from None
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


def _cfi_section(
    path: str, name: str, budget: Budget | None = None
) -> tuple[str, bytes, int] | None:
    """(name, contents, address) of a CFI section with contents, or None.
    With a budget (another user's file), raises BadTable for one larger than
    MAX_CFI_BYTES or than what the budget has left."""
    try:
        fd, elf = open_elf(path)
    except (OSError, ValueError, struct.error):
        return None
    try:
        sec = elf.section(name)
        if sec is None or sec.type == SHT_NOBITS or sec.size < 8:
            return None
        if budget is not None:  # another user's file: capped
            if sec.size > MAX_CFI_BYTES:
                raise BadTable(f"{name} holds {sec.size} bytes, more than {MAX_CFI_BYTES}")
            budget.take(sec.size, name)
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
    top = max(starts[-1] if starts else 0, max((f.end for f in fdes), default=0))
    wide = "Q" if top > 0xFFFF_FFFF else "I"
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
