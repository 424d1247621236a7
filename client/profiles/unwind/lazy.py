"""A large library's unwind rows, one FDE at a time, for its first profile.

Compiling every FDE of libtorch_cpu (335,000 of them) takes seconds; a
profile meets a few hundred. The linker's .eh_frame_hdr holds a sorted
search table (function start -> FDE offset), so a pc's FDE is one bisect
away and only that FDE is parsed, on first use. The full table is compiled
beside it (tables.py, in a background thread) for the disk cache, so the next
profile loads it instead.
"""

from __future__ import annotations

import bisect
import os
import struct
import sys
from array import array
from dataclasses import dataclass, field

from gfxbpf.client.profiles.unwind import build, cfi
from gfxbpf.client.profiles.unwind.compiled import NO_RULE, Rule, segment_delta, segment_offset
from gfxbpf.elf.reader import SHT_NOBITS, ElfError, open_elf

__all__ = ["LAZY_MAX_BYTES", "LAZY_MIN_BYTES", "LazyTable", "open_lazy"]

# Files with less .eh_frame than this are compiled whole at once (libc: 40 ms).
LAZY_MIN_BYTES = 1 << 20
# The most .eh_frame a file served by its search table may hold: it is read
# into memory whole (PyTorch 2.13's libtorch_cpu.so holds 18 MB, 335,000 FDEs:
# past what build.py compiles whole, so it is only ever served this way).
LAZY_MAX_BYTES = 96 << 20
# version 1; eh_frame_ptr pcrel sdata4; fde_count udata4; table datarel sdata4
_HDR = b"\x01\x1b\x03\x3b"
_Parsed = tuple[int, int, list[int], list[Rule]]  # start, end, row offsets, rules


@dataclass
class LazyTable:
    """The FileTable interface the walker and the symbolizer use, over the
    raw .eh_frame and its search table."""

    segments: tuple[tuple[int, int, int], ...]
    section: cfi.Section
    hdr_addr: int  # the search table's values are relative to this address
    locs: array[int]  # FDE start - hdr_addr, sorted
    offsets: array[int]  # FDE address - hdr_addr
    source: str = ".eh_frame (by .eh_frame_hdr)"
    _parsed: dict[int, _Parsed | None] = field(default_factory=dict)
    _rules: dict[cfi.State, Rule] = field(default_factory=dict)

    @property
    def starts(self) -> array[int]:
        return self.locs  # non-empty: the file has CFI

    def _fde(self, vaddr: int) -> _Parsed | None:
        i = bisect.bisect_right(self.locs, vaddr - self.hdr_addr) - 1
        if i < 0:
            return None
        if i not in self._parsed:
            self._parsed[i] = self._parse(i)
        got = self._parsed[i]
        return got if got is not None and got[0] <= vaddr < got[1] else None

    def _parse(self, i: int) -> _Parsed | None:
        try:
            fde = self.section.fde_at(self.offsets[i] + self.hdr_addr - self.section.addr)
        except (cfi.CfiError, IndexError, ValueError, struct.error):
            return None
        if fde is None:
            return None
        rels: list[int] = []
        rules: list[Rule] = []
        for rel, state in fde.rows:
            if rel >= fde.end - fde.start:
                break
            rule = self._rules.get(state) or self._rules.setdefault(state, build.rule_of(state))
            if rels and rels[-1] == rel:
                rules[-1] = rule  # a later row at the same address
            else:
                rels.append(rel)
                rules.append(rule)
        return fde.start, fde.end, rels, rules

    def rule(self, vaddr: int) -> Rule:
        f = self._fde(vaddr)
        if f is None:
            return NO_RULE
        j = bisect.bisect_right(f[2], vaddr - f[0]) - 1
        return f[3][j] if j >= 0 else NO_RULE

    def function(self, vaddr: int) -> tuple[int, int] | None:
        f = self._fde(vaddr)
        return (f[0], f[1]) if f is not None else None

    def vaddr_delta(self, file_start: int, file_end: int | None = None) -> int | None:
        return segment_delta(self.segments, file_start, file_end)

    def file_offset(self, vaddr: int) -> int | None:
        return segment_offset(self.segments, vaddr)

    def whole(self) -> bool:
        """Small enough for build.py to compile whole (and cache on disk)."""
        return len(self.section.data) <= build.MAX_CFI_BYTES and len(self.locs) <= build.MAX_FDES

    def nbytes(self) -> int:
        return len(self.section.data) + 8 * len(self.locs) + 100 * len(self._parsed)


def open_lazy(
    path: str, segments: tuple[tuple[int, int, int], ...], max_bytes: int | None = None
) -> LazyTable | None:
    """A LazyTable if the file has an .eh_frame of LAZY_MIN_BYTES to max_bytes
    (build.MAX_CFI_BYTES by default) and a search table in the usual
    encoding; else None (compile it whole)."""
    max_bytes = build.MAX_CFI_BYTES if max_bytes is None else max_bytes
    try:
        fd, elf = open_elf(path)
    except (OSError, ValueError, struct.error):
        return None
    try:
        eh, hdr = elf.section(".eh_frame"), elf.section(".eh_frame_hdr")
        if eh is None or hdr is None or SHT_NOBITS in (eh.type, hdr.type):
            return None
        if not LAZY_MIN_BYTES <= eh.size <= max_bytes or not 12 <= hdr.size <= eh.size:
            return None  # a larger one is refused whole (build.BadTable)
        head = elf.read(hdr.offset, hdr.size, ".eh_frame_hdr")
        if head[:4] != _HDR:
            return None
        (count,) = struct.unpack_from("<I", head, 8)
        if 12 + 8 * count > len(head):
            return None
        table = array("i", head[12 : 12 + 8 * count])
        if sys.byteorder != "little":
            table.byteswap()
        section = cfi.Section(elf.data(eh), eh.addr, True)
        return LazyTable(segments, section, hdr.addr, table[0::2], table[1::2])
    except (OSError, ElfError):
        return None
    finally:
        os.close(fd)
